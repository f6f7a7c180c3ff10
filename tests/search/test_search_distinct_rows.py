""":mod:`autopar.search.distinct_rows` costs a pure row function once per distinct value of the
columns it reads and gives every row the numbers a pass over every row gives; the stage time with
the layer times so costed is the stage time."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost import userbuffers_sm
from autopar.cost.compute import layer_forward_times
from autopar.cost.memory import activation_parts
from autopar.cost.stage import bounding_stages
from autopar.cost.stage_time import stage_time
from autopar.layout_batch import LayoutBatch
from autopar.search.distinct_rows import ColumnsOnce, RowTerms, distinct_rows, gather
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts

CASES = [("llama3-8b", 8, 64), ("qwen3-30b-a3b", 8, 64)]  # dense; MoE (the expert columns)


def _valid(model: str, nodes: int, gbs: int) -> tuple:
    """The problem and up to 8,192 of its valid layouts, spread over the space."""
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=4096), "megatron", None)
    valid = valid_layouts(p, options, []).valid
    return p, valid.take(np.unique(np.linspace(0, len(valid) - 1, 8192).astype(np.int64)))


def test_distinct_rows_numbers_each_distinct_value_once():
    """Rows (tp, mbs) = (1,1), (8,2), (1,1), (8,1), (8,2): three distinct values, in increasing code
    order (tp ranked first, the least digit): (1,1) -> 0, (8,1) -> 1, (8,2) -> 2."""
    tp, mbs = np.array([1, 8, 1, 8, 8]), np.array([1, 2, 1, 1, 2])
    batch = LayoutBatch(*([np.ones(5, dtype=np.int64)] * 13))
    batch.tp, batch.mbs = tp, mbs
    first, inverse = distinct_rows(batch, ["mbs", "tp"])
    assert inverse.tolist() == [0, 2, 0, 1, 2]
    assert first.tolist() == [2, 3, 4]  # the last row of each value (any row of it would do)
    assert np.array_equal(tp[first][inverse], tp) and np.array_equal(mbs[first][inverse], mbs)


@pytest.mark.parametrize("case", CASES)
def test_layer_times_once_are_the_layer_times_of_every_row(case):
    p, valid = _valid(*case)
    assert len(valid) >= 1024  # large enough to be costed once per distinct value
    sample = valid.take(np.arange(0, len(valid), 64))
    for moe in (False, True) if p.model.is_moe else (False,):
        once = ColumnsOnce(lambda b, moe=moe: layer_forward_times(p, b, moe=moe), sample)
        assert "tp" in once.columns and "pp" not in once.columns and "dp" not in once.columns
        assert len(distinct_rows(valid, once.columns)[0]) < len(valid) // 2  # costed on fewer rows
        got, want = once(valid), layer_forward_times(p, valid, moe=moe)
        for f in fields(want):
            a, b = getattr(got, f.name), getattr(want, f.name)
            if isinstance(b, tuple):
                assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b)), f.name
            else:
                assert np.array_equal(np.broadcast_to(a, np.shape(b)), b), f.name


@pytest.mark.parametrize("case", CASES)
def test_stage_time_with_row_terms_once_is_the_stage_time(case):
    p, valid = _valid(*case)
    once = RowTerms(valid.take(np.arange(0, len(valid), 64)))
    for view, stages in enumerate(bounding_stages(p, valid)):
        for floor in (False, True):
            got = stage_time(p, valid, stages, floor=floor, once=once)
            want = stage_time(p, valid, stages, floor=floor)
            for f in fields(want):
                assert np.array_equal(getattr(got, f.name), getattr(want, f.name)), (view, floor, f.name)
    assert set(once.terms) == ({"layer_forward_dense"} | ({"layer_forward_moe", "moe_pass_comm"} if p.model.is_moe
                                                          else set())
                                | ({"userbuffers"} if userbuffers_sm.may_apply(p) else set()))


def test_gather_spreads_arrays_tuples_and_dataclasses_and_keeps_scalars():
    t = layer_forward_times(*_valid("llama3-8b", 1, 64)[:1], _valid("llama3-8b", 1, 64)[1].take(np.arange(2)),
                            moe=False)
    out = gather(t, np.array([1, 1, 0]))
    assert np.array_equal(out.gemm_s, t.gemm_s[[1, 1, 0]])
    assert all(np.array_equal(a, b[[1, 1, 0]]) for a, b in zip(out.mlp_gemm_s, t.mlp_gemm_s))
    assert gather(np.float64(2.0), np.array([0, 0])) == 2.0


@pytest.mark.parametrize("case", CASES)
def test_activation_parts_once_are_those_of_every_row(case):
    p, valid = _valid(*case)
    once = ColumnsOnce(lambda b: activation_parts(p, b), valid.take(np.arange(0, len(valid), 64)))
    assert "pp" not in once.columns and "dp" not in once.columns and "mbs" in once.columns
    got, want = once(valid), activation_parts(p, valid)
    for f in fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        for g in fields(b) if hasattr(b, "__dataclass_fields__") else [None]:
            x, y = (a, b) if g is None else (getattr(a, g.name), getattr(b, g.name))
            assert np.array_equal(np.broadcast_to(x, np.shape(y)), y), (f.name, g and g.name)


@pytest.mark.parametrize("table", [1 << 22, 16])  # codes made dense by a table; by sorting
def test_distinct_rows_groups_rows_by_equal_values(monkeypatch, table):
    """Random columns, some narrow, one of powers of two up to 2^20 (ranked), one constant: two
    rows share an index exactly when they agree on every column, and each index's row is one of them."""
    import autopar.search.distinct_rows as D

    monkeypatch.setattr(D, "_TABLE", table)
    rng = np.random.default_rng(0)
    n = 3000
    columns = {"tp": 2 ** rng.integers(0, 21, n), "mbs": rng.integers(1, 5, n), "sp": rng.integers(0, 2, n),
               "cp": np.ones(n, dtype=np.int64), "ep": rng.integers(1, 40, n)}
    batch = LayoutBatch(*([np.ones(n, dtype=np.int64)] * 13))
    for name, values in columns.items():
        setattr(batch, name, values)
    first, inverse = distinct_rows(batch, list(columns))
    rows = np.stack(list(columns.values()), axis=1)
    want = np.unique(rows, axis=0)
    assert len(first) == len(want)
    assert np.array_equal(rows[first][inverse], rows)  # each row's index points at a row equal to it
    assert len(np.unique(rows[first], axis=0)) == len(first)  # distinct indices, distinct values
