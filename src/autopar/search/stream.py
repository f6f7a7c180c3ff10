"""The search's grid stage streamed block by block: peak memory tracks one chunk, not the space.

:func:`autopar.search.valid_space.count_space` counts the space exactly without building a row;
the valid layouts are then built, costed (:func:`autopar.search.costing.search_costs`) and ranked
a chunk of blocks at a time (:data:`CHUNK_ROWS` valid layouts or one block), and only a running
top of the fitting layouts is kept, with the counts (fitting, marginal, out of memory) and the
lightest layout (for the "nothing fits" error).

Exactness: the full grid ranks the fitting rows by (marginal, step time rounded to the
microsecond, :data:`autopar.strategy.SIMPLICITY_ORDER` from the last field, row index) with a
stable lexicographic sort (:func:`autopar.search.grid.costed_grid`). The same key with the row's
index in the whole valid batch (chunk offset + row in chunk) orders any subset as the whole
does, so the first ``keep`` rows of the merge of each chunk's first ``keep`` rows are the first
``keep`` of the whole order. The costs are row-wise, so a chunk's numbers are the whole batch's.
A walk that needs more than ``keep`` rows (many layouts the target cannot write) is redone with
a larger ``keep`` by the caller (:func:`autopar.search.grid.search`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from autopar.cost.step import StepCosts
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.progress import advance, phase
from autopar.search.costing import Bound, search_costs
from autopar.search.valid_space import SpaceCount, valid_block_rows
from autopar.space import batch_of
from autopar.strategy import SIMPLICITY_ORDER

CHUNK_ROWS = 1 << 16  # valid layouts costed at once: ~64k rows keep a chunk's arrays in the CPU caches
KEEP = 1024  # fitting layouts kept in ranking order (the walk of `search._top` rarely goes past a few dozen)


@dataclass
class Ranked:
    """The best fitting layouts seen so far, best first: their ``batch``, ``step_s`` and
    ``peak_bytes`` (``(k,)``), ``marginal`` mask and ``index`` into the whole valid batch."""

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


def _chunks(count: SpaceCount) -> Iterator[list[int]]:
    """The blocks with valid layouts, in order, grouped into chunks of about :data:`CHUNK_ROWS` rows."""
    chunk, rows = [], 0
    for b in np.flatnonzero(count.valid_per_block):
        chunk.append(int(b))
        rows += int(count.valid_per_block[b])
        if rows >= CHUNK_ROWS:
            yield chunk
            chunk, rows = [], 0
    if chunk:
        yield chunk


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


def stream_costs(p: Problem, count: SpaceCount, memory_margin: float, keep: int) -> Streamed:
    """Cost the valid layouts of ``count`` chunk by chunk and keep the first ``keep`` fitting
    ones in ranking order (see the module docstring)."""
    capacity = p.cluster.device.memory_bytes
    reads: dict = {}  # which factors each cost term reads, found once for every chunk
    top, fitting, marginal_total, offset = None, 0, 0, 0
    every: list[Ranked] = []
    lightest, lightest_peak = None, np.inf
    with phase("cost", total=count.valid, description=f"costing {count.valid:,} valid layouts"):
        for chunk in _chunks(count):
            parts = [valid_block_rows(count, b) for b in chunk]
            batch = batch_of(p, np.concatenate([rows for rows, _ in parts]))
            costs: StepCosts = search_costs(p, batch, capacity, np.concatenate([keys for _, keys in parts]), reads,
                                            _bound(top, keep, (1 - memory_margin) * capacity))
            peak = costs.peak_memory_bytes
            light = int(np.argmin(peak))
            if peak[light] < lightest_peak:
                lightest, lightest_peak = batch.take(np.asarray([light])), float(peak[light])
            fits = peak <= capacity
            marginal = fits & (peak > (1 - memory_margin) * capacity)
            fit = np.flatnonzero(fits)
            fitting += len(fit)
            marginal_total += int(marginal.sum())
            step = costs.step_time_s
            timed = fit[np.isfinite(step[fit])]  # the others cannot enter the top (_bound)
            if len(timed):
                rows = _shortlist(timed, np.round(step, 6), marginal, keep)
                found = Ranked(batch.take(rows), step[rows], peak[rows], marginal[rows], offset + rows)
                if keep >= count.valid:  # everything kept: one sort at the end
                    every.append(found)
                else:
                    top = Ranked.merge(top, found, keep)
            offset += len(batch)
            advance(len(batch))
    if every:
        top = Ranked.merge(None, Ranked.concat(every), keep)
    assert lightest is not None  # count.valid > 0: the caller refuses an empty space first
    return Streamed(top, fitting > keep, fitting, marginal_total, lightest, lightest_peak)
