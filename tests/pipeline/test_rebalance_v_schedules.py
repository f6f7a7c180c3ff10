"""Re-balancing leaves torchtitan's V schedules (ZB-V, DualPipeV) as they are: their two chunks per
rank must be equal, so an uneven split proposed for them was an invalid layout that stopped the
whole search (``search --model llama3-8b --target torchtitan --top 50``: "schedule zbv needs 4
equal chunks, got [7, 9, 7, 9]")."""

from __future__ import annotations

from autopar.estimate import estimate
from autopar.pipeline.rebalance import rebalance_many
from autopar.search import search
from autopar.strategy import V_SCHEDULE_NAMES, Strategy
from conftest import make_problem


def test_a_v_schedule_is_not_rebalanced():
    p = make_problem("llama3-8b", gbs=1024)
    zbv = Strategy(dp=2, tp=2, pp=2, vpp=2, mbs=1, schedule="zbv", recompute="none")
    e = estimate(p, zbv)
    assert e.strategy.layers_per_stage == (16, 16)
    assert rebalance_many(p, [e], 0.1, "torchtitan")[0].strategy == e.strategy


def test_torchtitan_search_deep_enough_to_reach_v_schedules():
    p = make_problem("llama3-8b", gbs=1024)
    layouts = search(p, top_k=50, target="torchtitan").layouts
    v = [e.strategy for e in layouts if e.strategy.schedule in V_SCHEDULE_NAMES]
    assert v, "the top 50 holds V-schedule layouts (the walk reached the re-balancing of one)"
    assert all(len(set(s.layers_per_stage)) == 1 for s in v)
