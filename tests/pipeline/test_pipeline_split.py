"""The exact min-max split (autopar.pipeline.split.min_max_split), computed block by block over the
end positions: its slowest rank equals an exhaustive search over every split and per-rank
recompute option, and every rank fits the memory limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.pipeline import split
from autopar.pipeline.folded import FoldedTable


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])


def _brute_force_s(table: FoldedTable, options: list[int]) -> float:
    """Smallest slowest-rank time over every split into non-empty ranges and every option per
    rank that fits the limit (inf when none fits)."""
    best = np.inf
    for cuts in itertools.combinations(range(1, table.positions), table.pp - 1):
        bounds = (0, *cuts, table.positions)
        slowest = 0.0
        for rank in range(table.pp):
            fits = [float(table.rank_time_s(rank, bounds[rank], bounds[rank + 1], o)) for o in options
                    if table.rank_bytes(rank, bounds[rank], bounds[rank + 1], o) <= table.memory_limit_bytes]
            slowest = max(slowest, min(fits, default=np.inf))
        best = min(best, slowest)
    return best


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(1, 3), st.integers(1, 4), st.data())
def test_min_max_split_equals_the_exhaustive_search(positions, pp, num_options, block, data):
    pp = min(pp, positions)
    floats = lambda n, low, high: np.array(data.draw(st.lists(st.floats(low, high), min_size=n, max_size=n)))  # noqa: E731
    table = FoldedTable(
        time_s=_prefix(floats(positions * num_options, 0.1, 2.0).reshape(positions, num_options)),
        static_bytes=_prefix(floats(positions, 0.0, 1.0)),
        activation_bytes=_prefix(floats(positions * num_options, 0.0, 1.0).reshape(positions, num_options)),
        stage_time_s=floats(pp * num_options, 0.0, 0.5).reshape(pp, num_options),
        stage_bytes=floats(pp * num_options, 0.0, 0.5).reshape(pp, num_options),
        in_flight=np.arange(pp, 0, -1, dtype=float), memory_limit_bytes=data.draw(st.floats(0.5, 6.0)))
    options = sorted(data.draw(st.sets(st.integers(0, num_options - 1), min_size=1)))
    expected = _brute_force_s(table, options)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(split, "BLOCK", block)  # several blocks even for a few positions
        found = split.min_max_split(table, np.array(options))
    if not np.isfinite(expected):
        assert found is None
        return
    bounds, chosen = found
    assert bounds[0] == 0 and bounds[-1] == positions and np.all(np.diff(bounds) >= 1)
    ranks = np.arange(pp)
    times = table.rank_time_s(ranks, bounds[:-1], bounds[1:], chosen)
    assert np.all(table.rank_bytes(ranks, bounds[:-1], bounds[1:], chosen) <= table.memory_limit_bytes)
    assert float(times.max()) == pytest.approx(expected, rel=1e-12)
