"""The streamed search's costing passes over cells (:mod:`autopar.search.cells`).

* :func:`memory_pass`: the peak memory of every valid layout, costed per cell of the memory terms
  (:func:`autopar.cost.memory.stage_state`, :func:`~autopar.cost.memory.stage_activation_bytes`,
  :func:`~autopar.cost.memory.stage_buffers`, each once per distinct value of what it reads) on the
  bounding stage views that are stages of their own, summed by
  :func:`autopar.cost.memory.assemble_memory` per *memory cell* (a distinct value of every factor
  a memory term reads: the layouts of a cell differ only in factors no memory term reads, e.g. the
  CP algorithm, and share its peak), the blocks of one grid shape at once by broadcasting each
  term's grid of cells to the memory cells' (no per-cell gather of every term); the counts of
  fitting and marginal layouts are the cells' counts times how many layouts each stands for.
* :func:`floor_pass`: a lower bound of the step time of every layout, the number of micro-batches
  times the first stage's time floor over every recompute setting
  (:func:`autopar.cost.stage_time.stage_time` with ``floor``), costed once per cell of what the
  stage time reads less the recompute option, for the cells holding a fitting layout.
* :func:`time_rows`: the step costs of chosen fitting layouts, each term costed once per distinct
  cell of what it reads, combined by :func:`autopar.cost.step.combine` as
  :func:`autopar.search.costing.search_costs` combines them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from autopar.cost import stage_time as T
from autopar.cost.memory import activation_parts, assemble_memory, stage_activation_bytes, stage_buffers, stage_state
from autopar.cost.step import StepCosts, makespan_lower_bound_s, step_lower_bound_s, view_time
from autopar.problem import Problem
from autopar.progress import advance
from autopar.search.cells import Cells, SpaceCells, scatter
from autopar.search.costing import _own_rows, combine_views, spread_views
from autopar.search.distinct_rows import ColumnsOnce, RowTerms
from autopar.search.valid_space import _factors_read
from autopar.space import FACTORS

CHUNK_CELLS = 1 << 17  # memory cells costed at once (about 1 MiB per array): RSS stays flat as the space grows
FLOOR_CELLS = 1 << 15  # floor cells costed at once
_SAMPLE_BLOCKS = 6  # blocks the column recorder samples layouts from (spread over the space)
_SAMPLE_PER_BLOCK = 48  # layouts per sampled block
ALL = frozenset(FACTORS)

MEMORY_TERMS = {"state": stage_state, "activations": stage_activation_bytes, "buffers": stage_buffers}
# Terms whose stage-independent part is costed once per cell and handed to every view (``parts=``).
MEMORY_PARTS = {"activations": activation_parts}


class Reads:
    """Which factors each cost term reads (name -> frozenset), found once per search by running
    the term on a sample of layouts spread over the space (every view, so branches taken on any
    stage are seen) against the column recorder (:func:`autopar.search.valid_space._factors_read`)."""

    def __init__(self, p: Problem, cells: SpaceCells) -> None:
        self.p, self.cells = p, cells
        self._known: dict[str, frozenset[str]] = {}
        valid = np.flatnonzero(cells.count.valid_per_block)
        picked = valid[np.unique(np.linspace(0, len(valid) - 1, _SAMPLE_BLOCKS).round().astype(np.int64))]
        sample = cells.cells(picked, ALL)
        spread = [np.flatnonzero(sample.block == b) for b in picked]
        rows = np.concatenate([at[np.unique(np.linspace(0, len(at) - 1, _SAMPLE_PER_BLOCK).round().astype(np.int64))]
                               for at in spread])
        self.sample = sample.take(rows)
        self.batch = cells.rows(self.sample)  # the sample's rows

    def __call__(self, name: str, fn) -> frozenset[str]:
        """The factors ``fn(rows, stages)`` (known as ``name``) reads."""
        if name not in self._known:
            read: frozenset[str] = frozenset()
            for view in range(3):
                stages = self.cells.stages(self.sample, view)
                read |= _factors_read(lambda b, s=stages: fn(b, s), self.batch)
            self._known[name] = read
        return self._known[name]


@dataclass
class MemoryPass:
    """What :func:`memory_pass` found: each memory cell's peak (``peak_bytes``, cells of
    ``factors`` listed from ``starts``), the counts of fitting and marginal layouts, the lightest
    layout (a :class:`Cells` of one) and its peak, and for each factor set asked for, which of its
    cells hold a fitting layout (``fit_any``: set -> bool per cell, listed from :meth:`SpaceCells.starts`)."""

    factors: frozenset[str]
    starts: np.ndarray
    peak_bytes: np.ndarray
    fitting: int
    marginal: int
    lightest: Cells
    lightest_peak_bytes: float
    fit_any: dict[frozenset[str], np.ndarray]


def block_chunks(sizes: np.ndarray, blocks: np.ndarray, limit: int) -> list[np.ndarray]:
    """``blocks`` in order, grouped so each group holds about ``limit`` of ``sizes`` (per block)."""
    out, chunk, total = [], [], 0
    for b in blocks:
        chunk.append(int(b))
        total += int(sizes[b])
        if total >= limit:
            out.append(np.asarray(chunk, dtype=np.int64))
            chunk, total = [], 0
    if chunk:
        out.append(np.asarray(chunk, dtype=np.int64))
    return out


def _view_values(p: Problem, cells: SpaceCells, chunk: np.ndarray, term_reads: dict[str, frozenset[str]],
                 parts: dict[str, ColumnsOnce]) -> dict:
    """Each memory term on each bounding view where it is a stage of its own (view 1 where pp >= 3,
    view 2 where pp >= 2, :func:`own_views`), once per cell of what the term reads in the blocks
    ``chunk`` (the stage-independent ``parts`` of a term once per distinct value of the columns
    they read): (name, view) -> (the term's values over those cells, where each block's cells
    start among them (``(blocks,)``))."""
    out = {}
    for name, fn in MEMORY_TERMS.items():
        factors = term_reads[name]
        tc = cells.cells(chunk, factors)
        rows = cells.rows(tc)
        shared = parts[name](rows) if name in parts else None
        sizes = cells.sizes(factors)
        pp = cells.scalars[chunk, 2]
        for view, own in enumerate(own_views(cells, tc)):
            if not len(own):
                continue
            members = chunk[pp >= (1, 3, 2)[view]]  # in the order of chunk, as the cells are listed
            starts = np.zeros(cells.n_blocks, dtype=np.int64)
            starts[members] = np.concatenate([[0], np.cumsum(sizes[members])[:-1]])
            if own[-1] - own[0] + 1 == len(own):  # a run of cells (see memory_pass): views, not copies
                own = slice(int(own[0]), int(own[-1]) + 1)
            extra = {} if shared is None else {"parts": shared if view == 0 else shared.take(own)}
            at = tc if view == 0 else tc.take(own)
            value = fn(p, rows if view == 0 else rows.take(own), cells.stages(at, view), **extra)
            out[name, view] = (value, starts)
    return out


def memory_pass(p: Problem, cells: SpaceCells, reads: Reads, capacity_bytes: float, marginal_bytes: float,
                fit_sets: list[frozenset[str]]) -> MemoryPass:
    """The peak of every memory cell and the counts (see the module docstring); ``fit_sets``:
    factor sets whose cells holding a fitting layout the later passes need. Each term is costed
    per cell of what it reads (:func:`_view_values`); blocks of one grid shape (the same number of
    cells of each term along each factor group, the same views) are summed at once by broadcasting
    the terms' grids (:meth:`SpaceCells.grid_index`) to the memory cells' grid."""
    term_reads = {name: reads(name, lambda b, s, fn=fn: fn(p, b, s)) for name, fn in MEMORY_TERMS.items()}
    once = {name: ColumnsOnce(lambda b, fn=fn: fn(p, b), reads.batch) for name, fn in MEMORY_PARTS.items()}
    factors = frozenset().union(*term_reads.values())
    starts, sizes = cells.starts(factors), cells.sizes(factors)
    peak_all = np.empty(int(sizes.sum()))
    fit_starts = {s: cells.starts(s) for s in fit_sets}
    fit_any = {s: np.zeros(int(cells.sizes(s).sum()), dtype=bool) for s in fit_sets}
    fitting = marginal = 0
    n_groups = len(cells.count.groups)
    pp = cells.scalars[:, 2]
    in_view = [np.ones(cells.n_blocks, dtype=bool), pp >= 3, pp >= 2]
    # The views first: sorted by shape, a chunk's blocks where view 1 or 2 is a stage come last.
    shape_of = np.stack(in_view[:0:-1] + [cells.projection(g, f).sizes for f in (factors, *term_reads.values())
                                          for g in range(n_groups)], axis=1)
    nonempty = np.flatnonzero(sizes)
    _, kind = np.unique(shape_of[nonempty], axis=0, return_inverse=True)
    by_shape = nonempty[np.argsort(kind.ravel(), kind="stable")]  # few shapes per chunk: few grids to sum
    for chunk in block_chunks(sizes, by_shape, CHUNK_CELLS):
        values = _view_values(p, cells, chunk, term_reads, once)
        _, kind = np.unique(shape_of[chunk], axis=0, return_inverse=True)
        for k in range(int(kind.max()) + 1):
            blocks = chunk[kind.ravel() == k]
            shape = cells.grid_shape(blocks, factors)
            peak = None
            for view in range(3):
                if not in_view[view][blocks[0]]:
                    continue
                parts = [scatter(values[name, view][0], cells.grid_index(blocks, factors, r, values[name, view][1]))
                         for name, r in term_reads.items()]
                total = assemble_memory(p, *parts).total_bytes
                peak = total if peak is None else np.maximum(peak, total)
            peak = np.broadcast_to(peak, shape)
            weight = np.broadcast_to(cells.grid_multiplicity(blocks, factors), shape)
            fits = peak <= capacity_bytes
            fitting += int(weight[fits].sum())
            marginal += int(weight[fits & (peak > marginal_bytes)].sum())
            peak_all[starts[blocks][:, None] + np.arange(int(np.prod(shape[1:])))] = peak.reshape(len(blocks), -1)
            for s in fit_sets:
                fit_any[s][np.broadcast_to(cells.grid_index(blocks, factors, s, fit_starts[s]), shape)[fits]] = True
        advance(int(cells.count.valid_per_block[chunk].sum()))
    light = float(peak_all.min())  # ties: the first in the full enumeration
    ties = cells.cells_at(factors, np.flatnonzero(peak_all == light))
    lightest = ties.take(np.asarray([int(np.argmin(cells.full_index(ties)))]))
    return MemoryPass(factors, starts, peak_all, fitting, marginal, lightest, light, fit_any)


def microbatches(p: Problem, cells: SpaceCells, c: Cells) -> np.ndarray:
    """Micro-batches per step of each layout of ``c``: ``gbs // (mbs * dp)`` as
    :func:`autopar.space.batch_of` sets them."""
    mbs = cells.tables["mbs"][cells.table_starts["mbs"][c.block] + cells.factor_index(c)["mbs"], 0]
    return p.train.global_batch_size // (mbs * cells.scalars[c.block, 0])


@dataclass
class FloorPass:
    """What :func:`floor_pass` found: each cell's step-time floor (``floor``, s, listed from
    :meth:`SpaceCells.starts`; ``inf`` where the cell holds no fitting layout), each block's least
    (``block_floor``, ``(blocks,)``) and the cell holding it (``least``, one per block that has one)."""

    floor: np.ndarray
    block_floor: np.ndarray
    least: Cells
    total: np.ndarray  # per cell: the first stage's floor per micro-batch (s)


def floor_pass(p: Problem, cells: SpaceCells, factors: frozenset[str], memory: MemoryPass,
               once: RowTerms) -> FloorPass:
    """The step-time floor (s) of each cell of ``factors`` (what the stage time reads less the
    recompute option) that holds a fitting layout: :func:`autopar.cost.step.step_lower_bound_s`
    of the first stage's :func:`~autopar.cost.stage_time.stage_time` floor over every recompute
    setting, its pure row terms costed once per distinct value of what they read (``once``)."""
    sizes = cells.sizes(factors)
    floor = np.full(int(sizes.sum()), np.inf)
    total = floor.copy()
    shared = factors & memory.factors
    fit_any, fit_starts = memory.fit_any[shared], cells.starts(shared)
    starts = cells.starts(factors)
    for chunk in block_chunks(sizes, np.flatnonzero(sizes), FLOOR_CELLS):
        c = cells.cells(chunk, factors)
        keep = np.flatnonzero(fit_any[cells.index(c, shared, fit_starts)])
        if not len(keep):
            continue
        c = c.take(keep)
        t = T.stage_time(p, cells.rows(c), cells.stages(c, 0), floor=True, once=once)
        total[starts[chunk[0]] + keep] = t.total_s
        floor[starts[chunk[0]] + keep] = step_lower_bound_s(microbatches(p, cells, c), t)
    # Each block's least floor (its cells are contiguous from ``starts``) and the first cell holding it.
    nonempty = np.flatnonzero(sizes)
    block_floor = np.full(cells.n_blocks, np.inf)
    if len(nonempty):
        block_floor[nonempty] = np.minimum.reduceat(floor, starts[nonempty])
    owner = np.repeat(np.arange(cells.n_blocks), sizes)
    at_least = np.flatnonzero(floor == block_floor[owner])
    least = at_least[np.concatenate([[True], owner[at_least][1:] != owner[at_least][:-1]])] if len(at_least) \
        else at_least
    least = least[np.isfinite(floor[least])]
    return FloorPass(floor, block_floor, cells.cells_at(factors, least), total)


def take_time(t: T.StageTime, index: np.ndarray) -> T.StageTime:
    """The rows of ``t`` at ``index``."""
    return T.StageTime(**{f.name: getattr(t, f.name)[index] for f in fields(T.StageTime)})


def own_views(cells: SpaceCells, c: Cells) -> list[np.ndarray]:
    """For each bounding view, the entries of ``c`` on which it is a stage of its own (see
    :func:`autopar.search.costing._own_rows`): view 0 everywhere, view 1 where pp >= 3, view 2
    where pp >= 2."""
    pp = cells.scalars[c.block, 2]
    return [np.arange(len(c)), np.flatnonzero(pp >= 3), np.flatnonzero(pp >= 2)]


def view_values(cells: SpaceCells, c: Cells, factors: frozenset[str], fn, first: int = 0) -> list:
    """``fn(rows, stages)`` for each view from ``first`` on, on the entries of ``c`` where the
    view is a stage of its own (:func:`own_views`), once per distinct cell of ``factors``, all
    views in one call (:meth:`SpaceCells.evaluate_views`); None for the views before ``first``
    or without such entries."""
    return cells.evaluate_views([c.take(own) if view >= first and len(own) else None
                                 for view, own in enumerate(own_views(cells, c))], factors, fn)


def full_views(cells: SpaceCells, c: Cells, own_values: list[np.ndarray]) -> list[np.ndarray]:
    """Full-length ``(n,)`` values of the three views from each view's values on its own entries
    (:func:`own_views`; view 0's given for every entry): where pp = 1 views 1 and 2 are view 0,
    where pp = 2 view 1 is view 2 (:func:`autopar.search.costing.spread_views`)."""
    return spread_views(own_views(cells, c), own_values)


def makespan_bound(p: Problem, cells: SpaceCells, c: Cells, totals: list[np.ndarray]) -> np.ndarray:
    """:func:`autopar.cost.step.makespan_lower_bound_s` of the layouts ``c`` from their three
    views' per-micro-batch ``totals`` (full length). The streamed layouts have the default
    schedules (1F1B or interleaved): V schedules are added after the blocks
    (:mod:`autopar.v_space`) and costed through the whole batch."""
    pp, vpp = cells.scalars[c.block, 2], cells.scalars[c.block, 3]
    counts = [np.ones(len(c)), np.where(pp >= 3, pp - 2, 0), np.where(pp >= 2, 1, 0)]  # as view_counts
    return makespan_lower_bound_s(microbatches(p, cells, c), pp, vpp, counts, totals)


def time_rows(p: Problem, cells: SpaceCells, reads: Reads, c: Cells, peak_bytes: np.ndarray,
              times: list[T.StageTime | None]) -> StepCosts:
    """Step costs of the fitting layouts ``c`` (peaks ``peak_bytes``; ``times``: each view's
    stage times on the layouts where it is a stage of its own, :func:`own_views`): the exposed
    data-parallel and optimizer times of each view (:func:`view_time`, every term once per
    distinct cell of what it reads, the three views in one call), combined as
    :func:`autopar.search.costing.search_costs` combines them."""
    batch = cells.rows(c)
    own = _own_rows(batch)
    subs = [c.take(rows) for rows in own]
    values: dict[str, list] = {}  # each term on every view, costed in one call at its first request

    def run(name, fn, view):
        if name not in values:  # fn reads only its (rows, stages) arguments, the same on every view
            values[name] = cells.evaluate_views(subs, reads(name, fn), fn)
        return values[name][view]

    parts = [view_time(p, batch.take(rows), cells.stages(sub, view), lambda name, fn, view=view: run(name, fn, view),
                       times[view]) for view, (rows, sub) in enumerate(zip(own, subs))]
    return combine_views(p, batch, parts, peak_bytes)
