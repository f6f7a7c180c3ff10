"""Event simulation of one pipeline-parallel training step.

Each rank runs its schedule's op order (:mod:`autopar.pipeline.schedules`) one op at a time. An
op starts when its rank is free and its input has arrived: a forward of virtual stage ``j``
needs the forward of ``j - 1`` plus one p2p transfer, a backward of ``j`` the backward of
``j + 1`` plus one p2p transfer (the last virtual stage needs only its own forward). With
activation recompute (Chen et al. 2016; Korthikanti et al., MLSys'23) the recompute pass runs
when the gradient arrives, right before the backward it serves. p2p transfers are modelled as a
delay on the dependency (asynchronous send/receive, overlapped with compute), so with zero p2p
the closed forms hold exactly (Narayanan et al., SC'21, sec. 2.2): GPipe and 1F1B take
``(m + pp - 1) * (t_f + t_b)``, interleaved 1F1B ``(m + (pp - 1) / vpp) * (t_f + t_b)`` with
per-chunk times ``t_f / vpp`` and ``t_b / vpp``.

Zero bubble (ZB-H1, Qi et al., ICLR 2024, sec. 3.1): the backward splits into B (input
gradient, on the critical path) and W (weight gradient, ``weight_grad_fraction`` of the
backward; 1/2 in their ``T_B = T_W`` model). A rank runs a pending W when its next op's input
has not arrived yet, or when it holds more W passes than allowed (``i`` on rank ``i``, so that
no rank holds more than ``pp`` micro-batches, 1F1B's peak on rank 0). With ``t_f = t_b = t_w``
this gives the paper's makespan ``m * (t_f + t_b + t_w) + (pp - 1) * (t_f + t_b - t_w)``.

Placement and the two-chunk schedules: virtual stage of each (rank, chunk) is the schedule's
placement (:mod:`autopar.pipeline.placement`; the V turn and a chain's own rank pay no p2p).
ZB-V, DualPipeV and DualPipe list their ``I`` (input gradient, ``1 - weight_grad_fraction`` of
the backward) and ``W`` passes in the order itself (:mod:`autopar.pipeline.schedules_v`); an
overlapped forward ``O`` starts once the backward after it can start too (DualPipe's ``F&B``,
costed as ``F + B``: the overlap of one micro-batch's communication with the other's compute is
not modelled). With per-chunk ``F = 1, B = 2, W = 1`` the simulated idle time per rank is the
DualPipe README's ``(PP/2 - 1)(F&B + B - 3W)`` for DualPipe and DualPipeV, and ZB-V runs every
rank without a gap (``tests/pipeline/test_pipeline_schedules_v.py``).

Memory: a micro-batch's activations on a chunk are allocated when its forward starts and freed
when its backward ends (split backwards: when its W ends, since W still reads the layer inputs).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline.placement import placement
from autopar.pipeline.schedules import TWO_CHUNK_SCHEDULES, deferred_weight_grads, rank_order

KIND_NAMES = {"F": "forward", "O": "forward", "B": "backward", "I": "backward", "R": "recompute", "W": "weight_grad"}
SPLIT_BACKWARD = ("zb-h1",) + TWO_CHUNK_SCHEDULES  # schedules with weight-gradient (W) passes


@dataclass(frozen=True)
class PipelineTimes:
    """Seconds per micro-batch of each (rank, chunk), arrays of shape ``(pp, vpp)``.

    ``backward_s`` is the whole backward (input and weight gradients); ``recompute_s`` the
    recomputed forward (0 without recompute); ``p2p_s`` one activation or gradient transfer
    between adjacent virtual stages; ``weight_grad_fraction`` the share of the backward that
    ZB-H1 moves into its W pass.
    """

    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray
    p2p_s: float = 0.0
    weight_grad_fraction: float = 0.5

    @classmethod
    def uniform(cls, pp: int, vpp: int, forward_s: float, backward_s: float, recompute_s: float = 0.0,
                p2p_s: float = 0.0) -> "PipelineTimes":
        """Every chunk the same (the closed-form case)."""
        full = lambda v: np.full((pp, vpp), float(v))  # noqa: E731
        return cls(full(forward_s), full(backward_s), full(recompute_s), p2p_s)


class TimelineOp(NamedTuple):
    """One op of the timeline: ``kind`` is forward / backward / recompute / weight_grad (a named
    tuple: the simulation makes one per op, and a frozen dataclass took a third of its time)."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of one simulated step.

    Attributes:
        makespan_s: first forward start to last backward (or W) end.
        bubble_fraction: idle share of ``pp * makespan_s`` (uniform 1F1B: ``(pp-1)/(m+pp-1)``):
            every rank's idle time, faster stages waiting for slower ones included; printed as
            "ranks idle", unlike the step breakdown's ``pp_bubble`` (the fill and drain beyond
            the slowest stage's work, :mod:`autopar.cost.step`), printed as "bubble".
        peak_in_flight: ``(pp,)`` most (micro-batch, chunk) activations held at once per rank.
        peak_activation_bytes: ``(pp,)`` peak of the held activations (0 if none were given).
        timeline: every op, in the order it was scheduled.
        timeline_microbatches: None when ``timeline`` is this step's; else the step was
            extrapolated from its periodic steady state (:mod:`autopar.pipeline.steady`) and
            ``timeline`` is that of the same schedule with this many micro-batches.
        schedule: the schedule simulated (its placement maps chunks to virtual stages).
        step_microbatches: the step's own micro-batch count when extrapolated (the periods
            between ``timeline_microbatches`` and it come before the drain), else None.
    """

    makespan_s: float
    bubble_fraction: float
    peak_in_flight: np.ndarray
    peak_activation_bytes: np.ndarray
    timeline: list[TimelineOp]
    timeline_microbatches: int | None = None
    schedule: str = "1f1b"
    step_microbatches: int | None = None


def _check_times(times: PipelineTimes, schedule: str) -> tuple[int, int]:
    shape = np.shape(times.forward_s)
    if len(shape) != 2 or np.shape(times.backward_s) != shape or np.shape(times.recompute_s) != shape:
        raise AutoparError(f"pipeline times: forward/backward/recompute must share one (pp, vpp) shape, got "
                           f"{shape}, {np.shape(times.backward_s)}, {np.shape(times.recompute_s)}")
    for name in ("forward_s", "backward_s", "recompute_s"):
        values = np.asarray(getattr(times, name), dtype=float)
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise AutoparError(f"pipeline times: {name} must be finite and >= 0")
    if not (math.isfinite(times.p2p_s) and times.p2p_s >= 0):
        raise AutoparError(f"pipeline times: p2p_s={times.p2p_s} must be finite and >= 0")
    if schedule in SPLIT_BACKWARD and not 0 <= times.weight_grad_fraction < 1:
        raise AutoparError(f"weight_grad_fraction={times.weight_grad_fraction}: must be in [0, 1)")
    return shape


def simulate(times: PipelineTimes, num_microbatches: int, schedule: str,
             activation_bytes: np.ndarray | None = None) -> SimulationResult:
    """Simulate one step of ``schedule`` with per-(rank, chunk) ``times``.

    Args:
        times: per-micro-batch times, shape ``(pp, vpp)``.
        num_microbatches: micro-batches per step per pipeline (``m``; DualPipe: both directions).
        schedule: one of :data:`autopar.pipeline.schedules.SCHEDULES`.
        activation_bytes: optional ``(pp, vpp)`` bytes one micro-batch keeps on a chunk.

    Raises:
        AutoparError: inconsistent shapes, negative times, or sizes the schedule cannot run
            (see :func:`autopar.pipeline.schedules.check_schedule`).
    """
    pp, vpp = _check_times(times, schedule)
    m, num_virtual = num_microbatches, pp * vpp
    orders = [rank_order(schedule, r, pp, vpp, m) for r in range(pp)]
    act = np.zeros((pp, vpp)) if activation_bytes is None else np.asarray(activation_bytes, dtype=float)
    if act.shape != (pp, vpp):
        raise AutoparError(f"activation_bytes: shape {act.shape}, expected (pp, vpp) = ({pp}, {vpp})")
    table = placement(schedule, pp, vpp)
    stage_of = table.stage.tolist()
    rank_of, _ = table.owner()
    before = [table.previous(j) for j in range(num_virtual)]
    after = [table.next(j) for j in range(num_virtual)]
    zero_bubble = schedule == "zb-h1"  # W passes placed at run time; the two-chunk schedules list theirs
    w_frac = times.weight_grad_fraction if schedule in SPLIT_BACKWARD else 0.0
    # Python floats (the same doubles as numpy's) per [rank][chunk]: scalar numpy indexing is slow.
    fwd, rec = np.asarray(times.forward_s, float).tolist(), np.asarray(times.recompute_s, float).tolist()
    full = np.asarray(times.backward_s, float)
    bwd_input, wgt = (full * (1 - w_frac)).tolist(), (full * w_frac).tolist()
    size = act.tolist()
    duration = {"F": fwd, "O": fwd, "B": bwd_input if zero_bubble else full.tolist(), "I": bwd_input, "R": rec,
                "W": wgt}
    deferred = [deferred_weight_grads(schedule, r, pp) for r in range(pp)]
    p2p_s = times.p2p_s
    # Expand each backward into (recompute,) backward; R (or B) waits for the gradient. An
    # overlapped forward (O) starts with the backward after it, so its R goes before the O.
    expanded = []
    for r, order in enumerate(orders):
        ops = []
        for kind, mb, c in order:
            if kind in ("B", "I") and rec[r][c] > 0:
                ops.insert(len(ops) - 1 if ops and ops[-1][0] == "O" else len(ops), ("R", mb, c))
            ops.append((kind, mb, c))
        expanded.append(ops)

    nan = math.nan
    f_end = [[nan] * m for _ in range(num_virtual)]
    b_end = [[nan] * m for _ in range(num_virtual)]
    waiting: dict[tuple[str, int, int], list[int]] = {}
    pointer = [0] * pp
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    free_s = [0.0] * pp
    busy_s = [0.0] * pp
    events: list[list[tuple[float, int, int, float]]] = [[] for _ in range(pp)]  # (time, +1/-1, chunk, bytes)
    timeline: list[TimelineOp] = []
    heap = [(0.0, r) for r in range(pp)]

    def run(r: int, kind: str, mb: int, c: int, start: float, duration_s: float) -> float:
        end = start + duration_s
        timeline.append(TimelineOp(r, KIND_NAMES[kind], mb, c, start, end))
        if kind == "W":
            events[r].append((end, -1, c, size[r][c]))
        busy_s[r] += duration_s
        free_s[r] = end
        return end

    def dependency(r: int, kind: str, mb: int, c: int, index: int) -> tuple[tuple[str, int, int] | None, float]:
        j = stage_of[r][c]
        if kind in ("F", "O"):
            i = before[j]
            key, ready = (None, 0.0) if i is None else (("F", i, mb), f_end[i][mb] + (p2p_s if rank_of[i] != r else 0.0))
            if kind == "O":  # starts with the backward after it: both inputs
                nkey, nready = dependency(r, *expanded[r][index + 1], index + 1)
                if math.isnan(ready) or math.isnan(nready):
                    return (key, ready) if math.isnan(ready) else (nkey, nready)
                ready = max(ready, nready)
            return key, ready
        if kind == "R" or (kind in ("B", "I") and not rec[r][c] > 0):
            i = after[j]
            return (None, f_end[j][mb]) if i is None else (("B", i, mb), b_end[i][mb] + (p2p_s if rank_of[i] != r else 0.0))
        return None, 0.0  # B after its own R; W after its own I

    while heap:
        now, r = heapq.heappop(heap)
        now = max(now, free_s[r])
        ops = expanded[r]
        if pointer[r] == len(ops):
            if pending_w[r]:
                mb, c = pending_w[r].pop(0)
                run(r, "W", mb, c, now, wgt[r][c])
                heapq.heappush(heap, (free_s[r], r))
            continue
        kind, mb, c = ops[pointer[r]]
        key, ready = dependency(r, kind, mb, c, pointer[r])
        unknown = math.isnan(ready)
        too_many = len(pending_w[r]) > deferred[r]
        if pending_w[r] and (too_many or unknown or ready > now):
            wmb, wc = pending_w[r].pop(0)
            run(r, "W", wmb, wc, now, wgt[r][wc])
            heapq.heappush(heap, (free_s[r], r))
            continue
        if unknown:
            waiting.setdefault(key, []).append(r)
            continue
        start = max(now, ready)
        j = stage_of[r][c]
        end = run(r, kind, mb, c, start, duration[kind][r][c])
        pointer[r] += 1
        if kind in ("F", "O"):
            f_end[j][mb] = end
            events[r].append((start, 1, c, size[r][c]))
            kind = "F"
        elif kind in ("B", "I"):
            b_end[j][mb] = end
            if zero_bubble:
                pending_w[r].append((mb, c))
            elif kind == "B":
                events[r].append((end, -1, c, size[r][c]))
            kind = "B"
        for waiter in waiting.pop((kind, j, mb), []):
            heapq.heappush(heap, (free_s[waiter], waiter))
        heapq.heappush(heap, (free_s[r], r))

    if any(pointer[r] < len(expanded[r]) for r in range(pp)):
        raise AutoparError(f"schedule {schedule!r} deadlocked (pp={pp}, vpp={vpp}, m={m})")
    makespan = max(op.end_s for op in timeline)
    peak_count, peak_bytes = np.zeros(pp, dtype=np.int64), np.zeros(pp)
    for r in range(pp):
        count, held, most, most_bytes = 0, 0.0, 0, 0.0
        for _, delta, _, nbytes in sorted(events[r], key=lambda e: (e[0], e[1])):  # frees first at ties
            count += delta
            held += delta * nbytes
            most, most_bytes = max(most, count), max(most_bytes, held)
        peak_count[r], peak_bytes[r] = most, most_bytes
    bubble = 1 - float(np.array(busy_s).sum()) / (pp * makespan) if makespan > 0 else 0.0
    return SimulationResult(makespan, bubble, peak_count, peak_bytes, timeline, schedule=schedule)
