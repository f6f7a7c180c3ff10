"""Time the full layout search (issue 2: well under 5 s on one core for 405B on 2048 H100s).

Run: ``python benchmarks/bench_search.py``. Prints, per scenario, the layouts enumerated, the
wall-clock time of the first ``autopar.search.search`` in the process (``first``: it also builds
the cached pipeline-schedule graphs, as a CLI run does) and the best of 5 (enumeration, rules,
vectorised costing of every valid layout, re-balancing and per-stage re-costing of the top 10),
for ``--target megatron`` and ``sapp`` (per-stage recompute through the integer program). Pin to
one core with ``taskset -c 0`` to reproduce the single-core figure.
"""

from __future__ import annotations

import time

from autopar.problem import Problem
from autopar.search import search
from autopar.specs import TrainSpec, load_device, load_model, make_cluster

SCENARIOS = [
    ("llama3-70b", "h100-80gb", 8, 1024, 8192),
    ("llama3.1-405b", "h100-80gb", 256, 2048, 8192),
    ("gpt3-175b", "a100-80gb", 128, 1536, 2048),
]


def main() -> None:
    for model, device, nodes, gbs, seq in SCENARIOS:
        p = Problem(load_model(model), make_cluster(load_device(device), nodes, 8),
                    TrainSpec(global_batch_size=gbs, seq_len=seq))
        for target in ("megatron", "sapp"):
            times, result = [], None
            for _ in range(5):
                start = time.perf_counter()
                result = search(p, top_k=10, target=target)
                times.append(time.perf_counter() - start)
            print(f"{model:15s} {nodes * 8:5d} x {device:10s} {target:8s} {result.enumerated:8,d} layouts  first "
                  f"{times[0]:6.3f} s, best {min(times):6.3f} s  best: step {result.layouts[0].step_time_s:.2f} s, "
                  f"MFU {result.layouts[0].mfu:.1%}")


if __name__ == "__main__":
    main()
