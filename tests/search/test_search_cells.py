"""The cells of :mod:`autopar.search.cells` list the valid layouts exactly once, in the full
enumeration's order, and a term costed once per cell of what it reads gives every layout the
number a pass over all of them gives."""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache

import numpy as np
import pytest
from conftest import make_problem, whole_batch_top

from autopar.cost.memory import stage_activation_bytes, stage_state
from autopar.cost.stage import bounding_stages
from autopar.cost.stage_time import stage_time
from autopar.search.cells import SpaceCells
from autopar.search.constraints import parse_constraints, widen_space
from autopar.search.grid import for_search
from autopar.search.valid_space import count_space, valid_layouts
from autopar.space import FACTORS, enumerate_layouts

SPACES = [  # dense; MoE (experts and recompute merged by a rule); a pinned space whose groups interleave
    ("llama3-8b", 1, 64, 4096, "megatron", {}),
    ("qwen3-30b-a3b", 1, 64, 4096, "megatron", {"--ep": "4,8"}),
    ("llama3-8b", 1, 64, 4096, "deepspeed", {"--zero": "1,3"}),
]


@lru_cache(maxsize=None)
def _space(i: int):
    model, nodes, gbs, seq, target, pins = SPACES[i]
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=seq), target, None)
    constraints = parse_constraints(pins, {})
    options = widen_space(options, constraints)
    count = count_space(p, options, constraints)
    return p, options, constraints, count, SpaceCells(p, count)


@pytest.mark.parametrize("i", range(len(SPACES)))
def test_cells_of_every_factor_are_the_valid_layouts_in_order(i):
    p, options, constraints, count, cells = _space(i)
    valid = valid_layouts(p, options, constraints).valid
    every = cells.cells(np.flatnonzero(count.valid_per_block), frozenset(FACTORS))
    order = np.argsort(cells.full_index(every), kind="stable")
    rows = cells.rows(every.take(order))
    for f in fields(valid):
        assert np.array_equal(getattr(rows, f.name), getattr(valid, f.name)), f.name
    # full_index is the position in the full enumeration (valid or not)
    full = enumerate_layouts(p, options)
    at = np.sort(cells.full_index(every))
    for f in ("dp", "tp", "pp", "vpp", "cp", "ep", "mbs", "zero", "recompute", "sp", "cp_comm"):
        assert np.array_equal(getattr(full, f)[at], getattr(valid, f)), f


@pytest.mark.parametrize("i", range(len(SPACES)))
def test_each_cell_stands_for_its_layouts(i):
    """For the factors a term reads: the multiplicities add up to the valid layouts, and expanding
    the cells gives every valid layout once."""
    p, options, constraints, count, cells = _space(i)
    blocks = np.flatnonzero(count.valid_per_block)
    for factors in (frozenset({"mbs"}), frozenset({"experts", "zero"}), frozenset(FACTORS) - {"recompute"}):
        c = cells.cells(blocks, factors)
        assert cells.multiplicity(c, factors).sum() == count.valid
        owner, layouts = cells.expand(c, factors)
        index = cells.full_index(layouts)
        assert len(np.unique(index)) == len(index) == count.valid
        assert np.array_equal(cells.index(layouts, factors, cells.starts(factors)), owner)


@pytest.mark.parametrize("i", range(len(SPACES)))
def test_grids_of_blocks_of_one_shape_index_as_the_cells_do(i):
    """grid_index / grid_multiplicity over the blocks of one grid shape, flattened, give what index /
    multiplicity give the cells listed block after block; cells_at finds the cells at positions of
    the whole listing."""
    p, options, constraints, count, cells = _space(i)
    within = frozenset({"experts", "recompute", "mbs", "zero", "tp_modes"})
    sets = (frozenset({"experts", "mbs", "zero"}), frozenset({"mbs", "tp_modes"}), frozenset({"recompute"}), within)
    blocks = np.flatnonzero(cells.sizes(within))
    shape_of = np.stack([cells.projection(g, f).sizes[blocks] for f in (within,) + sets
                         for g in range(len(count.groups))], axis=1)
    _, kind = np.unique(shape_of, axis=0, return_inverse=True)
    assert kind.max() > 0  # several shapes
    for k in range(int(kind.max()) + 1):
        group = blocks[kind.ravel() == k]
        shape = cells.grid_shape(group, within)
        listed = cells.cells(group, within)
        assert int(np.prod(shape)) == len(listed)
        for factors in sets:
            starts = cells.starts(factors)
            got = np.broadcast_to(cells.grid_index(group, within, factors, starts), shape).ravel()
            assert np.array_equal(got, cells.index(listed, factors, starts))
        weight = np.broadcast_to(cells.grid_multiplicity(group, within), shape).ravel()
        assert np.array_equal(weight, cells.multiplicity(listed, within))
    every = cells.cells(blocks, within)
    picked = np.arange(0, len(every), 7)
    at = cells.cells_at(within, picked)
    assert np.array_equal(cells.full_index(at), cells.full_index(every.take(picked)))


