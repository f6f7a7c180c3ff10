"""The per-stage dynamic programme of :mod:`autopar.layerwise.dp` against exhaustive search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.layerwise.dp import solve_stage, solve_stages


def _brute(time_s, memory, transition, budget):
    """Least cost over every choice sequence within the budget (inf where none fits)."""
    n, k = time_s.shape
    best = np.inf
    for seq in itertools.product(range(k), repeat=n):
        if sum(memory[i, s] for i, s in enumerate(seq)) <= budget:
            cost = sum(time_s[i, s] for i, s in enumerate(seq)) + sum(transition[a, b] for a, b in zip(seq, seq[1:]))
            best = min(best, cost)
    return best


def _cost(time_s, transition, seq):
    return sum(time_s[i, s] for i, s in enumerate(seq)) + sum(transition[a, b] for a, b in zip(seq, seq[1:]))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 2 ** 32 - 1), st.integers(0, 14))
def test_dp_equals_exhaustive_search_with_integer_memory(n, k, seed, budget):
    """With integer memory and one unit per byte of spare budget the discretisation is exact, so
    the DP's optimum is the exhaustive one; transitions depend on a group label (tp) as in the
    layer-wise search."""
    rng = np.random.default_rng(seed)
    time_s = rng.random((n, k))
    memory = rng.integers(0, 5, (n, k)).astype(float)
    group = rng.integers(0, 3, k)
    moves = rng.random((3, 3))
    np.fill_diagonal(moves, 0.0)
    transition = moves[np.ix_(group, group)]
    spare = budget - memory.min(axis=1).sum()
    dp = solve_stage(time_s, memory, transition, max(budget, 1), bins=max(int(spare), 1) if spare > 0 else 1)
    got, pick = dp.best(budget)
    want = _brute(time_s, memory, transition, budget)
    if np.isinf(want):
        assert pick is None and np.isinf(got)
    else:
        assert got == pytest.approx(want)
        assert _cost(time_s, transition, pick) == pytest.approx(got)
        assert sum(memory[i, s] for i, s in enumerate(pick)) <= budget


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 2 ** 32 - 1), st.floats(0.5, 20.0), st.integers(2, 64))
def test_dp_plan_always_fits_its_budget(n, k, seed, budget, bins):
    """Whatever the discretisation, a returned plan fits (memory is rounded up), and it is never
    better than the exhaustive optimum."""
    rng = np.random.default_rng(seed)
    time_s, memory = rng.random((n, k)), rng.random((n, k)) * 4
    transition = np.zeros((k, k))
    dp = solve_stage(time_s, memory, transition, 20.0, bins=bins)
    got, pick = dp.best(budget)
    if pick is not None:
        assert sum(memory[i, s] for i, s in enumerate(pick)) <= budget + 1e-9
        assert got >= _brute(time_s, memory, transition, budget) - 1e-12


def test_dp_mixes_checkpointing_by_hand():
    """Three equal layers, choice 0 (no checkpoint: 1 s, 3 units) and 1 (checkpoint: 1.5 s,
    1 unit), budget 7: two layers without checkpoint (6) would leave 1 for the third, so the
    optimum is two plain + one checkpointed layer = 3.5 s (all plain needs 9, all checkpointed
    costs 4.5 s)."""
    time_s = np.array([[1.0, 1.5]] * 3)
    memory = np.array([[3.0, 1.0]] * 3)
    dp = solve_stage(time_s, memory, np.zeros((2, 2)), 7.0, bins=4)  # spare 7 - 3 = 4 units of 1
    total, pick = dp.best(7.0)
    assert total == pytest.approx(3.5)
    assert sorted(pick.tolist()) == [0, 0, 1]
    assert dp.best(2.9)[1] is None  # below the floor of three checkpointed layers
    assert solve_stage(time_s, memory, np.zeros((2, 2)), 9.0, bins=6).best(9.0)[0] == pytest.approx(3.0)


def test_dp_transition_cost_keeps_layers_together_by_hand():
    """Two choices per layer that differ only by 0.1 s on alternate layers; a transition costs
    1 s, so switching is never worth it: all layers take the choice with the smaller sum."""
    time_s = np.array([[1.0, 1.1], [1.1, 1.0], [1.0, 1.1], [1.1, 1.0]])
    transition = np.array([[0.0, 1.0], [1.0, 0.0]])
    total, pick = solve_stage(time_s, np.zeros((4, 2)), transition, 1.0).best(1.0)
    assert total == pytest.approx(4.2) and len(set(pick.tolist())) == 1
    free_total, _ = solve_stage(time_s, np.zeros((4, 2)), np.zeros((2, 2)), 1.0).best(1.0)
    assert free_total == pytest.approx(4.0)


def test_dp_batch_answers_each_stage_alone():
    rng = np.random.default_rng(3)
    time_s, memory = rng.random((3, 4, 3)), rng.random((3, 4, 3))
    transition = np.broadcast_to(np.ones((3, 3)) - np.eye(3), (3, 3, 3))
    together = solve_stages(time_s, memory, transition, 3.0, bins=32)
    for i in range(3):
        alone = solve_stage(time_s[i], memory[i], transition[i], 3.0, bins=32)
        assert together[i].best(2.0)[0] == pytest.approx(alone.best(2.0)[0])


def test_dp_rejects_bad_shapes():
    with pytest.raises(ValueError, match="transition"):
        solve_stage(np.ones((2, 2)), np.ones((2, 2)), np.ones((3, 3)), 1.0)
    with pytest.raises(ValueError, match="must be positive"):
        solve_stage(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), 0.0)
