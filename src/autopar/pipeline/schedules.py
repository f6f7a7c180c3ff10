"""Pipeline schedules: the order in which each pipeline rank runs its forward and backward passes.

A schedule is, per rank, a static list of ``(kind, microbatch, chunk)`` with ``kind`` ``"F"``
(forward) or ``"B"`` (backward). The simulator (:mod:`autopar.pipeline.simulate`) adds the
recompute pass before each backward and, for the zero-bubble schedule, the weight-gradient
passes. Virtual stage ``j = chunk * pp + rank`` holds the ``j``-th contiguous block of layers
(Megatron-LM's interleaved assignment).

* ``gpipe``: all forwards, then all backwards (Huang et al., NeurIPS 2019).
* ``1f1b``: rank ``i`` runs ``min(pp - i - 1, m)`` warm-up forwards, then alternates one forward
  and one backward, then drains (PipeDream-Flush; Narayanan et al., SC'21, sec. 2.2.1, fig. 4 top).
* ``interleaved``: Megatron's interleaved 1F1B (Narayanan et al., SC'21, sec. 2.2.2, fig. 4
  bottom; ``megatron/core/pipeline_parallel/schedules.py``,
  ``forward_backward_pipelining_with_interleaving``): micro-batches go through the chunks in
  groups of ``pp``; rank ``i`` warms up with ``2 * (pp - i - 1) + (vpp - 1) * pp`` chunk forwards.
* ``zb-h1``: 1F1B's forward/backward order with each backward split into the input-gradient
  pass B and a weight-gradient pass W that fills idle time (Qi et al., "Zero Bubble Pipeline
  Parallelism", ICLR 2024, sec. 3.1, ZB-H1); rank ``i`` may defer up to ``i`` W passes.
* ``zbv``, ``dualpipev``, ``dualpipe``: the V-shape and bidirectional zero-bubble schedules
  (two chunks per rank, explicit ``I``/``W``/overlapped ops; :mod:`autopar.pipeline.schedules_v`)
  on their own placements (:mod:`autopar.pipeline.placement`).
"""

from __future__ import annotations

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline.placement import BIDIRECTIONAL_SCHEDULES, V_SCHEDULES
from autopar.pipeline.schedules_v import dualpipe_order, dualpipev_order, zbv_order

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev", "dualpipe")
TWO_CHUNK_SCHEDULES = V_SCHEDULES + BIDIRECTIONAL_SCHEDULES

Order = list[tuple[str, int, int]]


def check_schedule(schedule: str, pp: int, vpp: int, num_microbatches: int) -> None:
    """Raise if the schedule cannot run these sizes.

    Raises:
        AutoparError: unknown schedule; vpp > 1 with a one-chunk schedule (or vpp = 1 with
            ``interleaved``); interleaving with ``num_microbatches`` not a multiple of ``pp``
            (Megatron's micro-batch group size); a V or bidirectional schedule with vpp other than
            2 (PyTorch ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``: "requires exactly 2
            stages per rank"); DualPipeV with fewer than ``2 * pp`` micro-batches (PyTorch: "at
            least as many microbatches as stages"); DualPipe with an odd ``pp`` or
            ``num_microbatches``, or fewer than ``2 * pp`` (``dualpipe.py``: ``num_ranks % 2 == 0``,
            ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2``); a non-positive size.
    """
    if schedule not in SCHEDULES:
        raise AutoparError(f"schedule={schedule!r}: allowed {', '.join(SCHEDULES)}")
    for name, value in (("pp", pp), ("vpp", vpp), ("num_microbatches", num_microbatches)):
        if value < 1:
            raise AutoparError(f"{name}={value}: must be a positive integer")
    m = num_microbatches
    if schedule in TWO_CHUNK_SCHEDULES:
        if vpp != 2:
            raise AutoparError(f"schedule={schedule!r} with vpp={vpp}: it runs exactly 2 model chunks per pipeline "
                               "rank (PyTorch: 'requires exactly 2 stages per rank')")
        if schedule == "dualpipev" and m < 2 * pp:
            raise AutoparError(f"num_microbatches={m}: DualPipeV needs at least 2 * pp = {2 * pp} "
                               "(PyTorch ScheduleDualPipeV: at least as many micro-batches as stages)")
        if schedule == "dualpipe" and (pp % 2 or m % 2 or m < 2 * pp):
            raise AutoparError(f"schedule='dualpipe' with pp={pp}, num_microbatches={m}: DualPipe needs an even pp "
                               f"and an even num_microbatches >= 2 * pp (deepseek-ai/DualPipe dualpipe.py)")
        return
    if (schedule == "interleaved") != (vpp > 1):
        raise AutoparError(f"schedule={schedule!r} with vpp={vpp}: the interleaved schedule is exactly vpp > 1")
    if schedule == "interleaved" and m % pp:
        raise AutoparError(f"num_microbatches={m}: the interleaved schedule needs a multiple "
                           f"of pp={pp} (Megatron: micro-batch group size = pp)")


