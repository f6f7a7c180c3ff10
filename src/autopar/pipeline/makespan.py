"""Pipeline makespan for ``autopar estimate``: fast static-schedule simulation of a layout.

The closed forms of :mod:`autopar.cost.step` assume equal stages; with uneven layer counts
(``--layers-per-stage``, or Megatron's default split when pp does not divide the layers) the
estimate uses this simulation instead. :func:`static_makespan_s` computes the same makespan as
:func:`autopar.pipeline.simulate.simulate` for the static schedules (gpipe, 1f1b, interleaved)
without building a timeline: every op starts at ``max(rank free, input arrived)`` in its rank's
order, so ranks can be advanced round-robin in any order.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autopar.cost.stage import Stages
from autopar.cost.stage_time import p2p_time_s
from autopar.cost.step import StepCosts
from autopar.errors import AutoparError
from autopar.pipeline.layers import op_times_s
from autopar.pipeline.schedules import check_schedule, rank_order
from autopar.pipeline.simulate import PipelineTimes
from autopar.problem import Problem
from autopar.strategy import LayoutBatch, Strategy


def _simulate_static(fwd: np.ndarray, bwd: np.ndarray, rec: np.ndarray, p2p: float, m: int, schedule: str) -> float:
    """Makespan by list scheduling: a rank runs its ops in order until one's input is missing,
    then waits on that input; finishing an op wakes the rank waiting for it (O(ops))."""
    pp, vpp = fwd.shape
    last = pp * vpp - 1
    ops = []
    for r in range(pp):
        rank_ops = []
        for kind, mb, c in rank_order(schedule, r, pp, vpp, m):
            j = c * pp + r
            if kind == "F":
                rank_ops.append((0, j, mb, fwd[r, c], True))
            elif rec[r, c] > 0:
                rank_ops += [(1, j, mb, rec[r, c], False), (2, j, mb, bwd[r, c], True)]
            else:
                rank_ops.append((1, j, mb, bwd[r, c], True))
        ops.append(rank_ops)
    f_end = [-1.0] * ((last + 1) * m)
    b_end = [-1.0] * ((last + 1) * m)
    waiter_f, waiter_b = {}, {}
    pointer, free = [0] * pp, [0.0] * pp
    runnable = list(range(pp))
    while runnable:
        r = runnable.pop()
        rank_ops, i, t = ops[r], pointer[r], free[r]
        while i < len(rank_ops):
            kind, j, mb, duration, done = rank_ops[i]
            ready = 0.0
            if kind == 0 and j:  # forward: needs the previous virtual stage's forward
                ready = f_end[(j - 1) * m + mb]
                if ready < 0:
                    waiter_f[(j - 1) * m + mb] = r
                    break
                ready += p2p
            elif kind == 1:  # (recompute or) backward: needs the next virtual stage's gradient
                if j == last:
                    ready = f_end[j * m + mb]
                else:
                    ready = b_end[(j + 1) * m + mb]
                    if ready < 0:
                        waiter_b[(j + 1) * m + mb] = r
                        break
                    ready += p2p
            t = (t if t > ready else ready) + duration
            i += 1
            if kind == 0:
                f_end[j * m + mb] = t
                woken = waiter_f.pop(j * m + mb, None)
            elif done:
                b_end[j * m + mb] = t
                woken = waiter_b.pop(j * m + mb, None)
            else:
                woken = None
            if woken is not None:
                runnable.append(woken)
        pointer[r], free[r] = i, t
    if any(pointer[r] < len(ops[r]) for r in range(pp)):
        raise AutoparError(f"schedule {schedule!r} deadlocked (pp={pp}, vpp={vpp}, m={m})")
    return max(free)


def static_makespan_s(times: PipelineTimes, num_microbatches: int, schedule: str) -> float:
    """Makespan (seconds) of ``schedule`` (``gpipe``, ``1f1b`` or ``interleaved``) with
    per-(rank, chunk) ``times``; equals ``simulate(...).makespan_s``.

    With many micro-batches the schedule reaches a periodic steady state (a max-plus linear
    system; Baccelli et al., "Synchronization and Linearity", 1992, ch. 3) where each further
    group of ``pp`` micro-batches adds the same time. When ``m > 4 * pp`` the makespans of
    ``k * pp`` micro-batches for k = 1, 2, 3 (then 2, 3, 4) are simulated; if two successive
    increments agree (to 1e-9) the makespan is extrapolated linearly, otherwise ``m`` is
    simulated in full.

    Raises:
        AutoparError: ``zb-h1`` (its W placement is dynamic: use ``simulate``), or sizes the
            schedule cannot run.
    """
    if schedule == "zb-h1":
        raise AutoparError("schedule='zb-h1': use autopar.pipeline.simulate.simulate (dynamic W placement)")
    fwd, bwd, rec = (np.asarray(x, dtype=float) for x in (times.forward_s, times.backward_s, times.recompute_s))
    pp, m = fwd.shape[0], num_microbatches
    check_schedule(schedule, pp, fwd.shape[1], m)
    if m > 4 * pp and schedule != "gpipe":
        spans = {k: _simulate_static(fwd, bwd, rec, times.p2p_s, k * pp, schedule) for k in (1, 2, 3)}
        for first in (1, 2):  # steady state usually holds from pp micro-batches on; else one group later
            if first == 2:
                spans[4] = _simulate_static(fwd, bwd, rec, times.p2p_s, 4 * pp, schedule)
            a, b, c = spans[first], spans[first + 1], spans[first + 2]
            if abs((c - b) - (b - a)) <= 1e-9 * c:
                return c + (m - (first + 2) * pp) * (c - b) / pp
    return _simulate_static(fwd, bwd, rec, times.p2p_s, m, schedule)


def simulated_costs(p: Problem, s: Strategy, batch: LayoutBatch, stages: Stages, costs: StepCosts) -> StepCosts:
    """``costs`` of one layout with the pipeline makespan simulated stage by stage.

    ``batch``/``stages``: the layout repeated per stage and its stages
    (:func:`autopar.cost.stage.all_stages`). A stage's per-micro-batch time (communication shared
    out as in :mod:`autopar.pipeline.layers`) is split evenly over its ``vpp`` chunks. The time
    breakdown keeps its compute/communication terms; ``pp_bubble`` becomes the simulated
    makespan without p2p minus ``m`` times the slowest stage and ``pp_comm`` what p2p adds to
    the makespan, so the breakdown still sums to the step time.
    """
    op = op_times_s(p, batch, stages) / s.vpp  # (3, pp) per chunk
    chunks = [np.repeat(x[:, None], s.vpp, axis=1) for x in op]
    schedule = "interleaved" if s.vpp > 1 else "1f1b"
    m = s.num_microbatches(p.train.global_batch_size)
    p2p = float(p2p_time_s(p, batch.take(np.zeros(1, dtype=np.int64)))[0])
    without = static_makespan_s(PipelineTimes(*chunks, p2p_s=0.0), m, schedule)
    with_p2p = static_makespan_s(PipelineTimes(*chunks, p2p_s=p2p), m, schedule)
    b = costs.time_breakdown_s
    busy = b["compute"] + b["tp_comm"] + b["cp_comm"] + b["ep_comm"]
    breakdown = dict(b, pp_bubble=np.maximum(without - busy, 0.0), pp_comm=np.asarray([with_p2p - without]))
    step = busy + breakdown["pp_bubble"] + breakdown["pp_comm"] + b["dp_comm"] + b["optimizer"]
    scale = costs.step_time_s / step
    return replace(costs, step_time_s=step, time_breakdown_s=breakdown,
                   tokens_per_s_per_device=costs.tokens_per_s_per_device * scale, mfu=costs.mfu * scale)
