"""Enumerate only the layouts that pass the constraints and the rules, counting the others exactly.

The space is a list of blocks (:func:`autopar.space.blocks`: one per (tp, cp, pp, vpp, accounted)),
each the product of six small factors (experts, recompute, mbs, zero, tp modes, cp modes). Every
constraint and rule reads the block's columns and, in practice, one factor at most, so whether a
layout passes is decided factor by factor: a layout's first failing check (constraints first, in
order, then :data:`autopar.rules.RULES`) is the smallest of its block's first failing block-level
check and, per factor, the first failing check of its value. With ``S_f(i)`` the number of values
of factor ``f`` whose first failure is at or after check ``i``, the layouts of a block whose first
failure is at or after ``i`` number ``prod_f S_f(i)`` (zero if the block fails earlier), so the
count failing first at ``i`` is that product at ``i`` minus at ``i + 1``: the same counts as
evaluating every row (:func:`autopar.rules.first_failure`), without building the rows. The valid
layouts of a block are the product of the passing values of each factor, built in the full
enumeration's row order, so the valid batch is the full batch's valid rows.

Which factors a check reads is found by running it once on a recording batch
(:class:`_ColumnRecorder`); a check reading two factors merges them into one joint factor, so the
counting stays exact for any rule.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.rules import RULES
from autopar.search.constraints import Constraint
from autopar.space import _COLUMNS, FACTOR_COLUMNS, FACTORS, Block, SpaceOptions, assemble, batch_of, blocks, check_size

CheckFn = Callable[[LayoutBatch], np.ndarray]
COLUMN_FACTOR = {column: factor for factor, columns in FACTOR_COLUMNS.items() for column in columns}
_FIELDS = frozenset(f.name for f in fields(LayoutBatch))


class _ColumnRecorder:
    """A stand-in for a :class:`LayoutBatch` that records which columns a check reads (properties
    and methods run against the recorder, so the columns they read are recorded too)."""

    def __init__(self, batch: LayoutBatch) -> None:
        self._batch = batch
        self.read: set[str] = set()

    def __len__(self) -> int:
        return len(self._batch)

    def __getattr__(self, name: str) -> object:
        attr = getattr(LayoutBatch, name, None)
        if isinstance(attr, property):
            return attr.fget(self)
        if name in _FIELDS:
            self.read.add(name)
            return getattr(self._batch, name)
        if callable(attr):
            return attr.__get__(self)
        raise AttributeError(name)


def _factors_read(check: CheckFn, sample: LayoutBatch) -> frozenset[str]:
    """The factors (:data:`autopar.space.FACTORS`) whose columns ``check`` reads; every factor if
    it cannot run on the recorder."""
    recorder = _ColumnRecorder(sample)
    try:
        check(recorder)  # type: ignore[arg-type]
    except (AttributeError, TypeError):
        return frozenset(FACTORS)
    return frozenset(COLUMN_FACTOR[c] for c in recorder.read if c in COLUMN_FACTOR)


def _groups(reads: list[frozenset[str]]) -> list[tuple[str, ...]]:
    """The factors merged where a check reads several (each group in :data:`FACTORS` order,
    groups ordered by their first factor)."""
    group = {f: {f} for f in FACTORS}
    for read in reads:
        merged = set().union(*(group[f] for f in read)) if read else set()
        for f in merged:
            group[f] = merged
    out = {tuple(f for f in FACTORS if f in group[g]) for g in FACTORS}
    return sorted(out, key=lambda g: FACTORS.index(g[0]))


@dataclass
class ValidSpace:
    """The outcome of :func:`valid_layouts`: the ``valid`` batch (the full enumeration's valid
    rows, in its order), how many layouts the space holds (``enumerated``), how many each
    constraint removed (``removed``: every constraint, by its text) and how many each rule
    rejected first (``rejected``: rules with a count > 0, in :data:`RULES` order); ``keys``: each
    valid row's block (index into :func:`autopar.space.blocks`) and factor indices (:data:`FACTORS`
    order), which say which rows a cost that reads only some factors costs alike."""

    valid: LayoutBatch
    enumerated: int
    removed: dict[str, int]
    rejected: dict[str, int]
    keys: np.ndarray | None = None  # (n, 7): each valid row's block and index into each factor, or None


def _mixed_radix(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every combination of ``k`` digits per block, block after block, the first digit slowest
    (``np.meshgrid(..., indexing="ij")`` order): ``sizes`` ``(blocks, k)`` the digits' ranges;
    returns each combination's block (position in ``sizes``) and its ``(n, k)`` digits (each
    column contiguous). Blocks of one shape share one ``np.indices`` table."""
    sizes = np.asarray(sizes, dtype=np.int64)
    per_block = np.prod(sizes, axis=1)
    owner = np.repeat(np.arange(len(sizes)), per_block)
    k = sizes.shape[1] if sizes.ndim == 2 else 0
    if not k or not len(owner):
        return owner, np.zeros((k, len(owner)), dtype=np.int64).T
    shapes, inverse = np.unique(sizes, axis=0, return_inverse=True)
    tables = [np.indices(tuple(int(d) for d in shape)).reshape(k, -1) for shape in shapes]
    return owner, np.concatenate([tables[i] for i in inverse.ravel()], axis=1).T