def _interleaved_chunk(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """(microbatch, chunk) of the ``k``-th chunk forward (or backward) on a rank (Megatron's
    ``get_model_chunk_id`` / ``get_microbatch_id_in_model_chunk``)."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    return group * pp + within % pp, chunk if forward else vpp - 1 - chunk


def rank_order(schedule: str, rank: int, pp: int, vpp: int, num_microbatches: int) -> Order:
    """Forward/backward order of one rank, as ``(kind, microbatch, chunk)`` tuples (kinds ``F``
    and ``B``; the two-chunk schedules also ``I``, ``W`` and ``O``, :mod:`autopar.pipeline.schedules_v`).

    Raises:
        AutoparError: see :func:`check_schedule`.
    """
    check_schedule(schedule, pp, vpp, num_microbatches)
    m = num_microbatches
    if schedule == "zbv":
        return zbv_order(rank, pp, m)
    if schedule == "dualpipev":
        return dualpipev_order(rank, pp, m)
    if schedule == "dualpipe":
        return dualpipe_order(rank, pp, m)
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule in ("1f1b", "zb-h1"):
        warmup = min(pp - rank - 1, m)
        order: Order = [("F", i, 0) for i in range(warmup)]
        for k in range(m - warmup):
            order += [("F", warmup + k, 0), ("B", k, 0)]
        return order + [("B", k, 0) for k in range(m - warmup, m)]
    total = m * vpp
    warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
    fwd = [("F",) + _interleaved_chunk(k, pp, vpp, True) for k in range(total)]
    bwd = [("B",) + _interleaved_chunk(k, pp, vpp, False) for k in range(total)]
    order = fwd[:warmup]
    for k in range(total - warmup):
        order += [fwd[warmup + k], bwd[k]]
    return order + bwd[total - warmup:]


def deferred_weight_grads(schedule: str, rank: int, pp: int) -> int:
    """How many weight-gradient passes rank ``rank`` may hold back (ZB-H1: ``rank``, so a rank
    holds at most the ``pp - rank`` micro-batches of 1F1B plus ``rank``, never more than 1F1B's
    peak ``pp`` on rank 0; Qi et al. sec. 3.1)."""
    return rank if schedule == "zb-h1" else 0


def in_flight_chunks(schedule: str, pp: int, vpp: int, num_microbatches: int) -> np.ndarray:
    """Peak number of (micro-batch, chunk) activations each rank holds, shape ``(pp,)``.

    GPipe: all ``m``. 1F1B: ``min(pp - i, m)`` (Narayanan et al., SC'21, sec. 2.2.1). ZB-H1:
    ``min(pp, m)`` on every rank (deferred W passes keep their inputs; Qi et al. sec. 3.1).
    Interleaved: ``min(2 * (pp - i - 1) + (vpp - 1) * pp + 1, m * vpp)`` (the warm-up plus the
    first steady forward). Divide by ``vpp`` for micro-batches' worth of a rank's layers. The
    two-chunk schedules: counted along the rank's op order (:func:`order_peak_in_flight`), which
    gives ZB-V ``2 pp`` chunks on every rank for ``m >= 2 pp`` (1F1B's rank-0 peak, Qi et al. sec.
    6), DualPipeV ``2 pp + 1`` chunks (the README's ``PP + 1`` stages for ``PP = 2 pp``) and
    DualPipe ``pp + 1`` chunks (stages) on its outer ranks.

    Raises:
        AutoparError: see :func:`check_schedule`.
    """
    check_schedule(schedule, pp, vpp, num_microbatches)
    rank = np.arange(pp)
    m = num_microbatches
    if schedule in TWO_CHUNK_SCHEDULES:
        return np.array([order_peak_in_flight(rank_order(schedule, r, pp, vpp, m)) for r in range(pp)])
    if schedule == "gpipe":
        return np.full(pp, m)
    if schedule == "interleaved":
        return np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp + 1, m * vpp)
    if schedule == "zb-h1":
        return np.full(pp, min(pp, m))
    return np.minimum(pp - rank, m)


def order_peak_in_flight(order: Order) -> int:
    """Most (micro-batch, chunk) activations held at once along one rank's op order: a forward
    (``F``, ``O``) keeps its activations until its full backward ``B`` or its ``W`` ends (the W
    pass still reads the layer inputs; Qi et al. sec. 2)."""
    held = most = 0
    for kind, _, _ in order:
        held += 1 if kind in ("F", "O") else -1 if kind in ("B", "W") else 0
        most = max(most, held)
    return most


def parameter_copies(schedule: str) -> int:
    """Copies of one pipeline stage's parameters per rank relative to its share of the model:
    2 for DualPipe (each rank holds stage ``r`` of one direction and stage ``pp - 1 - r`` of the
    other; DeepSeek-V3 technical report, sec. 3.2.1, "Parameter 2x"), else 1 (DualPipeV's two
    chunks are two halves of one rank's share)."""
    return 2 if schedule == "dualpipe" else 1
