"""The vocabulary layers on their own tp (Galvatron's ``vtp``) in a layer-wise plan cost what the
uniform model gives them (:mod:`autopar.cost.vocab`, one formula): their all-reduce over ``vtp``
ranks and the re-sharding gather at the boundary with the decoder layers' tp, per end.

By hand, Llama-3-8B on 2 x 8 H100, sequence 4096, 64 micro-batches of mbs 1 at tp 1 (128 with pp 2): a rank's
micro-batch activation is ``a = 2 B * 4096 * 4096``; with ``vtp = 2`` each vocabulary layer
all-reduces ``2a`` over its 2 ranks and gathers ``2a`` from 2 ranks at its boundary; with
``vtp = 1`` it has no collective. Its compute does not depend on vtp.
"""

from __future__ import annotations

import pytest
from conftest import make_problem

from autopar.cost import comm
from autopar.estimate import estimate
from autopar.layerwise import LayerwisePlan, evaluate_plan
from autopar.search.grid import for_target
from autopar.strategy import Strategy

ACT_BYTES = 2 * 4096 * 4096


@pytest.fixture(scope="module")
def p():
    return for_target(make_problem("llama3-8b", nodes=2, gbs=1024), "galvatron")


@pytest.mark.parametrize("pp, ends", [(1, [2]), (2, [1, 1])])
def test_vocabulary_tp_adds_its_collectives_per_end(p, pp, ends):
    """tp-1 layers, vtp 2 against vtp 1: each stage's per-micro-batch time grows by one all-reduce
    and one boundary gather per vocabulary layer it holds (both on a single stage)."""
    plan = LayerwisePlan(pp=pp, num_microbatches=64 * pp, layers_per_stage=(32 // pp,) * pp, tp=(1,) * 32,
                         zero3=(False,) * 32, recompute=(False,) * 32, default_zero=2, vocab_tp=1)
    one = evaluate_plan(p, plan).stage_microbatch_s
    two = evaluate_plan(p, plan.model_copy(update={"vocab_tp": 2})).stage_microbatch_s
    per_end = float(comm.all_reduce_s(p, 2 * ACT_BYTES, 2, 1) + comm.all_gather_s(p, 2 * ACT_BYTES, 2, 1))
    assert [b - a for a, b in zip(one, two)] == pytest.approx([n * per_end for n in ends], rel=1e-9)


@pytest.mark.parametrize("vocab_tp", [1, 2, 4, 8])
def test_vocabulary_tp_choice_agrees_with_estimate(p, vocab_tp):
    """The disagreement a user met (``search --layerwise`` on llama3-8b, 16 H100): the uniform
    layout tp 1 with vtp 2 cost one step under ``estimate`` and another as a layer-wise plan.
    Now the plan form costs every vtp as ``estimate`` does (step and memory)."""
    s = Strategy(dp=16, mbs=1, zero=2, vocab_tp=vocab_tp)
    e = estimate(p, s)
    c = evaluate_plan(p, LayerwisePlan.uniform(p, s))
    assert c.step_time_s == pytest.approx(e.step_time_s, rel=1e-12)
    assert c.peak_memory_bytes == pytest.approx(e.peak_memory_bytes, rel=1e-12)
