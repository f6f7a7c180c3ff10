"""Which parts of a simulated pipeline step a picture draws: fill, one steady-state period, drain.

A step of ``m`` micro-batches has ``2 * m * vpp`` or more ops per rank; drawn whole at
``m = 512`` they are a barcode. Between the fill (warm-up) and the drain, 1F1B and interleaved
1F1B repeat one period: every ``c`` micro-batches each op recurs ``delta`` seconds later (the
max-plus steady state of :mod:`autopar.pipeline.steady`). :func:`timeline_window` picks three
time segments of a :class:`~autopar.pipeline.simulate.SimulationResult`'s timeline:

* fill: from 0 to the end of rank 0's first backward (its warm-up forwards and the first
  gradient's way back through every stage);
* one period: ``c`` micro-batches in the middle of the steady state, from the start of rank 0's
  first-chunk forward of micro-batch ``k`` to that of ``k + c``;
* drain: from the start of rank 0's last forward to the end of the step;

and says what lies between them (seconds, micro-batches) so the picture can say what it left
out. A short step (at most :data:`WHOLE_FORWARDS_PER_RANK` forwards per rank), or one whose
steady state is too short to hold a period between fill and drain, is one segment: the whole
step. When the step was extrapolated from a shorter simulated one
(``SimulationResult.timeline_microbatches``), the drawn timeline is that shorter step's; its
drain is the real step's drain shifted by ``makespan_s`` minus the drawn makespan
(:mod:`autopar.pipeline.steady`: the extra periods come before the drain), so segments carry
that shift, and its micro-batches are the step's last ones: their numbers are shifted by the
step's micro-batches minus the drawn step's (128 micro-batches drawn from 20: the drain's 19 and
18 are the step's 127 and 126); the gaps count the extrapolated micro-batches too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.pipeline.simulate import SimulationResult, TimelineOp
from autopar.pipeline.steady import RECURRENCE_REL_TOL, recurrence

# At most this many forwards per rank (m * vpp) are drawn whole: 32 forwards and as many
# backwards (plus recomputes) on ~1,000 pixels leave each bar ~10 pixels wide.
WHOLE_FORWARDS_PER_RANK = 32


@dataclass(frozen=True)
class Segment:
    """One drawn time range of the timeline: ``[start_s, end_s]`` in the drawn timeline's
    seconds; ``shift_s`` added gives the step's own times and ``shift_microbatches`` added to a
    drawn op's micro-batch gives the step's own number (both non-zero only for the drain of an
    extrapolated step); ``name`` is ``whole step``, ``fill``, ``steady state`` or ``drain``."""

    name: str
    start_s: float
    end_s: float
    shift_s: float = 0.0
    shift_microbatches: int = 0


@dataclass(frozen=True)
class Gap:
    """What is not drawn between two segments: ``seconds`` of the step and ``microbatches``
    (rank 0's first-chunk forwards that start in it)."""

    seconds: float
    microbatches: int


@dataclass(frozen=True)
class TimelineWindow:
    """The segments to draw, the gaps between them (``len(gaps) == len(segments) - 1``), and
    the steady state's period: ``period_microbatches`` (``c``) and ``period_s`` (``delta``),
    None for a step drawn whole."""

    segments: tuple[Segment, ...]
    gaps: tuple[Gap, ...]
    period_microbatches: int | None = None
    period_s: float | None = None

    @property
    def elided(self) -> bool:
        """True when part of the step is left out of the picture."""
        return bool(self.gaps)


def _forward_starts(timeline: list[TimelineOp]) -> dict[int, float]:
    """Micro-batch -> start (s) of its first-chunk forward on rank 0."""
    return {op.microbatch: op.start_s for op in timeline if op.stage == 0 and op.kind == "forward" and op.chunk == 0}


def _period(timeline: list[TimelineOp], num_drawn: int, pp: int, step: int, makespan_s: float) -> tuple[int, float]:
    """``(c, delta)`` of the steady state read from the ops' start times
    (:func:`autopar.pipeline.steady.recurrence` past a warm-up of ``2 pp`` micro-batches, as
    :mod:`autopar.pipeline.steady` does); where the step is too short for that window, ``step``
    micro-batches and the mean spacing of rank 0's forwards in the middle of the step."""
    rows: dict[tuple[int, str, int], int] = {}
    for op in timeline:
        rows.setdefault((op.stage, op.kind, op.chunk), len(rows))
    start_s = np.full((len(rows), num_drawn), np.nan)
    for op in timeline:
        start_s[rows[op.stage, op.kind, op.chunk], op.microbatch] = op.start_s
    warmup, width, longest = 2 * pp, 2 * pp, 2 * pp
    if warmup + width + longest <= num_drawn:
        found = recurrence(start_s, warmup, width, longest, step, RECURRENCE_REL_TOL * makespan_s)
        if found is not None:
            return found
    starts = _forward_starts(timeline)
    middle = max(0, (num_drawn - step) // 2 // step * step)
    return step, starts[middle + step] - starts[middle] if middle + step in starts else makespan_s


def timeline_window(sim: SimulationResult, whole_forwards_per_rank: int = WHOLE_FORWARDS_PER_RANK) -> TimelineWindow:
    """The segments of ``sim.timeline`` a picture draws (see the module docstring).

    Args:
        sim: a simulated step (full or extrapolated; its timeline holds every op of the drawn step).
        whole_forwards_per_rank: draw the whole step when rank 0 runs at most this many forwards.
    Returns:
        One segment (the whole step) or three (fill, steady state, drain) with the two gaps.
    """
    timeline = sim.timeline
    drawn_end_s = max((op.end_s for op in timeline), default=sim.makespan_s)
    shift_s = sim.makespan_s - drawn_end_s
    whole = TimelineWindow((Segment("whole step", 0.0, drawn_end_s, 0.0),), ())
    rank0 = [op for op in timeline if op.stage == 0]
    forwards = [op for op in rank0 if op.kind == "forward"]
    if not forwards:
        return whole
    pp = 1 + max(op.stage for op in timeline)
    vpp = 1 + max(op.chunk for op in timeline)
    num_drawn = 1 + max(op.microbatch for op in timeline)
    if sim.timeline_microbatches is None and len(forwards) <= whole_forwards_per_rank:
        return whole
    step = pp if vpp > 1 else 1
    cycle, delta_s = _period(timeline, num_drawn, pp, step, sim.makespan_s)
    fill_end_s = min(op.end_s for op in rank0 if op.kind == "backward")
    drain_start_s = max(op.start_s for op in forwards)
    starts = _forward_starts(timeline)
    candidates = sorted(k for k in starts if k % step == 0 and k + cycle in starts
                        and starts[k] >= fill_end_s and starts[k + cycle] <= drain_start_s)
    per_microbatch_s = delta_s / cycle
    # the micro-batches never simulated (they precede the drain): the step's count less the drawn one's
    shift_mb = sim.step_microbatches - num_drawn if sim.step_microbatches is not None else None

    def gap(start_s: float, end_s: float, extra_s: float) -> Gap:
        drawn = sum(1 for t in starts.values() if start_s <= t < end_s)
        extra = 0 if extra_s <= 0 else shift_mb if shift_mb is not None else round(extra_s / per_microbatch_s)
        return Gap(end_s - start_s + extra_s, drawn + extra)

    drain_shift_mb = shift_mb if shift_mb is not None and shift_s > 0 else 0
    if not candidates:  # no whole period between fill and drain: only what was never simulated is left out
        if shift_s <= 0 or drain_start_s <= 0:
            return whole
        return TimelineWindow((Segment("fill + steady state", 0.0, drain_start_s),
                               Segment("drain", drain_start_s, drawn_end_s, shift_s, drain_shift_mb)),
                              (gap(drain_start_s, drain_start_s, shift_s),), cycle, delta_s)
    k = candidates[len(candidates) // 2]
    period = Segment("steady state", starts[k], starts[k + cycle])

    segments = [Segment("fill", 0.0, fill_end_s), period,
                Segment("drain", drain_start_s, drawn_end_s, shift_s, drain_shift_mb)]
    gaps = [gap(fill_end_s, period.start_s, 0.0), gap(period.end_s, drain_start_s, shift_s)]
    for i in (1, 0):  # nothing left out between two segments: draw them as one
        if gaps[i].microbatches == 0:
            a, b = segments[i], segments[i + 1]
            segments[i:i + 2] = [Segment(f"{a.name} + {b.name}", a.start_s, b.end_s, b.shift_s, b.shift_microbatches)]
            del gaps[i]
    if not gaps:
        return whole
    return TimelineWindow(tuple(segments), tuple(gaps), cycle, delta_s)
