"""The search's grid stage: every valid layout's memory, and step times best-first, only where needed.

:func:`autopar.search.valid_space.count_space` counts the space exactly without building a row.
The costing then goes over cells (:mod:`autopar.search.cells`, :mod:`autopar.search.cell_costs`):

1. memory (:func:`~autopar.search.cell_costs.memory_pass`): the peak of every valid layout, each
   memory term once per cell of what it reads; the counts of fitting, marginal and out-of-memory
   layouts and the lightest layout (for the "nothing fits" error) come from there, exactly;
2. floors (:func:`~autopar.search.cell_costs.floor_pass`): per cell of what the stage time reads
   less the recompute option, a lower bound of the step time of its fitting layouts (micro-batches
   times the first stage's time floor over every recompute setting,
   :func:`autopar.cost.stage_time.stage_time` with ``floor``);
3. seeds: the fitting layouts of each block's least-floor cell, timed in full; their step times
   order the blocks (likely best first) and the ``keep``-th of them bounds the top from the start;
4. times, block after block in that order, a chunk of up to :data:`CHUNK_ROWS` valid layouts at a
   time (smaller first chunks): only the floor cells, and then the layouts, that can still enter
   the top (:func:`_bound` of the running top and the seeds) go on, through the pipeline makespan
   (:func:`autopar.cost.step.makespan_lower_bound_s`) of their three stage views' floors, then of
   their stage times, to the full step (:class:`_Timer`); a block whose least floor is ruled out
   is skipped.

Exactness: the full grid ranks the fitting rows by (marginal, step time rounded to the
microsecond, :data:`autopar.strategy.SIMPLICITY_ORDER` from the last field, row index) with a
stable lexicographic sort (:func:`autopar.search.grid.costed_grid`). The same key with the row's
position in the full enumeration (the valid rows keep its order) orders any subset as the whole
does, so the first ``keep`` rows of the merge of each chunk's first ``keep`` rows are the first
``keep`` of the whole order, whatever order the chunks come in; a layout ruled out by a lower
bound of its step time would rank after the top's last entry. The costs are row-wise, so a
cell's numbers are those of each of its layouts.
A walk that needs more than ``keep`` rows (many layouts the target cannot write) is redone with
a larger ``keep`` by the caller (:func:`autopar.search.grid.search`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from autopar.cost import stage_time as T
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.progress import phase
from autopar.search.cell_costs import (
    ALL,
    MEMORY_TERMS,
    Reads,
    block_chunks,
    floor_pass,
    full_views,
    makespan_bound,
    memory_pass,
    own_views,
    take_time,
    time_rows,
    view_values,
)
from autopar.search.cells import Cells, SpaceCells
from autopar.search.distinct_rows import RowTerms
from autopar.search.valid_space import SpaceCount
from autopar.strategy import SIMPLICITY_ORDER

CHUNK_ROWS = 1 << 16  # valid layouts timed at once: ~64k rows keep a chunk's arrays in the CPU caches
FIRST_CHUNK_ROWS = 1 << 12  # the first chunk's: the running top fills from the best blocks first
# Fitting layouts kept in ranking order, at least (8 per layout asked for): the walk of `search._top`
# went to row 37 at most for the top 10 of 9 problems and targets (28 layouts MindSpeed-LLM cannot write
# on the way), and 320 for a top 50 (DeepSpeed); a walk past it reruns with 8 times more. Fewer kept rows
# make the running top's bound tighter: 1,024 -> 128 took Llama-3.1-405B on 16,384 H100 from 0.41 to 0.35 s.
KEEP = 128
Bound = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (peak bytes, step lower bound s) -> which to cost further


@dataclass
class Ranked:
    """The best fitting layouts seen so far, best first: their ``batch``, ``step_s`` and
    ``peak_bytes`` (``(k,)``), ``marginal`` mask and ``index`` (position in the full enumeration,
    :meth:`autopar.search.cells.SpaceCells.full_index`)."""

    batch: LayoutBatch
    step_s: np.ndarray
    peak_bytes: np.ndarray
    marginal: np.ndarray
    index: np.ndarray

    def take(self, rows: np.ndarray) -> "Ranked":
        """The entries at ``rows``."""
        return Ranked(self.batch.take(rows), self.step_s[rows], self.peak_bytes[rows], self.marginal[rows],
                      self.index[rows])

    def order(self) -> np.ndarray:
        """The entries' ranking (see the module docstring): comfortable before marginal, then by
        step time to the microsecond, then simplest, then first enumerated."""
        ties = tuple(getattr(self.batch, name) for name in reversed(SIMPLICITY_ORDER))  # last key sorts first
        return np.lexsort((self.index,) + ties + (np.round(self.step_s, 6), self.marginal))

    @staticmethod
    def concat(parts: list["Ranked"]) -> "Ranked":
        """The entries of ``parts`` one after the other."""
        return Ranked(LayoutBatch.concat([r.batch for r in parts]), *(np.concatenate([getattr(r, name) for r in parts])
                      for name in ("step_s", "peak_bytes", "marginal", "index")))

    @staticmethod
    def merge(a: "Ranked | None", b: "Ranked", keep: int) -> "Ranked":
        """The first ``keep`` entries of ``a`` and ``b`` together, best first."""
        if a is not None:
            b = Ranked.concat([a, b])
        return b.take(b.order()[:keep])


def _shortlist(fit: np.ndarray, rounded_s: np.ndarray, marginal: np.ndarray, keep: int) -> np.ndarray:
    """Of the fitting rows ``fit``, those that can be among the first ``keep`` by (marginal,
    rounded step time): every row at or before the ``keep``-th smallest such pair (ties
    included, so the later sort decides among them)."""
    if len(fit) <= keep:
        return fit
    comfortable, tight = fit[~marginal[fit]], fit[marginal[fit]]
    if len(comfortable) >= keep:
        bound = np.partition(rounded_s[comfortable], keep - 1)[keep - 1]
        return comfortable[rounded_s[comfortable] <= bound]
    left = keep - len(comfortable)
    bound = np.partition(rounded_s[tight], left - 1)[left - 1]
    return np.sort(np.concatenate([comfortable, tight[rounded_s[tight] <= bound]]))


BOUND_SLACK_S = 1e-5  # a lower bound this far above the last kept step time rules a layout out despite rounding


def _bound(top: Ranked | None, keep: int, marginal_bytes: float) -> Bound | None:
    """Which fitting layouts can still enter a full running top of ``keep``: those that would not
    rank after its last entry (:meth:`Ranked.order`), judged by their peak (marginal above
    ``marginal_bytes``) and a lower bound of their step time
    (:func:`autopar.cost.step.step_lower_bound_s`): a layout is ruled out when it is marginal and
    the last entry is not, or when both are alike and its bound exceeds the last entry's step
    time by more than :data:`BOUND_SLACK_S` (rounding to the microsecond cannot bring it back)."""
    if top is None or len(top.index) < keep:
        return None
    last_marginal, last_s = bool(top.marginal[-1]), float(top.step_s[-1])

    def bound(peak_bytes: np.ndarray, lower_bound_s: np.ndarray) -> np.ndarray:
        marginal = peak_bytes > marginal_bytes
        later = lower_bound_s > last_s + BOUND_SLACK_S
        return ~(later & (marginal == last_marginal)) if last_marginal else ~(marginal | later)

    return bound


@dataclass
class Streamed:
    """The outcome of :func:`stream_costs`: the first ``keep`` fitting layouts (``top``, None if
    none fits), whether there are more (``truncated``), the counts of fitting and marginal
    layouts, and the lightest layout (a batch of one) with its peak (bytes)."""

    top: Ranked | None
    truncated: bool
    fitting: int
    marginal: int
    lightest: LayoutBatch
    lightest_peak_bytes: float


def _known(top: Ranked | None, seeds: Ranked | None, keep: int) -> Ranked | None:
    """The first ``keep`` of the layouts in ``top`` and ``seeds`` (each once): fitting layouts
    already costed, whose ``keep``-th bounds what can still enter the top."""
    parts = [r for r in (top, seeds) if r is not None]
    if len(parts) < 2:
        return parts[0] if parts else None
    both = Ranked.concat(parts)
    return Ranked.merge(None, both.take(np.sort(np.unique(both.index, return_index=True)[1])), keep)


class _Timer:
    """Times fitting layouts (:class:`Cells`) and ranks them: their stage views' floors and
    times in turn, each ruling out what cannot enter the running top (``bound``), then the
    data-parallel and optimizer terms and the step (:func:`autopar.search.cell_costs.time_rows`)."""

    def __init__(self, p: Problem, cells: SpaceCells, reads: Reads, floor_factors: frozenset[str],
                 time_factors: frozenset[str], margin_bytes: float, keep: int, once: RowTerms) -> None:
        self.p, self.cells, self.reads, self.keep, self.margin_bytes = p, cells, reads, keep, margin_bytes
        self.floor_factors, self.time_factors, self.once = floor_factors, time_factors, once

    def __call__(self, rows: Cells, peak: np.ndarray, bound: Bound | None,
                 floor_total: np.ndarray | None = None) -> tuple[Ranked | None, Cells, np.ndarray]:
        """The first ``keep`` of ``rows`` (peaks ``peak``; ``floor_total``: their first stage's
        floor per micro-batch) in ranking order among those ``bound`` keeps, and the rows timed
        in full with their step times."""
        p, cells, once = self.p, self.cells, self.once
        if bound is not None and len(rows):  # the makespan of the stages' floors
            values = view_values(cells, rows, self.floor_factors,
                                 lambda b, s: T.stage_time(p, b, s, floor=True, once=once).total_s, first=1)
            floors = full_views(cells, rows, [floor_total] + values[1:])
            kept = np.flatnonzero(bound(peak, makespan_bound(p, cells, rows, floors)))
            rows, peak = rows.take(kept), peak[kept]
        if not len(rows):
            return None, rows, np.zeros(0)
        times = view_values(cells, rows, self.time_factors, lambda b, s: T.stage_time(p, b, s, once=once))
        if bound is not None:  # the makespan of the stages' times
            totals = full_views(cells, rows, [None if t is None else t.total_s for t in times])
            kept = np.flatnonzero(bound(peak, makespan_bound(p, cells, rows, totals)))
            if len(kept) < len(rows):
                times = [None if t is None else take_time(t, np.flatnonzero(np.isin(own, kept)))
                         for t, own in zip(times, own_views(cells, rows))]
                rows, peak = rows.take(kept), peak[kept]
            if not len(rows):
                return None, rows, np.zeros(0)
        step = time_rows(p, cells, self.reads, rows, peak, times).step_time_s
        marginal = peak > self.margin_bytes
        short = _shortlist(np.arange(len(rows)), np.round(step, 6), marginal, self.keep)
        chosen = rows.take(short)
        return Ranked(cells.rows(chosen), step[short], peak[short], marginal[short], cells.full_index(chosen)), rows, step


def stream_costs(p: Problem, count: SpaceCount, memory_margin: float, keep: int) -> Streamed:
    """Cost the valid layouts of ``count`` and keep the first ``keep`` fitting ones in ranking
    order (see the module docstring)."""
    capacity = p.cluster.device.memory_bytes
    margin_bytes = (1 - memory_margin) * capacity
    cells = SpaceCells(p, count)
    reads = Reads(p, cells)
    time_factors = reads("stage_time", lambda b, s: T.stage_time(p, b, s))
    floor_factors = time_factors - {"recompute"}  # the floor overwrites the recompute columns
    once = RowTerms(reads.batch)
    timer = _Timer(p, cells, reads, floor_factors, time_factors, margin_bytes, keep, once)
    with phase("cost", total=count.valid, description=f"costing {count.valid:,} valid layouts"):
        memory_factors = frozenset().union(*(reads(name, lambda b, s, fn=fn: fn(p, b, s))
                                             for name, fn in MEMORY_TERMS.items()))
        memory = memory_pass(p, cells, reads, capacity, margin_bytes, [floor_factors & memory_factors])

        def fitting(rows: Cells) -> tuple[Cells, np.ndarray]:
            peak = memory.peak_bytes[cells.index(rows, memory.factors, memory.starts)]
            fits = np.flatnonzero(peak <= capacity)
            return rows.take(fits), peak[fits]

        if not memory.fitting:
            return Streamed(None, False, 0, 0, cells.rows(memory.lightest), memory.lightest_peak_bytes)
        if keep >= count.valid:  # everything kept: no bound, one sort at the end
            every = []
            for chunk in block_chunks(count.valid_per_block, np.flatnonzero(count.valid_per_block), CHUNK_ROWS):
                found, _, _ = timer(*fitting(cells.cells(chunk, ALL)), None)
                every += [found] if found is not None else []
            top = Ranked.merge(None, Ranked.concat(every), keep) if every else None
            return Streamed(top, memory.fitting > keep, memory.fitting, memory.marginal, cells.rows(memory.lightest),
                            memory.lightest_peak_bytes)
        floors = floor_pass(p, cells, floor_factors, memory, once)
        floor, floor_starts = floors.floor, cells.starts(floor_factors)
        # Seeds: every fitting layout of each block's least-floor cell, timed in full. Their steps
        # order the blocks (likely best first), and their keep-th rules layouts out from the start.
        seeds, seeded, seed_step = timer(*fitting(cells.expand(floors.least, floor_factors)[1]), None)
        guess = np.full(cells.n_blocks, np.inf)
        np.minimum.at(guess, seeded.block, seed_step)
        order = np.flatnonzero(np.isfinite(floors.block_floor))
        order = order[np.lexsort((floors.block_floor[order], guess[order]))]
        top, at, limit = None, 0, FIRST_CHUNK_ROWS
        while at < len(order):
            known = _known(top, seeds, keep)
            bound = _bound(known, keep, margin_bytes)
            ruled_out = float(known.step_s[-1]) + BOUND_SLACK_S if bound is not None and not known.marginal[-1] \
                else np.inf
            chunk, size = [], 0
            while at < len(order) and size < limit:  # the next blocks whose least floor can enter the top
                b = int(order[at])
                at += 1
                if floors.block_floor[b] <= ruled_out:
                    chunk.append(b)
                    size += int(count.valid_per_block[b])
            if not chunk:
                break
            limit = min(2 * limit, CHUNK_ROWS)
            candidates = cells.cells(np.asarray(chunk, dtype=np.int64), floor_factors)
            lower = floor[cells.index(candidates, floor_factors, floor_starts)]
            candidates = candidates.take(np.flatnonzero(np.isfinite(lower) & (lower <= ruled_out)))
            rows, peak = fitting(cells.expand(candidates, floor_factors)[1])
            at_floor = cells.index(rows, floor_factors, floor_starts)
            if bound is not None:  # the first stage's floor
                kept = np.flatnonzero(bound(peak, floor[at_floor]))
                rows, peak, at_floor = rows.take(kept), peak[kept], at_floor[kept]
            found, _, _ = timer(rows, peak, bound, floors.total[at_floor])
            if found is not None:
                top = Ranked.merge(top, found, keep)
    return Streamed(top, memory.fitting > keep, memory.fitting, memory.marginal, cells.rows(memory.lightest),
                    memory.lightest_peak_bytes)
