"""``estimate --detail``: time and memory of every pipeline stage in one table (Tinker's ``--detail``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.estimate import Estimate

GIB = 2**30
MS = 1e3


def stage_detail_table(e: Estimate) -> Table:
    """One row per pipeline stage of ``e``: milliseconds per micro-batch of forward, backward,
    recomputed forward, exposed TP / CP / EP collectives and one p2p send; seconds busy per step
    (micro-batches x that sum); exposed data-parallel milliseconds per step; GiB of model state
    (weights + gradients + optimizer), activations and the stage's peak
    (:class:`~autopar.estimate.StageTiming`, :class:`~autopar.estimate.StageMemory`)."""
    table = Table(title=f"Time and memory per stage ({e.num_microbatches} micro-batches; ms per micro-batch, "
                        "busy s per step, GiB per device)")
    for name in ("stage", "layers", "recompute", "fwd ms", "bwd ms", "recomp ms", "tp ms", "cp ms", "ep ms", "p2p ms",
                 "busy s", "dp ms", "states GiB", "act GiB", "peak GiB"):
        table.add_column(name, justify="left" if name == "recompute" else "right")
    for t, m in zip(e.time_per_stage, e.memory_per_stage):
        states = m.weights_bytes + m.grads_bytes + m.optimizer_bytes
        table.add_row(str(t.stage), str(t.layers), m.recompute,
                      *(f"{x * MS:.2f}" for x in (t.forward_s, t.backward_s, t.recompute_s, t.tp_comm_s, t.cp_comm_s,
                                                  t.ep_comm_s, t.p2p_s)),
                      f"{t.busy_s:.3f}", f"{t.dp_comm_s * MS:.2f}",
                      *(f"{x / GIB:.1f}" for x in (states, m.activations_bytes, m.total_bytes)))
    return table


def print_stage_detail(console: Console, e: Estimate) -> None:
    """Print :func:`stage_detail_table` of ``e`` and which stage bounds the step."""
    console.print(stage_detail_table(e))
    if e.time_per_stage:
        slowest = max(e.time_per_stage, key=lambda t: t.busy_s)
        heaviest = max(e.memory_per_stage, key=lambda m: m.total_bytes)
        console.print(f"slowest stage {slowest.stage} ({slowest.busy_s:.3f} s busy of {e.step_time_s:.3f} s per step); "
                      f"heaviest stage {heaviest.stage} ({heaviest.total_bytes / GIB:.1f} GiB)", highlight=False)
