"""Step makespan and activations in flight of the V schedules (ZB-V, DualPipeV) for many layouts.

The search costs a layout by its slowest rank's per-micro-batch time ``t`` (two chunks of
``t / 2`` each under the V placement). The V schedules' fixed op orders
(:mod:`autopar.pipeline.schedules_v`) give, for ``m >= 2 pp``, a makespan of ``m * t`` plus a
bubble that does not depend on ``m`` (checked for pp 2-8 and m 2pp-10pp in
``tests/pipeline/test_v_cost.py``); the papers' closed forms (ZB-V zero bubble, DualPipeV
``(PP/2-1)(F&B+B-3W)``) hold only at their ``T_F = T_B = T_W`` design point, so the bubble is
taken from the event simulation (:func:`autopar.pipeline.simulate.simulate`) of ``2 pp``
micro-batches (``m`` itself when fewer) on equal chunks, in units of ``t``, with the forward
share and the weight-gradient share rounded to :data:`SHARE_STEP` and cached: a search holds a
few pp values and shares. The rounding moves the bubble by under ``pp * SHARE_STEP / 2 * t``.

Activations: :func:`autopar.pipeline.schedules.in_flight_chunks` along the schedule's order
(ZB-V ``2 pp`` chunks = ``pp`` micro-batches of a rank's layers, DualPipeV ``2 pp + 1`` chunks).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.strategy import V_SCHEDULE_NAMES

SHARE_STEP = 0.01  # rounding of the forward and weight-gradient shares (cache key)


@lru_cache(maxsize=4096)
def _bubble_per_t(schedule: str, pp: int, m: int, forward_steps: int, weight_steps: int) -> float:
    """Bubble of ``schedule`` in units of the rank's per-micro-batch time (module docstring)."""
    forward = forward_steps * SHARE_STEP
    times = PipelineTimes.uniform(pp, 2, forward / 2, (1 - forward) / 2)
    times = PipelineTimes(times.forward_s, times.backward_s, times.recompute_s, 0.0, weight_steps * SHARE_STEP)
    return simulate(times, m, schedule).makespan_s - m


def v_makespans_s(v_schedule: np.ndarray, pp: np.ndarray, m: np.ndarray, rank_s: np.ndarray, forward_share: np.ndarray,
                  weight_share: np.ndarray) -> np.ndarray:
    """Pipeline makespans (seconds, ``(n,)``) of layouts run with a V schedule.

    Args:
        v_schedule: ``(n,)`` 1 + index into :data:`V_SCHEDULE_NAMES` (0 rows get nan).
        pp, m: ``(n,)`` pipeline ranks and micro-batches per step.
        rank_s: ``(n,)`` slowest rank's seconds per micro-batch (both chunks).
        forward_share: ``(n,)`` forward part of ``rank_s`` in [0, 1].
        weight_share: ``(n,)`` weight-gradient part of the rest (the backward without recompute
            over two: Qi et al., ICLR 2024, sec. 2, ``T_W ~ T_B``) in [0, 1).
    """
    out = np.full(len(pp), np.nan)
    forward = np.rint(np.clip(forward_share, 0.0, 1.0) / SHARE_STEP).astype(np.int64)
    weight = np.rint(np.clip(weight_share, 0.0, 0.99) / SHARE_STEP).astype(np.int64)
    sim_m = np.minimum(m, 2 * pp)
    keys = np.stack([v_schedule, pp, sim_m, forward, weight], axis=1)
    rows = np.flatnonzero(v_schedule > 0)
    if rows.size:
        unique, inverse = np.unique(keys[rows], axis=0, return_inverse=True)
        per_t = np.array([_bubble_per_t(V_SCHEDULE_NAMES[k[0] - 1], int(k[1]), int(k[2]), int(k[3]), int(k[4]))
                          for k in unique])
        out[rows] = (m[rows] + per_t[inverse.ravel()]) * rank_s[rows]
    return out


@lru_cache(maxsize=4096)
def _in_flight(schedule: str, pp: int, m: int) -> tuple[float, ...]:
    return tuple(float(c) / 2 for c in in_flight_chunks(schedule, pp, 2, m))


def v_in_flight_microbatches(v_schedule: np.ndarray, pp: np.ndarray, m: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Micro-batches' worth of a rank's layer activations at its peak (``(n,)``; chunks in flight
    over 2) for V rows; nan elsewhere."""
    out = np.full(len(pp), np.nan)
    for i in np.flatnonzero(v_schedule > 0):
        out[i] = _in_flight(V_SCHEDULE_NAMES[int(v_schedule[i]) - 1], int(pp[i]), int(m[i]))[int(rank[i])]
    return out
