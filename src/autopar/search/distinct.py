"""Cost a row-wise function once per distinct value of what it reads.

The search's valid rows come from a few blocks times six small factors
(:mod:`autopar.search.valid_space`), and most cost terms read only some factors: the stage time
does not read the ZeRO stage, the stage's parameter count reads only the experts factor and the
block. :class:`Distinct` finds which factors a function reads (running it once on a
:class:`~autopar.search.valid_space._ColumnRecorder`), costs one row per distinct (block, factors
read) and copies the results to the other rows. The cost functions are row-wise (a row's numbers
depend on its own columns and stage only), so the copies are the numbers a full pass gives.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.search.valid_space import _factors_read
from autopar.space import FACTORS

RowFn = Callable[[LayoutBatch, Stages], Any]
WORTH = 0.7  # cost the distinct rows only where they are fewer than this share of the rows
_SAMPLE = 8  # rows the column recorder runs a function on
_DENSE_PER_ROW = 8  # key ranges up to this many per row are made dense with a table, larger ones by sorting


def _scatter(value: Any, inverse: np.ndarray) -> Any:
    """``value`` (an array, or a dataclass of arrays, over distinct rows) spread to every row."""
    if isinstance(value, np.ndarray):
        return value[inverse]
    if dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: _scatter(getattr(value, f.name), inverse)
                                             for f in dataclasses.fields(value)
                                             if isinstance(getattr(value, f.name), np.ndarray)})
    return value


def _first_of_each(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For dense codes ``0..m-1``: one row per code present and each row's index into those rows."""
    at = np.full(int(code.max()) + 1 if len(code) else 0, -1, dtype=np.int64)
    at[code] = np.arange(len(code))
    present = at >= 0
    return at[present], (np.cumsum(present) - 1)[code]


class Distinct:
    """Row keys of a search's valid batch (``keys``: ``(n, 7)`` block and factor indices,
    :attr:`autopar.search.valid_space.ValidSpace.keys`) and the runner of functions once per
    distinct key. ``reads`` (function name -> the factors it reads) may be shared by the chunks
    of one search (:mod:`autopar.search.stream`): what a cost term reads does not depend on the rows."""

    def __init__(self, keys: np.ndarray, reads: dict[str, frozenset[str]] | None = None) -> None:
        self.keys = keys
        self._codes: dict[frozenset[str], np.ndarray] = {}
        self._reads: dict[str, frozenset[str]] = {} if reads is None else reads  # shared across a search's chunks

    def _code(self, factors: frozenset[str]) -> np.ndarray:
        """Dense code ``0..m-1`` per valid row of (block, the indices of ``factors``)."""
        if factors not in self._codes:
            columns = [0] + [1 + FACTORS.index(f) for f in FACTORS if f in factors]
            key = self.keys[:, columns]
            if not len(key):
                self._codes[factors] = np.zeros(0, dtype=np.int64)
                return self._codes[factors]
            key = key - key.min(axis=0)  # a chunk's blocks start anywhere (autopar.search.stream)
            dims = key.max(axis=0) + 1
            raw = np.ravel_multi_index(tuple(key.T), dims)
            if int(np.prod(dims.astype(float))) <= max(_DENSE_PER_ROW * len(key), 1 << 16):  # a table, no sort
                present = np.zeros(int(np.prod(dims)), dtype=bool)
                present[raw] = True
                self._codes[factors] = (np.cumsum(present) - 1)[raw]
            else:
                self._codes[factors] = np.unique(raw, return_inverse=True)[1].ravel()
        return self._codes[factors]

    def run(self, name: str, fn: RowFn, rows: np.ndarray, batch: LayoutBatch, stages: Stages) -> Any:
        """``fn`` on the valid rows at indices ``rows`` of ``batch`` (the search's valid batch) with
        their stage view ``stages`` (aligned with ``batch``), costed once per distinct key of the
        factors ``fn`` reads (``name`` caches what it reads); rows are taken only as needed."""
        if len(rows) == 0:
            return fn(batch.take(rows), stages.take(rows))
        if name not in self._reads:
            sample = rows[:_SAMPLE]
            self._reads[name] = _factors_read(lambda b: fn(b, stages.take(sample)), batch.take(sample))
        first, inverse = _first_of_each(self._code(self._reads[name])[rows])
        if len(first) > WORTH * len(rows):
            if len(rows) == len(batch):  # rows: increasing indices, so every row in order
                return fn(batch, stages)
            return fn(batch.take(rows), stages.take(rows))
        return _scatter(fn(batch.take(rows[first]), stages.take(rows[first])), inverse)

    def per_block(self) -> tuple[np.ndarray, np.ndarray]:
        """One valid row per block and each row's index into them (see :func:`_first_of_each`)."""
        return _first_of_each(self._code(frozenset()))
