"""Time the stage balancer for Llama-3.1-405B (126 layers) on pp=16 (target: under 1 s).

Run: ``python benchmarks/bench_balance.py``. The layer table (read off the cost model) is built
once; the timed part is :func:`autopar.pipeline.balance.balance` (split + per-stage recompute
choice, simulation of the balanced and the even split), best of three runs.
"""

from __future__ import annotations

import time

from autopar.pipeline.balance import balance
from autopar.pipeline.layers import layer_table
from autopar.problem import Problem
from autopar.specs import TrainSpec, load_device, load_model, make_cluster
from autopar.strategy import Strategy


def main() -> float:
    """Print and return the best balancer wall time in seconds."""
    p = Problem(load_model("llama3.1-405b"), make_cluster(load_device("h100-80gb"), 256, 8),
                TrainSpec(global_batch_size=2048, seq_len=8192))
    s = Strategy(dp=16, tp=8, pp=16, zero=1, sp=True, recompute="selective")
    m = s.num_microbatches(p.train.global_batch_size)
    table = layer_table(p, s)
    times, plan = [], None
    for _ in range(3):
        start = time.perf_counter()
        plan = balance(table, s.vpp, m, s.schedule, baseline="selective")
        times.append(time.perf_counter() - start)
    best = min(times)
    print(f"405B pp16 ({table.num_layers} layers, m={m}): balance {best:.3f} s (runs: "
          f"{', '.join(f'{t:.3f}' for t in times)}), solver {plan.solver}, optimal {plan.optimal}")
    print(f"split {list(plan.best.layers_per_stage)}, recompute {sorted(set(plan.best.recompute))}, "
          f"gain {plan.gain if plan.gain is None else f'{plan.gain:+.1%}'}")
    print("OK" if best < 1.0 else "SLOW: over 1 s")
    return best


if __name__ == "__main__":
    main()
