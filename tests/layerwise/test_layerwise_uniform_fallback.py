"""A uniform layout is a layer-wise plan: ``search --layerwise`` gives the best uniform layout
(``search --target galvatron``'s #1) as its plan when that, costed as a plan, is faster than the
dynamic programme's (which ranks plans by the closed-form makespan); and the plan form of a uniform
layout keeps its vocabulary tp (``LayerwisePlan.uniform`` had set it to the layers' tp)."""

from __future__ import annotations

import pytest
from conftest import make_problem

from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.layerwise import uniform_plan
from autopar.layerwise.plan import LayerwisePlan
from autopar.search.grid import for_target
from autopar.strategy import Strategy


def _p():
    return for_target(make_problem("llama3-8b", nodes=2, gbs=128), "galvatron")


def test_uniform_plan_keeps_the_vocabulary_tp():
    p = _p()
    assert LayerwisePlan.uniform(p, Strategy(dp=16, mbs=1, zero=2, vocab_tp=2)).vocab_tp == 2
    assert LayerwisePlan.uniform(p, Strategy(dp=8, tp=2, mbs=1, zero=2)).vocab_tp == 2  # None: the layers' tp
    with pytest.raises(AutoparError, match="vocab_sp"):
        LayerwisePlan.uniform(p, Strategy(dp=16, mbs=1, zero=2, vocab_tp=2, vocab_sp=True))


def test_adopted_uniform_plan_costs_what_estimate_gives():
    p = _p()
    s = estimate(p, Strategy(dp=16, mbs=1, zero=2)).strategy
    plan, cost = uniform_plan(p, s, p.cluster.device.memory_bytes)
    assert set(plan.tp) == {1} and plan.default_zero == 2
    assert cost.step_time_s == pytest.approx(estimate(p, s).step_time_s, rel=1e-12)
    assert uniform_plan(p, s, 1e9) is None  # does not fit 1 GB
    assert uniform_plan(p, estimate(p, Strategy(dp=16, mbs=1, zero=1)).strategy, 1e12) is None  # ZeRO-1
