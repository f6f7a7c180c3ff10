"""Pipeline simulation in bounded time: the periodic steady state extrapolated for many micro-batches.

:func:`autopar.pipeline.simulate.simulate` runs every op: ``pp * vpp * m`` forwards and as many
backwards, each with a Python object (357 s and 9.2 GB for pp 63 and 100,000 micro-batches).
Between the warm-up and the drain, 1F1B gives every micro-batch the same ops (interleaved 1F1B
every group of ``pp``): op ``(rank, kind, micro-batch i, chunk)`` is preceded on its rank and
fed by the ops of ``i - 1`` (``i - pp``) shifted by one. Each op's time is a max-plus function of
the times of the few ops before it, so the step is a max-plus linear system that settles into a
periodic regime (Baccelli et al., "Synchronization and Linearity", 1992, ch. 3): every ``c``
micro-batches each op recurs ``delta`` seconds later. ``c`` is the length of the critical
cycle, not always 1 or ``pp``: Llama-3.1-405B at pp 63 with p2p repeats every 17 micro-batches
(its 17 slowest stages form the cycle).

:func:`simulate_bounded` simulates ``M`` micro-batches and looks, past a warm-up of ``a = 2pp``
micro-batches, for the smallest ``c <= 2pp`` (a multiple of the schedule's own period) such that
every op of micro-batches ``[a, a + W)``, ``W = 4pp``, starts exactly ``delta`` (to 1e-9 of the
makespan) after its counterpart ``c`` micro-batches earlier. The window is wider than ``c`` plus
the reach of any dependency (a rank's previous op is under ``2pp`` micro-batches away), so by
induction every later op recurs the same way, the drain included: ``m`` micro-batches take
``makespan(M') + (m - M') / c * delta`` for ``M' = M`` rounded up to ``m``'s remainder modulo
``c`` (a second simulation where needed), the fill + (m - k) * period + drain form. Without such
a ``c``, ``a`` doubles (a longer transient) while the simulated ops stay within
:data:`MAX_SIMULATED_OPS`. The peaks of the held activations recur with the ops; the busy time
is exact (``m`` times one micro-batch's work), so is the bubble. ``m <= M`` is simulated in full,
and GPipe (its backward phase waits for all ``m`` forwards) and ZB-H1 (see :data:`EXTRAPOLATED`)
only within :data:`MAX_SIMULATED_OPS`.
``tests/pipeline/test_pipeline_steady.py`` checks the extrapolation against the full simulation.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline.schedules import check_schedule
from autopar.pipeline.simulate import PipelineTimes, SimulationResult, simulate

# Ops (one chunk's forward, backward or recompute of one micro-batch) simulated for one answer:
# the event simulation runs ~100,000 ops a second and holds ~200 bytes per op for its timeline,
# so this keeps one call under ~5 s and ~200 MB whatever num_microbatches is.
MAX_SIMULATED_OPS = 500_000
# Schedules whose op times are max-plus functions of the durations (no decision): their recurrence
# holds for every later op. ZB-H1 runs a W pass when the next input "has not arrived yet", a
# comparison a float tie can flip one group and not the next, so a recurring window does not
# prove a recurring drain (hypothesis found one 0.2% off); it is simulated in full, as GPipe.
# ZB-V and DualPipeV list every op (W included) in a fixed order, so they recur; DualPipe counts
# micro-batches per direction, which this window does not, and is simulated in full.
EXTRAPOLATED = ("1f1b", "interleaved", "zbv", "dualpipev")
RECURRENCE_REL_TOL = 1e-9  # float rounding of sums over the makespan, far below any time autopar prints


def _ops(pp: int, vpp: int, m: int) -> int:
    """Ops of one step: forward, recompute and backward of every (micro-batch, virtual stage)."""
    return 3 * pp * vpp * m


def simulate_bounded(times: PipelineTimes, num_microbatches: int, schedule: str,
                     activation_bytes: np.ndarray | None = None) -> SimulationResult:
    """``simulate(times, num_microbatches, schedule, activation_bytes)`` within
    :data:`MAX_SIMULATED_OPS` simulated ops (see the module docstring).

    The result's makespan, bubble and peaks are ``num_microbatches``'; when extrapolated, its
    ``timeline`` is that of the simulated step of ``timeline_microbatches`` micro-batches.

    Raises:
        AutoparError: what :func:`simulate` raises; GPipe or ZB-H1, or no periodic steady state
            within :data:`MAX_SIMULATED_OPS` ops, while the full simulation would exceed them (the
            message gives the bound on ``pp * vpp * num_microbatches``).
    """
    pp, vpp = np.shape(times.forward_s)
    m, g = num_microbatches, pp
    check_schedule(schedule, pp, vpp, m)
    step = g if schedule == "interleaved" else 1  # the schedule's own period in micro-batches
    warmup, spent = 2 * g, 0
    while schedule in EXTRAPOLATED:
        size = warmup + 8 * g  # warm-up, window 4g, shift <= 2g, drain 2g
        size += (m - size) % step  # interleaving runs whole groups
        if size >= m or spent + _ops(pp, vpp, size) > MAX_SIMULATED_OPS:
            break
        run = simulate(times, size, schedule, activation_bytes)
        spent += _ops(pp, vpp, size)
        found = _period(run, warmup, 4 * g, 2 * g, step)
        if found is not None:
            cycle, delta = found
            final = size + (m - size) % cycle  # the same remainder as m modulo the cycle
            if final != size:
                if spent + _ops(pp, vpp, final) > MAX_SIMULATED_OPS:
                    break
                run = simulate(times, final, schedule, activation_bytes)
            makespan = run.makespan_s + (m - final) // cycle * delta
            busy = m * float(np.sum(_work_per_microbatch_s(times)))
            return replace(run, makespan_s=makespan, timeline_microbatches=final, step_microbatches=m,
                           bubble_fraction=1 - busy / (pp * makespan) if makespan > 0 else 0.0)
        warmup *= 2  # a longer transient: look further on
    if _ops(pp, vpp, m) > MAX_SIMULATED_OPS:
        what = {"gpipe": "GPipe's backwards wait for every forward",
                "zb-h1": "ZB-H1 places its W passes by comparing times",
                "dualpipe": "DualPipe counts micro-batches per direction"}.get(schedule, "no periodic steady state found")
        raise AutoparError(f"num_microbatches={m}: the {schedule} pipeline (pp={pp}, vpp={vpp}) is simulated op by op "
                           f"({what}) up to pp * vpp * num_microbatches = {MAX_SIMULATED_OPS // 3:,}; lower --gbs or "
                           "raise --mbs/--dp")
    return simulate(times, m, schedule, activation_bytes)


def _period(run: SimulationResult, start: int, width: int, longest: int, step: int) -> tuple[int, float] | None:
    """:func:`recurrence` of the start times of ``run``'s ops."""
    kinds: dict[tuple[int, str, int], int] = {}
    for op in run.timeline:
        kinds.setdefault((op.stage, op.kind, op.chunk), len(kinds))
    start_s = np.full((len(kinds), start + width + longest), np.nan)
    for op in run.timeline:
        if op.microbatch < start_s.shape[1]:
            start_s[kinds[op.stage, op.kind, op.chunk], op.microbatch] = op.start_s
    return recurrence(start_s, start, width, longest, step, RECURRENCE_REL_TOL * run.makespan_s)


