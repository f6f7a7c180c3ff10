"""The search's valid layouts as products of factor groups, costed once per cell of what a term reads.

:func:`autopar.search.valid_space.count_space` finds, per block, the joint values of each factor
group that pass every check, and a block's valid layouts are the product of those values (in the
full enumeration's order where the groups follow :data:`autopar.space.FACTORS`). A cost term
reads only some factors (:func:`autopar.search.valid_space._factors_read`: the stage time does
not read the ZeRO stage, the buffers read only mbs and the TP modes), so it is costed once per
*cell*: one distinct value, within a block, of the factors it reads. Per group, a term reading
every factor of the group has one cell per passing joint value, one reading none has one, and one
reading some has one per distinct projection of the passing values (:class:`Projection`).

A set of layouts or cells is a :class:`Cells`: each one's block and, per group, the position of a
joint value among the group's passing values. Any term's cell of any such set follows by index
arithmetic (:meth:`SpaceCells.index`), so a term is evaluated on its own cells only and its
values are spread to the layouts by gathering; no layout's row is built unless it is needed.
The cost functions are row-wise (a row's numbers depend on its own columns and stage), so the
gathered numbers are those a pass over every layout gives.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.cost.stage import Stages, bounding_stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.search.valid_space import SpaceCount, _mixed_radix
from autopar.space import FACTORS, assemble, batch_of

_DENSE_PER_ROW = 8  # codes ranging up to this many per row are made dense with a table, wider ones by sorting


@dataclass
class Projection:
    """A factor group's passing joint values seen through some of its factors. Per block: how many
    distinct projections it has (``sizes``, ``(blocks,)``) and where its projections start in
    ``first`` / ``count`` (``starts``, ``(blocks + 1,)``). Per passing joint value (positions as
    in :attr:`SpaceCount.passing`): its projection's rank within its block (``code``). Per
    projection: the position of its first joint value (``first``) and how many share it (``count``)."""

    sizes: np.ndarray
    starts: np.ndarray
    code: np.ndarray
    first: np.ndarray
    count: np.ndarray

    identity: bool = False  # every joint value is a projection of its own (first = positions, count = 1)

    @property
    def trivial(self) -> bool:
        """Whether every block has one projection at most (the group adds no axis)."""
        return bool(np.all(self.sizes <= 1))


@dataclass
class Cells:
    """Layouts or cells of a search's space: each one's block (``block``, ``(m,)``, index into
    :attr:`SpaceCount.blocks`) and per factor group (:attr:`SpaceCount.groups`) the position of
    its joint value among the group's passing values (``pos``, one ``(m,)`` array per group)."""

    block: np.ndarray
    pos: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.block)

    def take(self, index: np.ndarray) -> "Cells":
        """The entries at ``index`` (boolean mask or integer indices)."""
        return Cells(self.block[index], [q[index] for q in self.pos])


def one_of_each(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For integer codes: the position of one entry of each distinct code (in increasing code
    order) and each entry's index into those positions."""
    if not len(code):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low, high = int(code.min()), int(code.max())
    if high - low + 1 > max(_DENSE_PER_ROW * len(code), 1 << 16):
        _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    at = np.full(high - low + 1, -1, dtype=np.int64)
    at[code - low] = np.arange(len(code))
    present = at >= 0
    return at[present], (np.cumsum(present) - 1)[code - low]


def scatter(value: Any, inverse: np.ndarray) -> Any:
    """``value`` (an array, or a dataclass of arrays, over distinct cells) spread to every entry
    (``inverse``: each entry's cell)."""
    if isinstance(value, np.ndarray):
        return value[inverse] if value.ndim else np.broadcast_to(value, inverse.shape)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: scatter(getattr(value, f.name), inverse)
                                             for f in dataclasses.fields(value)
                                             if isinstance(getattr(value, f.name), np.ndarray)})
    return value


