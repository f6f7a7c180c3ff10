"""Pure row functions of many rows, costed once per distinct value of the columns they read.

Some cost terms read a row's columns only, not its stage, and only some columns: a decoder layer's
forward times (:func:`autopar.cost.compute.layer_forward_times`, dense and MoE) read the layout's
shape within a layer (tp, cp, mbs, sp, the CP and expert modes, ep, etp), as does the EP pass
(:func:`autopar.cost.moe_dispatch.pass_comm_s`; the stage time's :class:`RowTerms`); the stage-independent
activation parts (:func:`autopar.cost.memory.activation_parts`) tp, cp, etp, mbs, sp and the
recompute options; neither reads the pipeline or data-parallel columns. The search hands them
rows of hundreds of blocks that differ in pp, vpp and dp but share a few thousand such values
(DeepSeek-V3 on 16,384 H100: about 209,000 floor cells, 19,000 distinct MoE layer shapes; 332,000
activation cells, 15,000 distinct). :class:`ColumnsOnce` finds the columns a function reads (once
per search, on the recording batch of :func:`autopar.search.valid_space._factors_read`), costs one
row per distinct value of those columns and gathers the results to the rows. The cost functions
are row-wise (a row's numbers depend on its own columns only), so the gathered numbers are those
of a pass over every row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from autopar.cost import compute as C
from autopar.layout_batch import LayoutBatch
from autopar.search.valid_space import _ColumnRecorder

_MIN_ROWS = 1024  # fewer rows are costed as they are: finding the distinct ones would cost more than it saves
_TABLE = 1 << 22  # codes made dense by a table up to this many, by sorting above


def gather(value: Any, inverse: np.ndarray) -> Any:
    """``value`` (an array over distinct rows, a tuple of them, or a dataclass of those) at each
    row's distinct row ``inverse``; 0-d arrays and non-array values are shared as they are."""
    if isinstance(value, np.ndarray):
        return value[inverse] if value.ndim else value
    if isinstance(value, tuple):
        return tuple(gather(v, inverse) for v in value)
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: gather(getattr(value, f.name), inverse)
                                             for f in dataclasses.fields(value)})
    return value


def _dense(code: np.ndarray, radix: int) -> tuple[np.ndarray, int]:
    """Codes in ``0..radix-1`` ranked among those present (order kept), and how many are present:
    by a table up to :data:`_TABLE` codes, by sorting above."""
    if radix > _TABLE:
        values, rank = np.unique(code, return_inverse=True)
        return rank.ravel(), len(values)
    present = np.zeros(radix, dtype=bool)
    present[code] = True
    ranks = np.cumsum(present) - 1
    return ranks[code], int(ranks[-1]) + 1


def distinct_rows(batch: LayoutBatch, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One row of each distinct value of ``columns`` (integer columns of ``batch``), in increasing
    order of their codes, and each row's index into those rows. The code combines the columns in
    mixed radix (the first column the least digit), each column's digit its offset from its least
    value (its rank among its values where they spread wider than 64, e.g. powers of two); the
    code so far is made dense (:func:`_dense`) whenever the next digit would take it past 8 codes
    per row, and the last one picks the rows."""
    n = len(batch)
    limit = max(8 * n, 1 << 16)
    key, radix = np.zeros(n, dtype=np.int64), 1
    for name in columns:
        col = np.asarray(getattr(batch, name), dtype=np.int64)
        low, high = int(col.min()), int(col.max())
        if low == high:  # one value: no digit
            continue
        digit, width = col - low, high - low + 1
        if width > 64:
            digit, width = _dense(digit, width)
        if radix * width > limit:
            key, radix = _dense(key, radix)
        key += digit * radix
        radix *= width
    if radix > _TABLE:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        return first, inverse.ravel()
    at = np.full(radix, -1, dtype=np.int64)
    at[key] = np.arange(n)
    present = at >= 0
    return at[present], (np.cumsum(present) - 1)[key]


class ColumnsOnce:
    """``fn(batch)`` (a pure row function of a :class:`LayoutBatch`) costed once per distinct value
    of the columns it reads; ``sample``: rows spread over the search's space to record those
    columns on (once). Under measured operator times (a profile database,
    :func:`autopar.cost.compute.use_op_times`) or on small batches, ``fn`` runs on every row."""

    def __init__(self, fn: Callable[[LayoutBatch], Any], sample: LayoutBatch) -> None:
        self.fn = fn
        recorder = _ColumnRecorder(sample)
        try:
            fn(recorder)  # type: ignore[arg-type]
            self.columns: list[str] | None = sorted(recorder.read)
        except (AttributeError, TypeError):
            self.columns = None

    def __call__(self, batch: LayoutBatch, fn: Callable[[LayoutBatch], Any] | None = None) -> Any:
        """``fn``'s value on every row of ``batch`` (``fn``: the function recorded, or one that
        computes the same from the same columns)."""
        fn = self.fn if fn is None else fn
        if self.columns is None or len(batch) < _MIN_ROWS or C._OP_TIMES.get() is not None:
            return fn(batch)
        first, inverse = distinct_rows(batch, self.columns)
        return gather(fn(batch.take(first)), inverse)


class RowTerms:
    """The ``once`` runner of :func:`autopar.cost.stage_time.stage_time`: ``(name, fn, rows) ->
    fn(rows)`` by a :class:`ColumnsOnce` of ``fn`` made at the name's first call (the columns
    ``fn`` reads are those of every later call under that name); ``sample`` as there. (Finding the
    distinct rows of a stage time's terms once, over the union of their columns, and each term's
    among those was measured slower: 0.89-0.90 -> 0.92-0.97 s on DeepSeek-V3 16,384 H100.)"""

    def __init__(self, sample: LayoutBatch) -> None:
        self.sample = sample
        self.terms: dict[str, ColumnsOnce] = {}

    def __call__(self, name: str, fn: Callable[[LayoutBatch], Any], rows: LayoutBatch) -> Any:
        """``fn(rows)``."""
        if name not in self.terms:
            self.terms[name] = ColumnsOnce(fn, self.sample)
        return self.terms[name](rows, fn)
