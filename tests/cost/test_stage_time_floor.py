"""``stage_time(..., floor=True)`` never exceeds the stage time under any recompute setting of the
row (the streamed search rules layouts out with it before costing their recompute options,
:mod:`autopar.search.stream`), and it is the stage time itself where the row has no recompute and
nothing the floor leaves out."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost.stage import bounding_stages
from autopar.cost.stage_time import stage_time, without_recompute
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts

SPACES = [  # (model, nodes, gbs, seq, target, train options): dense, MoE, MLA + MTP, torchtitan, host-bound
    ("llama3-8b", 2, 256, 8192, "megatron", {}),
    ("qwen3-30b-a3b", 1, 64, 4096, "megatron", {}),
    ("deepseek-v3", 4, 1024, 4096, "megatron", {}),
    ("llama3-8b", 2, 256, 8192, "torchtitan", {}),
    ("llama3-8b", 1, 64, 4096, "megatron", {"launch_blocking": True}),
    ("llama3-8b", 1, 64, 4096, "megatron", {"activation_offload_layers": 2}),
    ("llama2-7b", 1, 64, 4096, "deepspeed", {}),
]


@lru_cache(maxsize=None)
def _space(i: int):
    model, nodes, gbs, seq, target, train = SPACES[i]
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=seq, **train), target, None)
    return p, valid_layouts(p, options, []).valid


@settings(max_examples=40, deadline=None)
@given(st.integers(0, len(SPACES) - 1), st.lists(st.integers(0, 2**31), min_size=1, max_size=40), st.integers(0, 2))
def test_floor_never_exceeds_the_stage_time_of_any_recompute_setting(space, picks, view):
    p, valid = _space(space)
    batch = valid.take(np.asarray(picks) % len(valid))
    stages = bounding_stages(p, batch)[view]
    floor = stage_time(p, batch, stages, floor=True).total_s
    assert np.all(floor <= stage_time(p, batch, stages).total_s)
    for code, layers, modules in ((0, 0, 0), (1, 0, 1), (2, 0, 0), (2, 1, 0)):  # none, selective, full, full on 1
        other = replace(batch, recompute=np.full(len(batch), code), recompute_layers=np.full(len(batch), layers),
                        recompute_modules=np.full(len(batch), modules))
        assert np.all(floor <= stage_time(p, other, stages).total_s)
    assert np.all(floor > 0)


def test_floor_reads_no_recompute_column():
    """Rows that differ only in their recompute setting have one floor."""
    p, valid = _space(2)
    rows = np.flatnonzero(valid.recompute > 0)[:50]
    batch = valid.take(rows)
    stages = bounding_stages(p, batch)[0]
    assert np.array_equal(stage_time(p, batch, stages, floor=True).total_s,
                          stage_time(p, without_recompute(batch), stages, floor=True).total_s)


def test_floor_is_the_stage_time_without_recompute_or_overlap():
    """With no recompute, no TP overlap and no activation offload the floor leaves nothing out."""
    p, valid = _space(0)
    rows = np.flatnonzero((valid.recompute == 0) & ~valid.tp_comm_overlap)[:50]
    assert len(rows) == 50
    batch = valid.take(rows)
    stages = bounding_stages(p, batch)[2]
    assert np.array_equal(stage_time(p, batch, stages, floor=True).total_s, stage_time(p, batch, stages).total_s)