SpaceTables = tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]


def _space_tables(space: list[Block]) -> SpaceTables:
    """Each factor's values of every block of ``space`` concatenated (name -> ``(total, c)``),
    each block's offset into them (name -> ``(blocks,)``) and the blocks' ``(blocks, 6)``
    scalars (:attr:`autopar.space.Block.scalars`): built once per space for :func:`_block_rows`."""
    values, offsets = {}, {}
    for f in FACTORS:
        tables = [block.values[f] for block in space]
        offsets[f] = np.cumsum([0] + [len(t) for t in tables[:-1]])
        values[f] = np.concatenate(tables)
    return values, offsets, np.stack([block.scalars for block in space]).reshape(-1, 6)


def _block_rows(tables: SpaceTables, owner: np.ndarray, index: dict[str, np.ndarray]) -> np.ndarray:
    """The ``(n, 19)`` rows (:meth:`autopar.space.Block.rows`) of the layouts of blocks ``owner``
    (of the space of ``tables``, :func:`_space_tables`) at the factor indices ``index`` (name ->
    ``(n,)``, every factor)."""
    values, offsets, scalars = tables
    return assemble(scalars[owner], {f: values[f][offsets[f][owner] + index[f]] for f in FACTORS})


def _group_rows(space: list[Block], tables: SpaceTables, group: tuple[str, ...]
                ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One row per (block, joint value of ``group``), the other factors at their first value:
    the ``(m, 19)`` rows, each row's block and its index into each factor of ``group``."""
    owner, digits = _mixed_radix(np.array([[len(block.values[f]) for f in group] for block in space], dtype=np.int64))
    index = {f: digits[:, k] for k, f in enumerate(group)}
    full = {f: index.get(f, np.zeros(len(owner), dtype=np.int64)) for f in FACTORS}
    return _block_rows(tables, owner, full), owner, index


@dataclass
class SpaceCount:
    """What :func:`count_space` found: the space's ``blocks``, the counts of :class:`ValidSpace`
    (``enumerated``, ``removed``, ``rejected``), ``valid_per_block`` (the valid layouts of each
    block) and, per factor group (``groups``), the block and factor indices of each passing joint
    value (``passing``) with each block's span into them (``bounds``): what
    :func:`valid_block_rows` builds a block's valid rows from."""

    blocks: list[Block]
    enumerated: int
    removed: dict[str, int]
    rejected: dict[str, int]
    valid_per_block: np.ndarray
    groups: list[tuple[str, ...]]
    passing: list[tuple[np.ndarray, dict[str, np.ndarray]]]
    bounds: list[np.ndarray]

    @property
    def valid(self) -> int:
        """How many layouts pass the constraints and the rules."""
        return int(self.valid_per_block.sum())


def _first_failure(batch: LayoutBatch, checks: list[CheckFn], indices: np.ndarray, k: int) -> np.ndarray:
    """Per row of ``batch``, the first of the checks ``checks[i]``, ``i`` in ``indices``, it
    fails (``k`` where it passes them all)."""
    first = np.full(len(batch), k, dtype=np.int64)
    for i in reversed(indices.tolist()):  # the earliest failing check is written last
        first[~np.broadcast_to(np.asarray(checks[i](batch), dtype=bool), (len(batch),))] = i
    return first


def count_space(p: Problem, options: SpaceOptions | None, constraints: list[Constraint]) -> SpaceCount:
    """The blocks of the space of ``p`` and the exact removal and rejection counts (see the module
    docstring), with what :func:`valid_block_rows` needs to build each block's valid rows.

    Raises:
        AutoparError: more than :data:`autopar.space.MAX_BLOCKS` blocks (:func:`autopar.space.blocks`).
    """
    space = blocks(p, options)
    checks: list[CheckFn] = [c.passes for c in constraints] + [(lambda b, r=r: r.check(p, b)) for r in RULES]
    k = len(checks)
    if not space:
        return SpaceCount([], 0, {c.text: 0 for c in constraints}, {}, np.zeros(0, dtype=np.int64), [], [], [])
    sample = batch_of(p, space[0].rows({f: np.zeros(1, dtype=np.int64) for f in FACTORS}))
    reads = [_factors_read(check, sample) for check in checks]
    groups = _groups(reads)
    check_group = np.asarray([-1 if not read else next(j for j, g in enumerate(groups) if set(read) <= set(g))
                              for read in reads])

    # One representative row per (block, group, joint value): the group's factors set, the others
    # first. Each check runs on the rows of the group it reads (a block-level one on one row per block).
    tables = _space_tables(space)
    per_group = [_group_rows(space, tables, group) for group in groups]
    n_blocks = len(space)
    firsts = [_first_failure(batch_of(p, rows), checks, np.flatnonzero(check_group == j), k)
              for j, (rows, _, _) in enumerate(per_group)]
    one_per_block = _block_rows(tables, np.arange(n_blocks), {f: np.zeros(n_blocks, dtype=np.int64) for f in FACTORS})
    block_first = _first_failure(batch_of(p, one_per_block), checks, np.flatnonzero(check_group < 0), k)

    # at_least[b, i]: layouts of block b whose first failure is at or after check i.
    at_least = (block_first[:, None] >= np.arange(k + 1)[None, :]).astype(np.int64)
    for (_, owner, _), first in zip(per_group, firsts):
        hist = np.zeros((n_blocks, k + 1), dtype=np.int64)
        np.add.at(hist, (owner, first), 1)
        at_least *= np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]
    per_check = (at_least[:, :-1] - at_least[:, 1:]).sum(axis=0)
    removed = {c.text: int(per_check[i]) for i, c in enumerate(constraints)}
    rejected = {r.name: int(per_check[len(constraints) + i]) for i, r in enumerate(RULES)
                if per_check[len(constraints) + i] > 0}
    passing = []  # per group: the block of each passing joint value, and its factor indices
    for (_, owner, index), first in zip(per_group, firsts):
        ok = first == k
        passing.append((owner[ok], {f: v[ok] for f, v in index.items()}))
    bounds = [np.searchsorted(owner, np.arange(n_blocks + 1)) for owner, _ in passing]
    return SpaceCount(space, int(at_least[:, 0].sum()), removed, rejected, at_least[:, k], groups, passing, bounds)


