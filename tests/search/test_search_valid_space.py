"""The search's fast path gives the numbers of the full enumeration (issue 20).

:func:`autopar.search.valid_space.valid_layouts` builds only the valid layouts and counts the
others per block; :func:`autopar.search.costing.search_costs` costs memory first, time only
where the layout fits, each stage view only where it is a stage, and each term once per distinct
key. These tests hold them to the full path (every row enumerated, checked and costed) and pin
search results to the numbers ``main`` gave before the change (copied from its ``--json``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.cost.stage import bounding_stages
from autopar.cost.step import evaluate
from autopar.rules import RULES, Rule
from autopar.search import search
from autopar.search.constraints import apply_constraints, parse_constraints, widen_space
from autopar.search.costing import search_costs, view_counts
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts
from autopar.space import enumerate_layouts
from conftest import make_problem


def _full(p, options, constraints, rules=RULES):
    """Reference: every layout enumerated, constraints then ``rules`` applied row by row."""
    batch = enumerate_layouts(p, options)
    kept, removed = apply_constraints(batch, constraints)
    failed = np.full(len(batch), -1)
    for i, rule in enumerate(rules):
        bad = kept & (failed < 0) & ~np.broadcast_to(np.asarray(rule.check(p, batch), dtype=bool), (len(batch),))
        failed[bad] = i
    rejected = {r.name: int(np.sum(kept & (failed == i))) for i, r in enumerate(rules) if np.any(kept & (failed == i))}
    return batch.take(np.flatnonzero(kept & (failed < 0))), len(batch), removed, rejected


def _same_batch(a, b) -> bool:
    return all(np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))


CASES = [
    ("llama3-70b", 8, 1024, "megatron", {}),
    ("llama3-70b", 8, 1024, "torchtitan", {"--tp": "4,8", "--zero": "1", "--mbs": "1,16"}),
    ("deepseek-v3", 4, 1024, "megatron", {"--vpp": "2", "--sp": "on"}),
    ("qwen3-30b-a3b", 1, 64, "megatron", {"--ep": "8", "--recompute": "full"}),
    ("gemma2-9b", 2, 256, "megatron", {}),
]


@pytest.mark.parametrize("model,nodes,gbs,target,pins", CASES)
def test_valid_layouts_match_the_full_enumeration(model, nodes, gbs, target, pins):
    p, options = for_search(make_problem(model, nodes=nodes, gbs=gbs, seq=8192), target, None)
    constraints = parse_constraints(pins, {})
    # torchtitan's V-schedule copies, like Galvatron's variants, come from the full enumeration only
    # (autopar.search.grid.costed_grid); the fast path covers the rest of the space
    options = dataclasses.replace(widen_space(options, constraints), v_schedules=False)
    valid, enumerated, removed, rejected = _full(p, options, constraints)
    space = valid_layouts(p, options, constraints)
    assert _same_batch(space.valid, valid)
    assert (space.enumerated, space.removed, space.rejected) == (enumerated, removed, rejected)
    assert list(space.rejected) == list(rejected)  # rule order kept
    assert len(space.keys) == len(valid)


def test_a_rule_reading_two_factors_merges_them(monkeypatch):
    """A rule that reads ZeRO and recompute (two factors) and one that reads mbs and the CP
    algorithm (not adjacent in the row order) still give the full path's rows, order and counts."""
    extra = (Rule("toy_zero_recompute", lambda p, b: ~((b.zero == 3) & (b.recompute == 2)), lambda p, s: ""),
             Rule("toy_mbs_cp", lambda p, b: ~((b.mbs == 2) & (b.cp_comm == 1)), lambda p, s: ""))
    rules = RULES[:3] + extra + RULES[3:]
    monkeypatch.setattr("autopar.search.valid_space.RULES", rules)
    p, options = for_search(make_problem("llama3-8b", nodes=2, gbs=256, seq=8192), "megatron", None)
    valid, enumerated, removed, rejected = _full(p, options, [], rules)
    space = valid_layouts(p, options, [])
    assert rejected["toy_zero_recompute"] > 0 and rejected["toy_mbs_cp"] > 0
    assert _same_batch(space.valid, valid)
    assert (space.enumerated, space.rejected) == (enumerated, rejected)


