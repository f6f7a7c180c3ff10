"""Time the MoE layout searches of issue 4 (each must return ranked plans in under 5 s).

Run: ``python benchmarks/bench_moe_search.py``. For DeepSeek-V3 on 256 x 8 H100 (gbs 4096,
seq 4096) and Qwen3-30B-A3B on 1 x 8 H100 (gbs 64, seq 4096) it prints the layouts enumerated,
the best of 3 wall-clock times of ``autopar.search.search`` (enumeration, rules, vectorised
costing, per-stage re-costing of the top 10) and the best plan. Not a test: timings depend on
the machine and its load.
"""

from __future__ import annotations

import time
from pathlib import Path

from autopar.problem import Problem
from autopar.search import search
from autopar.specs import TrainSpec, load_device, load_model, make_cluster

MODELS = Path(__file__).resolve().parents[1] / "src" / "autopar" / "data" / "models"
SCENARIOS = [
    ("deepseek-v3", 256, 4096, 4096),
    ("qwen3-30b-a3b", 1, 64, 4096),
]


def main() -> None:
    for name, nodes, gbs, seq in SCENARIOS:
        path = MODELS / f"{name}.json"
        model = load_model(str(path) if path.exists() else name)
        p = Problem(model, make_cluster(load_device("h100-80gb"), nodes, 8),
                    TrainSpec(global_batch_size=gbs, seq_len=seq))
        best, result = float("inf"), None
        for _ in range(3):
            start = time.perf_counter()
            result = search(p, top_k=10)
            best = min(best, time.perf_counter() - start)
        top = result.layouts[0]
        s = top.strategy
        print(f"{name:14s} {nodes * 8:5d} x h100  {result.enumerated:9,d} layouts  {best:6.3f} s  "
              f"best: tp{s.tp} pp{s.pp} cp{s.cp} dp{s.dp} ep{s.ep} etp{s.expert_tp} mbs{s.mbs} zero{s.zero} "
              f"{s.recompute}: step {top.step_time_s:.2f} s, MFU {top.mfu:.1%}, "
              f"{top.peak_memory_bytes / 2**30:.1f} GiB, fits={top.fits}")


if __name__ == "__main__":
    main()
