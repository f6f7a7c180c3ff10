"""Time ``search`` with and without ``--profile-db`` (issue 7: lookups cached per distinct shape).

Run: ``python benchmarks/bench_profile_db.py``. Builds a profile database (synthetic times, no
torch) holding every operator of the top-10 layouts of llama3-70b on 64 H100s (gbs 1024, seq
8192), the decoder layer of the best one and collective fits for both link classes, then prints
the best of 5 wall-clock times of ``autopar.search.search`` without and with it installed (the
``profiled`` context of the CLI: operator, layer and collective hooks).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


from autopar.problem import Problem
from autopar.cli.profile import profiled
from autopar.profile.opdb import OpDB
from autopar.profile.provenance import MeasuredOn
from autopar.profile.shapes import layer_dims, strategy_ops, unique
from autopar.search import search
from autopar.specs import TrainSpec, load_device, load_model, make_cluster


def best_of(runs: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(runs):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    p = Problem(load_model("llama3-70b"), make_cluster(load_device("h100-80gb"), 8, 8),
                TrainSpec(global_batch_size=1024, seq_len=8192))
    plain_s, result = best_of(5, lambda: search(p, top_k=10))
    path = Path(tempfile.mkdtemp()) / "bench.db"
    db = OpDB(path)
    db.put_measured_on(MeasuredOn("H100", "torch=bench", "NVIDIA H100 80GB HBM3", "h100-80gb", "h100-80gb", None, None,
                                  None, None, "synthetic (benchmark)"))
    ops = unique([op for e in result.layouts for op in strategy_ops(p, e.strategy)])
    for op, dims in ops:
        db.put("H100", op, dims, "bf16", "torch=bench", (1e-3, 0.0), (2e-3, 0.0), 1.0, 1)
    s = result.layouts[0].strategy
    dims = layer_dims(p.model, s.tp, s.cp, s.ep, s.expert_tp, s.mbs, 8192, False, "none", False)
    db.put("H100", "layer", dims, "bf16", "torch=bench", (30e-3, 0.0), (60e-3, 0.0), 0.0, 1)
    for link, bw in (("intra", 360e9), ("inter", 8 * 45e9)):
        for collective in ("all_reduce", "all_gather", "send_recv"):
            db.put_comm_fit("H100", collective, link, 10e-6, bw, 9, 8, "torch=bench")
    db.close()
    with profiled(p, str(path), None) as coverage:
        db_s, measured = best_of(5, lambda: search(p, top_k=10))
        doc = coverage([e.strategy for e in measured.layouts])
    print(f"llama3-70b 64 x H100: {result.enumerated:,d} layouts, {len(ops)} operator shapes in the DB; search "
          f"{plain_s:.3f} s without --profile-db, {db_s:.3f} s with it (coverage of the top layout "
          f"{doc['coverage'][0]:.0%})")


if __name__ == "__main__":
    main()