def test_search_costs_match_evaluate_where_layouts_fit():
    p, options = for_search(make_problem("llama3.1-405b", nodes=32, gbs=512, seq=8192), "megatron", None)
    space = valid_layouts(p, options, [])
    capacity = p.cluster.device.memory_bytes
    fast = search_costs(p, space.valid, capacity, space.keys)
    full = evaluate(p, space.valid, bounding_stages(p, space.valid), view_counts(space.valid))
    fits = full.peak_memory_bytes <= capacity
    assert 0 < fits.sum() < len(fits)
    assert np.array_equal(fast.peak_memory_bytes, full.peak_memory_bytes)
    assert np.array_equal(fast.step_time_s[fits], full.step_time_s[fits])
    assert np.all(np.isinf(fast.step_time_s[~fits]))
    for key, value in full.time_breakdown_s.items():
        assert np.array_equal(fast.time_breakdown_s[key][fits], value[fits]), key
    assert np.array_equal(fast.mfu[fits], full.mfu[fits])


# Numbers copied from `autopar search ... --json` on main before the fast path (commit 21889ef), re-copied
# where the TP-overlap model changed on purpose (overlap hidden only under its own block's GEMMs, h/recipe)
# and where the backward's element-wise bytes changed (autopar.cost.elementwise_backward, h/denseacc), and
# where the step's tail became one stage's dp + optimizer time (autopar.cost.step.combine, h/ux2: pp2x10, -3e-8 s).
def test_llama3_70b_on_64_h100_as_before():
    r = search(make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192), top_k=3)
    assert r.enumerated == 175568
    assert r.rejected == {"tp_divides_kv_heads": 13440, "sp_needs_tp": 23104, "uneven_layer_split": 496}
    assert (r.out_of_memory, r.marginal) == (86783, 6240)
    # tp 8 with TP overlap pays the 16 SMs of TE's default userbuffers kernels on six GEMMs per layer
    # (autopar.cost.userbuffers_sm): tp 1 with cp 4 and ZeRO-3 ranks first, its three CP algorithms.
    top = [(e.strategy.tp, e.strategy.cp, e.strategy.mbs, e.strategy.zero, e.strategy.cp_comm_type) for e in r.layouts]
    assert top == [(1, 4, 1, 3, "allgather"), (1, 4, 1, 3, "a2a"), (1, 4, 1, 3, "p2p")]
    assert [e.step_time_s for e in r.layouts] == pytest.approx([116.30800789994436, 116.80391881194436,
                                                                117.0074220652415], rel=1e-12)
    assert [e.peak_memory_bytes for e in r.layouts] == [71536011520.0] * 3


def test_constrained_search_as_before():
    from autopar.search.constraints import parse_constraints as parse

    constraints = parse({"--tp": "4,8", "--zero": "1"}, {"--no-cp": True})
    r = search(make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192), top_k=1, constraints=constraints)
    assert (r.enumerated, r.rejected, r.out_of_memory, r.marginal) == (175568, {}, 1539, 130)
    assert r.constraints == {"--tp 4,8": 114128, "--zero 1": 46080, "--no-cp": 13116}
    assert r.layouts[0].step_time_s == pytest.approx(119.63160550191309, rel=1e-12)


def test_llama2_7b_on_8_a100_as_before():
    r = search(make_problem("llama2-7b", device="a100-80gb", gbs=64, seq=4096), top_k=3)
    assert (r.enumerated, r.rejected, r.out_of_memory, r.marginal) == (20736, {"sp_needs_tp": 5184}, 1308, 314)
    assert [(e.strategy.mbs, e.strategy.zero) for e in r.layouts] == [(2, 2), (1, 1), (1, 2)]
    assert [e.step_time_s for e in r.layouts] == pytest.approx([7.302325729202489, 7.310101729202489,
                                                                7.310101729202489], rel=1e-12)
    assert [e.peak_memory_bytes for e in r.layouts] == [64811515904.0, 70540785664.0, 46956331008.0]

