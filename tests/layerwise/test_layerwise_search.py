"""Layer-wise plans costed by autopar's model and found by the layer-wise search."""

from __future__ import annotations

import math

import pytest
from conftest import link_bandwidths, make_problem
from pydantic import ValidationError

from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.layerwise import LayerwisePlan, evaluate_plan, search_layerwise
from autopar.layerwise.search import stage_split
from autopar.layerwise.tables import pair_table, reshard_s
from autopar.strategy import Strategy


@pytest.fixture(scope="module")
def llama7b():
    """Galvatron's Llama-7B problem (benchmarks/bench_layerwise.py): 8 x A100-40GB, gbs 64, seq 4096."""
    return make_problem("llama2-7b", device="a100-40gb", gbs=64, seq=4096)


@pytest.mark.parametrize("s", [
    Strategy(dp=4, tp=2, mbs=2, zero=2),
    Strategy(dp=8, mbs=1, zero=3, recompute="full"),
    Strategy(dp=2, tp=2, pp=2, mbs=1, zero=0),
    Strategy(dp=1, tp=4, pp=2, mbs=2, zero=0, sp=True, recompute="full"),
    Strategy(dp=2, pp=4, mbs=1, zero=2),
    Strategy(dp=1, tp=2, pp=4, mbs=2, zero=3, recompute="full"),
    Strategy(dp=8, mbs=1, zero=2, vocab_tp=2),
    Strategy(dp=4, tp=2, mbs=2, zero=3, vocab_tp=1),
    Strategy(dp=4, tp=1, pp=2, mbs=1, zero=2, vocab_tp=4),
    Strategy(dp=2, tp=2, pp=2, mbs=1, zero=0, vocab_tp=4, recompute="full"),
])
def test_uniform_plan_costs_what_estimate_says(llama7b, s):
    """A plan with every layer alike is the uniform layout: the sums of per-layer terms give
    estimate's step time and memory (the once-per-step terms are shared out per stage, so their
    overlap with the stage's backward is the uniform layout's), also with the vocabulary on its
    own tp (Galvatron's vtp): the stages' fixed parts are then the uniform layout's own, the
    re-sharding to the layers' tp included (one formula, :mod:`autopar.cost.vocab`)."""
    e = estimate(llama7b, s)
    c = evaluate_plan(llama7b, LayerwisePlan.uniform(llama7b, s))
    assert c.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
    assert c.step_time_s == pytest.approx(e.step_time_s, rel=1e-9)


@pytest.mark.parametrize("s", [
    Strategy(dp=2, tp=2, pp=2, mbs=1, zero=2, layers_per_stage=(17, 15)),
    Strategy(dp=2, tp=1, pp=4, mbs=1, zero=0, recompute="full", layers_per_stage=(6, 9, 9, 8)),
    Strategy(dp=1, tp=2, pp=4, mbs=1, zero=3, recompute="full", layers_per_stage=(8, 9, 9, 6)),
    Strategy(dp=2, tp=2, pp=2, mbs=1, zero=2, layers_per_stage=(17, 15), vocab_tp=4),
])
def test_uniform_plan_on_uneven_stages_costs_what_estimate_says(s):
    """Unequal stages (Galvatron-BMW's balanced splits of llama3-8b, whose 128k vocabulary weighs on
    the first and last stage): estimate simulates their 1F1B pipeline, so the plan is costed so too,
    and its step is estimate's to rounding (new-user report: layer-wise 8.366 s, uniform 8.364 s
    for one layout). The per-stage sums are linear, the simulation sees the same forward, backward
    and recompute seconds, the p2p hand-offs are the same 2 (m + pp - 2) sends and the step's tail
    is one stage's data-parallel plus optimizer time on both sides."""
    p = make_problem("llama3-8b", device="h100-80gb", gbs=128, seq=8192)
    e = estimate(p, s)
    c = evaluate_plan(p, LayerwisePlan.uniform(p, s))
    assert c.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-9)
    assert c.step_time_s == pytest.approx(e.step_time_s, rel=1e-12)


def test_tight_memory_checkpoints_only_some_layers(llama7b):
    """Between the memory of no checkpointing and of checkpointing every layer, the DP
    checkpoints some layers only (Galvatron's point, VLDB 2023 sec. 4): faster than checkpointing
    all, fitting where none does not, and at most one layer more than the fewest that fit (the
    discretisation rounds memory up)."""
    none = evaluate_plan(llama7b, LayerwisePlan.uniform(llama7b, Strategy(dp=8, mbs=1, zero=2)))
    full = evaluate_plan(llama7b, LayerwisePlan.uniform(llama7b, Strategy(dp=8, mbs=1, zero=2, recompute="full")))
    limit = (none.peak_memory_bytes + full.peak_memory_bytes) / 2
    r = search_layerwise(llama7b, pp_options=[1], max_tp=1, zero3=False, default_zeros=(2,), memory_limit_bytes=limit)
    k = sum(r.plan.recompute)
    assert 0 < k < 32 and r.cost.fits
    assert list(r.plan.recompute) == [False] * (32 - k) + [True] * k  # equal layers grouped
    assert none.step_time_s < r.cost.step_time_s < full.step_time_s
    fewer = r.plan.model_copy(update={"recompute": tuple(i < k - 2 for i in range(32))})  # two checkpoints fewer
    assert evaluate_plan(llama7b, fewer, limit).peak_memory_bytes > limit


