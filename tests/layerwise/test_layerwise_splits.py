"""Galvatron-BMW's balanced pipeline splits in the layer-wise search (:mod:`autopar.layerwise.splits`)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.export import galvatron_layerwise
from autopar.layerwise import search_layerwise
from autopar.layerwise.splits import MAX_SPLITS, min_max_split, path
from autopar.search.grid import for_target


def test_min_max_split_by_hand():
    # six equal layers, the last stage carries 2 more (an output layer): 4 + 0 = 2 + 2
    assert min_max_split(np.ones((2, 6)), np.array([0.0, 2.0])) == (4, 2)
    # 1F1B memory: stage 0 holds 2 micro-batches of each layer's activation, stage 1 one: 2 x 2 = 4 x 1
    assert min_max_split(np.array([[2.0] * 6, [1.0] * 6]), np.zeros(2)) == (2, 4)
    # equal maxima (3): (3, 3, 2), (3, 2, 3), (2, 3, 3) all have 9 + 9 + 4; any is the most even
    assert sorted(min_max_split(np.ones((3, 8)), np.zeros(3))) == [2, 3, 3]


def _compositions(n: int, pp: int):
    for cuts in itertools.combinations(range(1, n), pp - 1):
        bounds = (0, *cuts, n)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4).flatmap(lambda pp: st.tuples(
    st.just(pp), st.integers(pp, 8).flatmap(lambda n: st.lists(
        st.lists(st.floats(0, 10, allow_nan=False), min_size=n, max_size=n), min_size=pp, max_size=pp)),
    st.lists(st.floats(0, 10, allow_nan=False), min_size=pp, max_size=pp))))
def test_min_max_split_reaches_the_brute_force_optimum(case):
    pp, cost, fixed = case
    cost, fixed = np.array(cost), np.array(fixed)

    def worst(split):
        ends = np.cumsum(split)
        return max(fixed[i] + cost[i, e - n:e].sum() for i, (n, e) in enumerate(zip(split, ends)))

    got = min_max_split(cost, fixed)
    assert len(got) == pp and sum(got) == cost.shape[1] and min(got) >= 1
    assert worst(got) == pytest.approx(min(worst(s) for s in _compositions(cost.shape[1], pp)), abs=1e-9)


def test_path_moves_one_layer_at_a_time():
    assert path((9, 11), (11, 9)) == [(9, 11), (10, 10), (11, 9)]
    steps = path((5, 7, 9, 11), (8, 8, 8, 8))
    assert steps[0] == (5, 7, 9, 11) and steps[-1] == (8, 8, 8, 8)
    for a, b in itertools.pairwise(steps):
        diff = np.subtract(b, a)
        assert sum(b) == 32 and sorted(diff[diff != 0]) == [-1, 1] and np.abs(diff).sum() == 2
        assert np.nonzero(diff)[0][1] - np.nonzero(diff)[0][0] == 1  # across one boundary
    assert path((8, 8), (8, 8)) == [(8, 8)]


def test_balanced_split_beats_the_even_one_with_a_large_vocabulary():
    """Llama-3-8B (vocabulary 128,256): the last stage's output layer and loss outweigh a decoder
    layer, so with pp 4 the even 8/8/8/8 split leaves the last stage slowest; the balanced
    candidates give it fewer layers and the whole plan is faster under the same model. Galvatron's
    JSON carries the split as pp_division."""
    p = for_target(make_problem("llama3-8b", gbs=64), "galvatron")
    even = search_layerwise(p, pp_options=[4], max_tp=4, balance=False)
    balanced = search_layerwise(p, pp_options=[4], max_tp=4)
    assert even.plan.layers_per_stage == (8, 8, 8, 8)
    assert balanced.cost.step_time_s < even.cost.step_time_s
    split = balanced.plan.layers_per_stage
    assert split != (8, 8, 8, 8) and split[-1] < 8 and sum(split) == 32
    assert even.cells < balanced.cells <= even.cells * (1 + MAX_SPLITS)  # the default split + the candidates
    doc = json.loads(galvatron_layerwise.write(p, balanced.plan))
    assert doc["pp_division"] == ",".join(map(str, split))
