"""``step_lower_bound_s`` never exceeds the step time the full costing gives, from any of the
layout's stage views or the slowest of them (the streamed search rules layouts out with it,
:mod:`autopar.search.stream`), and it is tight where it should be."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost.stage import bounding_stages
from autopar.cost.stage_time import stage_time
from autopar.cost.step import evaluate, makespan_lower_bound_s, step_lower_bound_s
from autopar.search.costing import view_counts
from autopar.search.constraints import parse_constraints, widen_space
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts
from conftest import make_problem

SPACES = [  # (model, nodes, gbs, seq, target, pins): dense, MoE with every dispatcher, MLA + MTP with vpp
    ("llama3-8b", 2, 256, 8192, "megatron", {}),
    ("qwen3-30b-a3b", 1, 64, 4096, "megatron", {"--ep": "8"}),
    ("deepseek-v3", 4, 1024, 4096, "megatron", {"--vpp": "2", "--sp": "on"}),
    ("llama3-8b", 2, 256, 8192, "torchtitan", {}),
]


@lru_cache(maxsize=None)
def _space(i: int):
    model, nodes, gbs, seq, target, pins = SPACES[i]
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=seq), target, None)
    constraints = parse_constraints(pins, {})
    return p, valid_layouts(p, widen_space(options, constraints), constraints).valid


@settings(max_examples=25, deadline=None)
@given(st.integers(0, len(SPACES) - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=40))
def test_lower_bound_never_exceeds_the_step_time(space, picks):
    p, valid = _space(space)
    batch = valid.take(np.asarray(picks) % len(valid))
    views = bounding_stages(p, batch)
    full = evaluate(p, batch, views, view_counts(batch))
    slowest = np.max([stage_time(p, batch, view).total_s for view in views], axis=0)
    for stage in [stage_time(p, batch, view) for view in views] + [slowest]:  # any stage, or the slowest
        bound = step_lower_bound_s(batch.num_microbatches, stage)
        assert np.all(bound <= full.step_time_s)
        assert np.all(bound > 0)


def test_bound_is_the_compute_of_one_stage_without_a_pipeline():
    """pp = 1, dp = 1: no bubble and no pipeline hand-offs; what the bound leaves out is the exposed
    data-parallel time and the optimizer step, so step - bound equals those two terms."""
    p, valid = _space(0)
    rows = np.flatnonzero((valid.pp == 1) & (valid.dp == 1))[:20]
    assert len(rows) > 0
    batch = valid.take(rows)
    views = bounding_stages(p, batch)
    full = evaluate(p, batch, views, view_counts(batch))
    bound = step_lower_bound_s(batch.num_microbatches, stage_time(p, batch, views[0]))
    rest = full.time_breakdown_s["dp_comm"] + full.time_breakdown_s["optimizer"] + full.time_breakdown_s["pp_comm"]
    assert np.allclose(full.step_time_s - bound, rest, rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, len(SPACES) - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=40))
def test_makespan_bound_is_the_makespan_and_floors_stay_below_it(space, picks):
    """From the views' stage times the bound is the step less its hand-offs, data-parallel and
    optimizer terms (the makespan); from their floors over every recompute setting
    (``stage_time(..., floor=True)``) it stays at or below the step."""
    p, valid = _space(space)
    batch = valid.take(np.asarray(picks) % len(valid))
    views = bounding_stages(p, batch)
    full = evaluate(p, batch, views, view_counts(batch))
    args = (batch.num_microbatches, batch.pp, batch.vpp, view_counts(batch))
    exact = makespan_lower_bound_s(*args, [stage_time(p, batch, view).total_s for view in views])
    b = full.time_breakdown_s
    rest = b["pp_comm"] + b["dp_comm"] + b["optimizer"]
    assert np.allclose(exact, full.step_time_s - rest, rtol=1e-12, atol=0)
    assert np.all(exact <= full.step_time_s)
    floors = makespan_lower_bound_s(*args, [stage_time(p, batch, view, floor=True).total_s for view in views])
    assert np.all(floors <= exact)
    assert np.all(floors >= step_lower_bound_s(batch.num_microbatches, stage_time(p, batch, views[0], floor=True)))