def valid_block_rows(count: SpaceCount, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The valid layouts of block ``b`` of ``count.blocks`` in the full enumeration's row order:
    the product of each factor group's passing joint values, as ``(n, 19)`` rows
    (:meth:`autopar.space.Block.rows`) and their ``(n, 7)`` keys (:attr:`ValidSpace.keys`)."""
    block = count.blocks[b]
    spans = [slice(bound[b], bound[b + 1]) for bound in count.bounds]
    picks = [g.ravel() for g in np.meshgrid(*(np.arange(s.stop - s.start) for s in spans), indexing="ij")]
    index = {}
    for (_, group_index), span, pick in zip(count.passing, spans, picks):
        index.update({f: v[span][pick] for f, v in group_index.items()})
    if not all(FACTORS.index(g[-1]) - FACTORS.index(g[0]) == len(g) - 1 for g in count.groups):
        dims = [len(block.values[f]) for f in FACTORS]
        order = np.argsort(np.ravel_multi_index([index[f] for f in FACTORS], dims), kind="stable")
        index = {f: v[order] for f, v in index.items()}
    keys = np.column_stack([np.full(len(index["mbs"]), b)] + [index[f] for f in FACTORS])
    return block.rows(index), keys


def valid_layouts(p: Problem, options: SpaceOptions | None, constraints: list[Constraint]) -> ValidSpace:
    """The valid layouts of the space of ``p`` and the exact removal and rejection counts, as
    :func:`autopar.space.enumerate_layouts`, :func:`autopar.search.constraints.apply_constraints`
    and :func:`autopar.rules.first_failure` give them, without building the rejected rows
    (:func:`count_space`, then :func:`valid_block_rows` for every block with valid layouts).

    Raises:
        AutoparError: more than :data:`autopar.space.MAX_LAYOUTS` valid layouts
            (:func:`autopar.space.check_size`).
    """
    count = count_space(p, options, constraints)
    check_size(p, count.valid, "valid")
    parts = [valid_block_rows(count, int(b)) for b in np.flatnonzero(count.valid_per_block)]
    rows = np.concatenate([r for r, _ in parts]) if parts else np.zeros((0, _COLUMNS), dtype=np.int64)
    keys = np.concatenate([k for _, k in parts]) if parts else np.zeros((0, 1 + len(FACTORS)), dtype=np.int64)
    return ValidSpace(batch_of(p, rows), count.enumerated, count.removed, count.rejected, keys)