def test_search_is_no_slower_than_any_uniform_layout_in_its_space(llama7b):
    """Every uniform layout is a layer-wise plan, so the search's best is at least as fast as
    each that fits with a margin (the DP rounds memory up by under 1%)."""
    limit = llama7b.cluster.device.memory_bytes
    r = search_layerwise(llama7b, pp_options=[1, 2], max_tp=2)
    assert r.cost.fits
    checked = 0
    for pp in (1, 2):
        for tp in (1, 2):
            dp = 8 // (pp * tp)
            for mbs in (1, 2, 4):
                if 64 % (dp * mbs):
                    continue
                for zero in (0, 2, 3):
                    for recompute in ("none", "full"):
                        s = Strategy(dp=dp, tp=tp, pp=pp, mbs=mbs, zero=zero, recompute=recompute)
                        c = evaluate_plan(llama7b, LayerwisePlan.uniform(llama7b, s))
                        if c.peak_memory_bytes <= 0.99 * limit:
                            checked += 1
                            assert r.cost.step_time_s <= c.step_time_s + 1e-9, s
    assert checked > 10


def test_reshard_is_one_all_gather_of_the_larger_micro_batch(llama7b):
    """tp 1 -> 2 at pp 1 and 8 micro-batches: the tp-2 layer's micro-batch is 64 / (4 * 8) = 2
    sequences of 4096 x 4096 bf16 = 2 * 2 * 4096 * 4096 bytes, gathered over g = 2 ranks inside
    the node: (g - 1) / g * bytes / bus bandwidth + (g - 1) * latency (comm.py's ring)."""
    a = pair_table(llama7b, 1, 8, (32,), 1, 2, False)
    b = pair_table(llama7b, 1, 8, (32,), 2, 2, False)
    intra, _ = link_bandwidths(llama7b)
    want = 0.5 * (2 * 2 * 4096 * 4096) / intra + llama7b.cluster.device.intra_node_latency_s
    assert reshard_s(llama7b, a, b) == pytest.approx(want) == pytest.approx(reshard_s(llama7b, b, a))
    assert reshard_s(llama7b, a, a) == 0.0


def test_changing_tp_between_layers_costs_the_reshards(llama7b):
    """Alternating tp 1 / 2 over 32 layers costs 31 reshards per micro-batch more than the same
    layers grouped (one reshard), everything else being the same sums."""
    base = dict(pp=1, num_microbatches=8, layers_per_stage=(32,), zero3=(False,) * 32, recompute=(False,) * 32,
                default_zero=2, vocab_tp=1)
    alternating = LayerwisePlan(tp=tuple(1 + i % 2 for i in range(32)), **base)
    grouped = LayerwisePlan(tp=(1,) * 16 + (2,) * 16, **base)
    one = reshard_s(llama7b, pair_table(llama7b, 1, 8, (32,), 1, 2, False), pair_table(llama7b, 1, 8, (32,), 2, 2, False))
    gap = evaluate_plan(llama7b, alternating).step_time_s - evaluate_plan(llama7b, grouped).step_time_s
    assert gap == pytest.approx(8 * 30 * one, rel=1e-6)  # 31 - 1 reshards in each of 8 micro-batches


def test_layerwise_refuses_moe_and_bad_plans(llama7b):
    with pytest.raises(AutoparError, match="MoE"):
        search_layerwise(make_problem("qwen3-30b-a3b", nodes=2))
    with pytest.raises(ValidationError, match="one entry per layer"):
        LayerwisePlan(pp=1, num_microbatches=1, layers_per_stage=(2,), tp=(1, 1), zero3=(False,), recompute=(False,) * 2)
    with pytest.raises(ValidationError, match="positive parts"):
        LayerwisePlan(pp=2, num_microbatches=1, layers_per_stage=(2, 0), tp=(1, 1), zero3=(False,) * 2,
                      recompute=(False,) * 2)
    short = LayerwisePlan(pp=1, num_microbatches=8, layers_per_stage=(2,), tp=(1, 1), zero3=(False,) * 2,
                          recompute=(False,) * 2)
    with pytest.raises(AutoparError, match="has 2 layers"):
        evaluate_plan(llama7b, short)
    odd = LayerwisePlan(pp=1, num_microbatches=3, layers_per_stage=(32,), tp=(1,) * 32, zero3=(False,) * 32,
                        recompute=(False,) * 32)
    with pytest.raises(AutoparError, match="num_microbatches=3 does not divide"):
        evaluate_plan(llama7b, odd)
    assert math.isfinite(evaluate_plan(llama7b, odd.model_copy(update={"num_microbatches": 4})).step_time_s)


def test_stage_split_is_megatrons_or_as_even_as_possible():
    assert stage_split(32, 4) == (8, 8, 8, 8)
    assert stage_split(80, 32) == (2,) + (3,) * 16 + (2,) * 15  # 80 = 32 x 2 + 16 extra, middle stages first
    assert stage_split(7, 7) == (1,) * 7