def recurrence(op_s: np.ndarray, start: int, width: int, longest: int, step: int,
               tol_s: float) -> tuple[int, float] | None:
    """``(c, delta)``: the smallest ``c`` (a multiple of ``step``, at most ``longest``) such that
    every op of micro-batches ``[start, start + width)`` happens ``delta`` seconds after the same
    op ``c`` micro-batches earlier, the same shift for all (within ``tol_s``); None when there is
    none (still in the transient).

    Args:
        op_s: ``(ops, micro-batches)``: the time of each op (a row per rank, kind and chunk) of
            each micro-batch, nan where the op does not exist; at least ``start + width +
            longest`` columns.
    """
    earlier = op_s[:, start:start + width]
    exists = ~np.isnan(earlier)
    for cycle in range(step, longest + 1, step):
        later = op_s[:, start + cycle:start + cycle + width]
        if not np.array_equal(exists, ~np.isnan(later)):
            continue
        shift = (later - earlier)[exists]
        if shift.size and np.ptp(shift) <= tol_s:
            return cycle, float(np.median(shift))
    return None


def _work_per_microbatch_s(times: PipelineTimes) -> np.ndarray:
    """Busy seconds per micro-batch of each rank, shape ``(pp,)``: forward, recompute and the
    whole backward (ZB-H1's B and W together) of its chunks."""
    return np.sum(np.asarray(times.forward_s, float) + np.asarray(times.recompute_s, float)
                  + np.asarray(times.backward_s, float), axis=1)