class SpaceCells:
    """The product structure of one search's valid layouts (``count``, :func:`count_space`) and
    the tables that turn cells into rows: per block its factor tables and scalars, its bounding
    stage views (:func:`autopar.cost.stage.bounding_stages`, which read only the block) and the
    strides of the full enumeration (a layout's position in :func:`autopar.space.enumerate_layouts`)."""

    def __init__(self, p: Problem, count: SpaceCount) -> None:
        self.p, self.count = p, count
        blocks = count.blocks
        self.n_blocks = len(blocks)
        self._projections: dict[tuple[int, tuple[str, ...]], Projection] = {}
        self._member_lists: dict[tuple[int, tuple[str, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._index_plans: dict[frozenset[str], list] = {}
        self._passing_tables: dict[int, dict[str, np.ndarray]] = {}
        self._rows_plan: list[tuple[int, np.ndarray]] | None = None
        self.scalars = np.stack([b.scalars for b in blocks]).reshape(-1, 6)
        self.tables, self.table_starts = {}, {}
        for f in FACTORS:
            lengths = [len(b.values[f]) for b in blocks]
            self.tables[f] = np.concatenate([b.values[f] for b in blocks])
            self.table_starts[f] = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        dims = np.array([[len(b.values[f]) for f in FACTORS] for b in blocks], dtype=np.int64).reshape(-1, len(FACTORS))
        self.full_strides = np.concatenate([np.cumprod(dims[:, :0:-1], axis=1)[:, ::-1],
                                            np.ones((len(dims), 1), dtype=np.int64)], axis=1)
        sizes = np.prod(dims, axis=1)
        self.full_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        first = {f: np.zeros(self.n_blocks, dtype=np.int64) for f in FACTORS}
        self.views = bounding_stages(p, batch_of(p, self._assemble(np.arange(self.n_blocks), first)))

    # -- projections and cells ---------------------------------------------------------------

    def projection(self, g: int, factors: frozenset[str]) -> Projection:
        """Group ``g``'s passing joint values seen through ``factors`` (see :class:`Projection`)."""
        group = self.count.groups[g]
        own = tuple(f for f in group if f in factors)
        key = (g, own)
        if key not in self._projections:
            owner, index = self.count.passing[g]
            bounds = self.count.bounds[g]
            n = np.diff(bounds)
            if len(own) == len(group):  # every joint value is a projection of its own
                self._projections[key] = Projection(n, bounds.astype(np.int64), np.arange(len(owner)) - bounds[owner],
                                                    np.arange(len(owner)), np.ones(len(owner), dtype=np.int64), True)
            elif not own:  # one projection per block that has passing values
                sizes = np.minimum(n, 1)
                self._projections[key] = Projection(sizes, np.concatenate([[0], np.cumsum(sizes)]),
                                                    np.zeros(len(owner), dtype=np.int64), bounds[:-1][n > 0], n[n > 0])
            else:
                columns = [index[f] for f in own]
                dims = [int(c.max()) + 1 for c in columns]
                raw = owner * int(np.prod(dims)) + np.ravel_multi_index(columns, dims)
                unique, first, inverse, counts = np.unique(raw, return_index=True, return_inverse=True,
                                                           return_counts=True)
                sizes = np.bincount(unique // int(np.prod(dims)), minlength=self.n_blocks)
                starts = np.concatenate([[0], np.cumsum(sizes)])
                self._projections[key] = Projection(sizes, starts, inverse.ravel() - starts[owner], first, counts)
        return self._projections[key]

    def _projections_of(self, factors: frozenset[str]) -> list[Projection]:
        return [self.projection(g, factors) for g in range(len(self.count.groups))]

    def sizes(self, factors: frozenset[str]) -> np.ndarray:
        """Cells of ``factors`` per block (``(blocks,)``)."""
        out = (self.count.valid_per_block > 0).astype(np.int64)  # a block failing a block-level check has none
        for pr in self._projections_of(factors):
            out *= pr.sizes
        return out

    def starts(self, factors: frozenset[str], blocks: np.ndarray | None = None) -> np.ndarray:
        """Where each block's cells of ``factors`` start when the cells of ``blocks`` (default:
        all, in order) are listed block after block (:meth:`cells`); ``(blocks,)``, indexed by block."""
        sizes = self.sizes(factors)
        blocks = np.arange(self.n_blocks) if blocks is None else blocks
        out = np.zeros(self.n_blocks, dtype=np.int64)
        out[blocks] = np.concatenate([[0], np.cumsum(sizes[blocks])[:-1]])
        return out

    def cells(self, blocks: np.ndarray, factors: frozenset[str]) -> Cells:
        """Every cell of ``factors`` in ``blocks`` (block indices), block after block, the groups'
        projections in mixed-radix order (the last group fastest); each cell stands for the first
        joint value of its projection."""
        projs = self._projections_of(factors)
        sizes = np.stack([pr.sizes[blocks] for pr in projs], axis=1) if len(blocks) else np.zeros((0, len(projs)))
        owner, digits = _mixed_radix(sizes.astype(np.int64))
        block = np.asarray(blocks, dtype=np.int64)[owner]
        return Cells(block, [pr.starts[block] + digits[:, k] if pr.identity else pr.first[pr.starts[block] + digits[:, k]]
                             for k, pr in enumerate(projs)])

    def index(self, cells: Cells, factors: frozenset[str], starts: np.ndarray) -> np.ndarray:
        """Each entry of ``cells``'s cell of ``factors``: its position among :meth:`cells` of the
        same ``factors`` listed from ``starts`` (:meth:`starts`)."""
        out = starts[cells.block]
        for k, code, stride in self._index_plan(factors):
            digit = code[cells.pos[k]]
            if stride is not None:
                digit *= stride[cells.block]
            out += digit
        return out

    def _index_plan(self, factors: frozenset[str]) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
        """The mixed-radix digits of :meth:`index`: per group adding an axis (last group first),
        its projection codes and each block's stride (``(blocks,)``; None for the fastest axis)."""
        if factors not in self._index_plans:
            plan, stride = [], None
            for k in reversed(range(len(self.count.groups))):
                pr = self.projection(k, factors)
                if pr.trivial:
                    continue
                plan.append((k, pr.code, stride))
                stride = pr.sizes.astype(np.int64) if stride is None else stride * pr.sizes
            self._index_plans[factors] = plan
        return self._index_plans[factors]

    def _members(self, g: int, factors: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
        """Group ``g``'s passing joint values by projection through ``factors``: their positions,
        projection after projection (increasing within one), and where each projection's start."""
        key = (g, tuple(f for f in self.count.groups[g] if f in factors))
        if key not in self._member_lists:
            pr = self.projection(g, factors)
            owner = self.count.passing[g][0]
            self._member_lists[key] = (np.argsort(pr.starts[owner] + pr.code, kind="stable"),
                                  np.concatenate([[0], np.cumsum(pr.count)]))
        return self._member_lists[key]

    def expand(self, cells: Cells, factors: frozenset[str]) -> tuple[np.ndarray, Cells]:
        """The valid layouts in each of ``cells`` (cells of ``factors``): each layout's cell
        (index into ``cells``) and the layouts, cell after cell, each group's joint values of
        the cell's projection in mixed-radix order (the last group fastest)."""
        groups = range(len(self.count.groups))
        projs = self._projections_of(factors)
        at = [pr.starts[cells.block] + pr.code[cells.pos[k]] for k, pr in enumerate(projs)]  # each group's projection
        counts = np.stack([projs[k].count[at[k]] for k in groups], axis=1) if len(cells) else \
            np.zeros((0, len(projs)), dtype=np.int64)
        owner, digits = _mixed_radix(counts)
        pos = []
        for k in groups:
            members, starts = self._members(k, factors)
            pos.append(members[starts[at[k][owner]] + digits[:, k]])
        return owner, Cells(cells.block[owner], pos)

    def multiplicity(self, cells: Cells, factors: frozenset[str]) -> np.ndarray:
        """How many valid layouts each cell of ``factors`` in ``cells`` stands for."""
        out = np.ones(len(cells), dtype=np.int64)
        for k, pr in enumerate(self._projections_of(factors)):
            if not pr.identity:
                out *= pr.count[pr.starts[cells.block] + pr.code[cells.pos[k]]]
        return out

    # -- grids: the cells of blocks of one shape as an array axis per group ------------------

    def grid_shape(self, blocks: np.ndarray, factors: frozenset[str]) -> tuple[int, ...]:
        """``(len(blocks), n_0, ..., n_g)``: the cells of ``factors`` in ``blocks`` as a grid, one
        axis per factor group of its projections (``n_k``, the same in every block given); the grid
        flattened in C order lists each block's cells as :meth:`cells` does."""
        return (len(blocks),) + tuple(int(self.projection(g, factors).sizes[blocks[0]])
                                      for g in range(len(self.count.groups)))

    def _grid_axis(self, blocks: np.ndarray, g: int, factors: frozenset[str], values: np.ndarray,
                   per_projection: bool = False) -> np.ndarray:
        """``values`` (per passing joint value of group ``g``, or per projection of it through
        ``factors``) of each grid cell of ``factors`` (:meth:`grid_shape`) along group ``g``'s
        axis: an array broadcasting to the grid."""
        pr = self.projection(g, factors)
        n = int(pr.sizes[blocks[0]])
        shape = [len(blocks)] + [1] * len(self.count.groups)
        shape[1 + g] = n
        at = pr.starts[blocks][:, None] + np.arange(n)
        return (values[at] if per_projection else values[pr.first[at]]).reshape(shape)

    def grid_index(self, blocks: np.ndarray, within: frozenset[str], factors: frozenset[str],
                   starts: np.ndarray) -> np.ndarray:
        """Each grid cell of ``within`` (:meth:`grid_shape`; ``within`` holds ``factors``)'s cell
        of ``factors``: its position among :meth:`cells` of ``factors`` listed from ``starts``
        (per block; :meth:`starts`), as :meth:`index` gives it; an int array broadcasting to the
        grid, sized 1 along the axes ``factors`` does not read."""
        out = starts[blocks].reshape((len(blocks),) + (1,) * len(self.count.groups))
        stride = 1
        for g in reversed(range(len(self.count.groups))):
            pr = self.projection(g, factors)
            size = int(pr.sizes[blocks[0]])
            if size > 1:
                out = out + self._grid_axis(blocks, g, within, pr.code) * stride
                stride *= size
        return out

    def grid_multiplicity(self, blocks: np.ndarray, factors: frozenset[str]) -> np.ndarray:
        """How many valid layouts each grid cell of ``factors`` (:meth:`grid_shape`) stands for
        (:meth:`multiplicity`), broadcasting to the grid."""
        out = np.ones((len(blocks),) + (1,) * len(self.count.groups), dtype=np.int64)
        for g, pr in enumerate(self._projections_of(factors)):
            if not pr.identity:
                out = out * self._grid_axis(blocks, g, factors, pr.count, per_projection=True)
        return out

    def cells_at(self, factors: frozenset[str], positions: np.ndarray) -> Cells:
        """The cells of ``factors`` at ``positions`` of the listing of every block's cells
        (:meth:`cells` of all blocks, from :meth:`starts`)."""
        sizes = self.sizes(factors)
        block = np.searchsorted(self.starts(factors), positions, side="right") - 1
        local = positions - self.starts(factors)[block]
        pos = [np.zeros(0)] * len(self.count.groups)
        for g in reversed(range(len(self.count.groups))):
            pr = self.projection(g, factors)
            digit = local % np.maximum(pr.sizes[block], 1)
            local = local // np.maximum(pr.sizes[block], 1)
            pos[g] = pr.first[pr.starts[block] + digit]
        assert np.all(sizes[block] > 0)
        return Cells(block, pos)

    # -- rows -------------------------------------------------------------------------------

    def factor_index(self, cells: Cells) -> dict[str, np.ndarray]:
        """Each entry's index into each factor's values (name -> ``(m,)``)."""
        out = {}
        for k, group in enumerate(self.count.groups):
            index = self.count.passing[k][1]
            for f in group:
                out[f] = index[f][cells.pos[k]]
        return out

    def _assemble(self, block: np.ndarray, index: dict[str, np.ndarray]) -> np.ndarray:
        values = {f: self.tables[f][self.table_starts[f][block] + index[f]] for f in FACTORS}
        return assemble(self.scalars[block], values)

    def rows(self, cells: Cells) -> LayoutBatch:
        """The layouts of ``cells`` as a :class:`LayoutBatch` (each cell's first joint values):
        each column of :func:`autopar.space.assemble`'s rows gathered straight into place from
        its group's passing values (:meth:`_row_plan`; a group's passing joint value belongs to
        one block, so it fixes the factor's values) or the blocks' scalars."""
        out = np.empty((len(self._row_plan()), len(cells)), dtype=np.int64)
        for column, (g, values) in enumerate(self._row_plan()):
            np.take(values, cells.block if g < 0 else cells.pos[g], out=out[column])
        return batch_of(self.p, out.T)

    def _row_plan(self) -> list[tuple[int, np.ndarray]]:
        """For each column of :func:`autopar.space.assemble`'s rows: the factor group it comes
        from (-1: the block's scalars) and its value at each passing joint value of the group (or
        each block), contiguous; found once by assembling one row of distinct markers."""
        if self._rows_plan is None:
            sources, scalars, values = [], np.arange(6, dtype=np.int64)[None, :], {}
            for f in FACTORS:
                width = self.tables[f].shape[1]
                values[f] = np.arange(len(sources) + 6, len(sources) + 6 + width, dtype=np.int64)[None, :]
                sources += [(f, j) for j in range(width)]
            marker = assemble(scalars, values)[0]
            group_of = {f: g for g, group in enumerate(self.count.groups) for f in group}
            plan = []
            for m in marker:
                if m < 6:
                    plan.append((-1, np.ascontiguousarray(self.scalars[:, m])))
                else:
                    f, j = sources[m - 6]
                    g = group_of[f]
                    plan.append((g, np.ascontiguousarray(self._passing_values(g)[f][:, j])))
            self._rows_plan = plan
        return self._rows_plan

    def _passing_values(self, g: int) -> dict[str, np.ndarray]:
        """Each factor of group ``g``: its values (``(passing, c)``) at each of the group's
        passing joint values (positions as in :attr:`SpaceCount.passing`), built once."""
        if g not in self._passing_tables:
            owner, index = self.count.passing[g]
            self._passing_tables[g] = {f: self.tables[f][self.table_starts[f][owner] + index[f]]
                                       for f in self.count.groups[g]}
        return self._passing_tables[g]

    def stages(self, cells: Cells, view: int) -> Stages:
        """Stage view ``view`` (0: stage 0, 1: stage 1, 2: stage pp-1) of ``cells``' layouts."""
        return self.views[view].take(cells.block)

    def full_index(self, cells: Cells) -> np.ndarray:
        """Each layout's position in the full enumeration (:func:`autopar.space.enumerate_layouts`,
        valid or not); the valid layouts keep its order."""
        index = self.factor_index(cells)
        strides = self.full_strides[cells.block]
        out = self.full_starts[cells.block].copy()
        for j, f in enumerate(FACTORS):
            out += index[f] * strides[:, j]
        return out

    def evaluate(self, cells: Cells, factors: frozenset[str], view: int, fn, starts: np.ndarray | None = None) -> Any:
        """``fn(rows, stages)`` for every entry of ``cells`` on stage ``view``, costed once per
        distinct cell of ``factors`` (what ``fn`` reads) and gathered; ``starts``
        (:meth:`starts`) where the caller has them."""
        code = self.index(cells, factors, self.starts(factors) if starts is None else starts)
        first, inverse = one_of_each(code)
        once = cells.take(first)
        return scatter(fn(self.rows(once), self.stages(once, view)), inverse)

    def evaluate_views(self, per_view: list[Cells | None], factors: frozenset[str], fn) -> list:
        """:meth:`evaluate` of ``per_view[j]`` on stage view ``j`` for each view given (None: not
        costed, None returned), the distinct cells of all views in one ``fn`` call (the cost
        functions are row-wise, so each view gets what its own call gives)."""
        starts = self.starts(factors)
        parts, at = [], 0  # per view costed: its distinct cells, each entry's row in the one call
        for view, c in enumerate(per_view):
            if c is None:
                continue
            first, inverse = one_of_each(self.index(c, factors, starts))
            parts.append((view, c.take(first), at + inverse))
            at += len(first)
        if not parts:
            return [None] * len(per_view)
        rows = LayoutBatch.concat([self.rows(once) for _, once, _ in parts])
        stages = self.views[parts[0][0]].take(parts[0][1].block) if len(parts) == 1 else Stages(
            *(np.concatenate([getattr(self.views[view], f)[once.block] for view, once, _ in parts])
              for f in ("index", "start", "layers")))
        value = fn(rows, stages)
        out: list = [None] * len(per_view)
        for view, _, inverse in parts:
            out[view] = scatter(value, inverse)
        return out
