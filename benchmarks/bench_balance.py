"""Time the stage balancer for Llama-3.1-405B (126 layers) on pp=16 (target: under 1 s), and the
bounded cases of issue 13: 405B on pp 63 and a 1,024-layer table on pp 32, both with 100,000
micro-batches (357 s / 9.2 GB and 206 s / 5.2 GB before the steady-state extrapolation; target:
under ~10 s and 1 GB each, see ``autopar.pipeline.steady``).

Run: ``python benchmarks/bench_balance.py``. The layer table (read off the cost model) is built
once; the timed part is :func:`autopar.pipeline.balance.balance` (split + per-stage recompute
choice, simulation of the balanced and the even split), best of three runs (one for the large
cases), with the process's peak resident memory so far.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from autopar.pipeline.balance import balance
from autopar.pipeline.layers import LayerTable, layer_table
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


def large_cases() -> None:
    """Balance the two 100,000-micro-batch cases once each: wall time and peak resident memory."""
    p = Problem(load_model("llama3.1-405b"), make_cluster(load_device("h100-80gb"), 63, 8),
                TrainSpec(global_batch_size=100_000, seq_len=8192))
    s = Strategy(dp=1, tp=8, pp=63, zero=1, sp=True, recompute="selective")
    layers, zeros = 1024, np.zeros((32, 3))
    per_layer = lambda x: np.tile(x, (layers, 1))  # noqa: E731
    deep = LayerTable(options=("none", "selective", "full"), forward_s=per_layer([0.01] * 3),
                      backward_s=per_layer([0.02] * 3), recompute_s=per_layer([0.0, 0.002, 0.01]),
                      activation_bytes=per_layer([2e8, 1e8, 1e7]), static_bytes=np.full(layers, 1e8),
                      stage_forward_s=zeros, stage_backward_s=zeros, stage_recompute_s=zeros, stage_bytes=zeros,
                      p2p_s=0.0, memory_limit_bytes=80e9)
    for name, table, vpp, schedule in (("405B pp63", layer_table(p, s), 1, "1f1b"),
                                       ("1,024 layers pp32", deep, 1, "1f1b")):
        start = time.perf_counter()
        plan = balance(table, vpp, 100_000, schedule)
        took = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        print(f"{name}, 100,000 micro-batches: balance {took:.2f} s, peak RSS so far {peak / 2**20:.0f} MiB, "
              f"step {plan.best.makespan_s:.2f} s (timeline of {plan.best.simulation.timeline_microbatches})")


if __name__ == "__main__":
    main()
    large_cases()
