"""Several layouts' pipelines simulated in one pass (autopar.pipeline.makespan.batch_makespans_s,
autopar.estimate.estimate_many, autopar.pipeline.rebalance.rebalance_many): each layout gets
exactly the numbers it gets alone, and the 1F1B closed form holds for every row of a batch."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.estimate import estimate, estimate_many
from autopar.pipeline.makespan import batch_makespans_s, static_makespans_s
from autopar.pipeline.rebalance import TableCache, rebalance_estimate, rebalance_many
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.strategy import Strategy


def test_two_layouts_in_one_batch_follow_the_1f1b_closed_form():
    """Equal stages, pp 4, m 8: (m + pp - 1) * (t_f + t_b) (Narayanan et al., SC'21, sec. 2.2.1):
    t_f 1, t_b 2 gives 11 * 3 = 33 s; t_f 2, t_b 4 gives 66 s. With a 0.5 s p2p per hop the
    first layout's row equals the event simulation (autopar.pipeline.simulate)."""
    fwd = np.stack([np.full((4, 1), 1.0), np.full((4, 1), 2.0)])
    spans = batch_makespans_s(fwd, 2 * fwd, np.zeros_like(fwd), np.array([[0.0, 0.5], [0.0, 0.0]]), 8, "1f1b")
    with_p2p = simulate(PipelineTimes.uniform(4, 1, 1.0, 2.0, p2p_s=0.5), 8, "1f1b").makespan_s
    assert with_p2p > 33.0
    assert spans.tolist() == [[pytest.approx(33.0), pytest.approx(with_p2p)], [pytest.approx(66.0)] * 2]


@settings(max_examples=20, deadline=None)
@given(pp=st.integers(2, 4), vpp=st.sampled_from([1, 2]), groups=st.integers(1, 30), n=st.integers(2, 4),
       seed=st.integers(0, 2**16), p2p_s=st.sampled_from([0.0, 0.05]))
def test_a_batch_gives_each_layout_what_it_gets_alone(pp, vpp, groups, n, seed, p2p_s):
    """Uneven per-(rank, chunk) times, up to 120 micro-batches (extrapolated past 10 * pp, so
    layouts may need different warm-ups): the batch equals each layout alone, to the bit."""
    rng = np.random.default_rng(seed)
    fwd, bwd, rec = (rng.uniform(0.5, 2.0, (n, pp, vpp)) for _ in range(3))
    rec[0] = 0.0
    m = groups * pp if vpp > 1 else groups
    schedule = "interleaved" if vpp > 1 else "1f1b"
    p2p = np.tile([0.0, p2p_s], (n, 1))
    batched = batch_makespans_s(fwd, bwd, rec, p2p, m, schedule)
    alone = [static_makespans_s(PipelineTimes(fwd[i], bwd[i], rec[i]), p2p[i], m, schedule) for i in range(n)]
    assert np.array_equal(batched, np.stack(alone))


@pytest.fixture(scope="module")
def p():
    return make_problem("llama3-8b", device="a100-80gb", gbs=64, seq=4096)


LAYOUTS = [  # 32 layers: uneven splits are simulated, two of them share one shape (pp 4, m 32)
    Strategy(dp=2, pp=4, layers_per_stage=(7, 9, 8, 8)),
    Strategy(dp=2, pp=4, layers_per_stage=(9, 7, 8, 8), recompute="selective"),
    Strategy(dp=1, tp=2, pp=4, layers_per_stage=(6, 10, 8, 8)),
    Strategy(dp=2, pp=4, recompute="full"),
    Strategy(dp=4, pp=2, vpp=2, schedule="interleaved", layers_per_stage=(14, 18)),
]


def test_estimate_many_equals_estimate_one_by_one(p):
    assert [e.to_dict(64) for e in estimate_many(p, LAYOUTS)] == [estimate(p, s).to_dict(64) for s in LAYOUTS]


@pytest.mark.parametrize("target", ["megatron", "sapp"])
def test_rebalance_many_equals_rebalance_one_by_one(p, target):
    """Megatron re-balances each uneven split; SAPP may also pick a recompute option per stage."""
    estimates = estimate_many(p, LAYOUTS)
    together = rebalance_many(p, estimates, 0.1, target, use_ilp=False)
    alone = [rebalance_estimate(p, e, 0.1, target, use_ilp=False) for e in estimates]
    assert [e.to_dict(64) for e in together] == [e.to_dict(64) for e in alone]
    assert any(a.strategy != e.strategy for a, e in zip(together, estimates))  # something was re-balanced


def test_rebalance_many_fills_the_callers_table_cache(p):
    """The caller's empty TableCache is used, not replaced (an empty cache is falsy: ``__len__``),
    so the search's top-k and its integer-program polish share one layer table per shard shape."""
    cache = TableCache()
    rebalance_many(p, estimate_many(p, LAYOUTS), 0.1, "megatron", cache, use_ilp=False)
    assert len(cache) > 0


def test_estimate_many_of_mixed_pipeline_depths_equals_one_by_one():
    """DeepSeek-V3-like stages (MoE, MLA, MTP on the last stage) of layouts with pp 1, 2 and 4,
    costed in one pass, equal each layout costed alone."""
    q = make_problem("deepseek-v3", nodes=8, gbs=512, seq=4096)
    layouts = [Strategy(dp=8, tp=8, pp=1, ep=8, sp=True, recompute="full"),
               Strategy(dp=4, tp=8, pp=2, ep=4, sp=True, recompute="full"),
               Strategy(dp=2, tp=8, pp=4, ep=2, sp=True, recompute="selective")]
    assert [e.to_dict(512) for e in estimate_many(q, layouts)] == [estimate(q, s).to_dict(512) for s in layouts]