@pytest.mark.parametrize("i", range(len(SPACES)))
def test_a_term_costed_per_cell_is_the_term_of_every_layout(i):
    p, options, constraints, count, cells = _space(i)
    every = cells.cells(np.flatnonzero(count.valid_per_block), frozenset(FACTORS))
    rows = cells.rows(every)
    views = bounding_stages(p, rows)
    for view in range(3):
        for fn, reads in ((stage_state, {"experts", "mbs", "zero"}), (stage_activation_bytes, set(FACTORS) - {"zero"}),
                          (stage_time, set(FACTORS) - {"zero"})):
            got = cells.evaluate(every, frozenset(reads), view, lambda b, s: fn(p, b, s))
            want = fn(p, rows, views[view])
            if isinstance(want, np.ndarray):
                assert np.array_equal(got, want)
            else:
                for f in fields(want):
                    assert np.array_equal(np.broadcast_to(getattr(got, f.name), len(rows)),
                                          np.broadcast_to(getattr(want, f.name), len(rows))), f.name


@pytest.mark.parametrize("i", range(len(SPACES)))
def test_views_costed_in_one_call_equal_each_view_costed_alone(i):
    """evaluate_views: each view's layouts (a different subset per view, one view skipped) get
    what evaluate gives them view by view, the three views' distinct cells costed in one call."""
    p, options, constraints, count, cells = _space(i)
    every = cells.cells(np.flatnonzero(count.valid_per_block), frozenset(FACTORS))
    picks = [every.take(np.arange(0, len(every), 3)), None, every.take(np.arange(1, len(every), 2))]
    reads = frozenset(FACTORS) - {"zero"}
    calls = []

    def fn(b, s):
        calls.append(len(b))
        return stage_time(p, b, s)

    got = cells.evaluate_views(picks, reads, fn)
    assert len(calls) == 1 and got[1] is None
    for view in (0, 2):
        want = cells.evaluate(picks[view], reads, view, lambda b, s: stage_time(p, b, s))
        for f in fields(want):
            assert np.array_equal(np.broadcast_to(getattr(got[view], f.name), len(picks[view])),
                                  np.broadcast_to(getattr(want, f.name), len(picks[view]))), f.name


def test_interleaved_groups_rank_and_count_as_the_whole_batch(monkeypatch):
    """A rule reading the recompute option and the ZeRO stage merges them (and the experts) into
    one group whose factors are not adjacent (mbs lies between): the streamed search still finds
    the layouts, counts and order of one pass over every valid layout."""
    import autopar.search.stream as stream
    import autopar.search.valid_space as valid_space
    from autopar.rules import Rule

    rule = Rule("test_no_full_recompute_with_zero3", lambda p, b: ~((b.recompute == 2) & (b.zero == 3)),
                lambda p, s: "test rule")
    monkeypatch.setattr(valid_space, "RULES", valid_space.RULES + (rule,))
    monkeypatch.setattr(stream, "CHUNK_ROWS", 2000)
    p, options = for_search(make_problem("llama3-70b", nodes=4, gbs=512, seq=8192), "megatron", None)
    count = count_space(p, options, [])
    assert ("experts", "recompute", "zero") in count.groups
    space = valid_layouts(p, options, [])
    assert not np.any((space.valid.recompute == 2) & (space.valid.zero == 3))
    expected, step, peak, fit, marginal = whole_batch_top(p, space, 100)
    got = stream.stream_costs(p, count, 0.1, keep=100)
    want = space.valid.take(expected)
    for f in fields(want):
        assert np.array_equal(getattr(got.top.batch, f.name), getattr(want, f.name)), f.name
    assert np.array_equal(got.top.step_s, step[expected])
    assert (got.fitting, got.marginal) == (len(fit), int(np.sum(marginal[fit])))
