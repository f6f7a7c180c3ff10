"""Ulysses layers in layer-wise plans (Galvatron's per-layer ``use_sp``): costed as the uniform
layout with tp 1 and ``cp = tp`` over all-to-all, searched where Megatron SP is on."""

from __future__ import annotations

import json

import pytest
from conftest import make_problem
from pydantic import ValidationError

from autopar.export import galvatron_layerwise
from autopar.layerwise import LayerwisePlan, evaluate_plan, search_layerwise
from autopar.layerwise.plan import candidate_strategy
from autopar.layerwise.tables import pair_table, reshard_s
from autopar.search.grid import for_target

BASE = dict(pp=1, num_microbatches=8, layers_per_stage=(32,), zero3=(False,) * 32, recompute=(False,) * 32,
            default_zero=2, vocab_tp=2)


@pytest.fixture(scope="module")
def llama7b():
    return make_problem("llama2-7b", device="a100-40gb", gbs=64, seq=4096)


def test_a_ulysses_layer_is_tp1_with_cp_over_all_to_all(llama7b):
    """Same dp (8 / 2 = 4) and micro-batch (64 / (4 x 8) = 2) as the tp-2 layer it replaces."""
    tp = candidate_strategy(llama7b, 1, 8, (32,), 2, 2, False, True)
    u = candidate_strategy(llama7b, 1, 8, (32,), 2, 2, False, True, ulysses=True)
    assert (tp.tp, tp.cp, tp.sp) == (2, 1, True)
    assert (u.tp, u.cp, u.cp_comm_type, u.sp) == (1, 2, "a2a", False)
    assert (u.dp, u.mbs) == (tp.dp, tp.mbs) == (4, 2)


def test_ulysses_keeps_whole_weights_on_its_ranks(llama7b):
    """Per layer, a ZeRO-2 Ulysses layer holds its whole bf16 weights (2 bytes per parameter) where
    the tp-2 layer holds half; its gradient and optimizer shards are spread over dp x cp = 8 ranks
    as the tp-2 layer's half over dp = 4, the same bytes: the layer's static bytes differ by
    1 byte per parameter (q, k, v, o and the gated MLP of Llama-2-7B; norms aside)."""
    tp = pair_table(llama7b, 1, 8, (32,), 2, 2, True)
    u = pair_table(llama7b, 1, 8, (32,), 2, 2, True, ulysses=True)
    params = 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert u.static_bytes[0] - tp.static_bytes[0] == pytest.approx(params, rel=1e-3)


def test_same_size_ulysses_and_tp_layers_hand_over_unchanged(llama7b):
    """Galvatron builds no re-distribution between groups of one size and placement; a size change
    costs what the tp change costs."""
    tp2 = pair_table(llama7b, 1, 8, (32,), 2, 2, True)
    u2 = pair_table(llama7b, 1, 8, (32,), 2, 2, True, ulysses=True)
    tp4 = pair_table(llama7b, 1, 8, (32,), 4, 2, True)
    assert reshard_s(llama7b, tp2, u2) == reshard_s(llama7b, u2, tp2) == 0.0
    assert reshard_s(llama7b, u2, tp4) == reshard_s(llama7b, tp2, tp4) > 0


def test_plan_rules(llama7b):
    with pytest.raises(ValidationError, match="needs tp > 1"):
        LayerwisePlan(tp=(1,) * 32, ulysses=(True,) + (False,) * 31, sp=True, **BASE)
    with pytest.raises(ValidationError, match="the plan needs sp"):
        LayerwisePlan(tp=(2,) * 32, ulysses=(True,) * 32, **BASE)
    assert LayerwisePlan(tp=(2,) * 32, **BASE).ulysses == (False,) * 32


def test_mixing_ulysses_layers_costs_their_layers(llama7b):
    """Half the layers Ulysses: the step lies between all-TP and all-Ulysses (no re-sharding
    between them), and the memory too."""
    plans = [LayerwisePlan(tp=(2,) * 32, ulysses=tuple(i < k for i in range(32)), sp=True, **BASE) for k in (0, 16, 32)]
    steps = [evaluate_plan(llama7b, q).step_time_s for q in plans]
    mems = [evaluate_plan(llama7b, q).peak_memory_bytes for q in plans]
    assert steps[1] == pytest.approx((steps[0] + steps[2]) / 2, rel=1e-3)
    assert mems[0] < mems[1] < mems[2]


def test_search_picks_ulysses_for_long_sequences():
    """Llama-3-8B at sequence 32768 on 8 GPUs with Megatron SP: the search puts its tp-4 layers on
    Ulysses (all-to-all moves 1/4 of what TP's all-gathers and reduce-scatters move) and is
    faster than without the choice; Galvatron's JSON marks those layers use_sp 1."""
    p = for_target(make_problem("llama3-8b", gbs=16, seq=32768), "galvatron")
    limit = 0.9 * p.cluster.device.memory_bytes
    without = search_layerwise(p, memory_limit_bytes=limit, sp=True, ulysses=False)
    found = search_layerwise(p, memory_limit_bytes=limit, sp=True)
    assert without.cost.step_time_s > found.cost.step_time_s and found.cost.fits
    assert any(found.plan.ulysses) and not any(without.plan.ulysses)
    doc = json.loads(galvatron_layerwise.write(p, found.plan))
    assert doc["use_sp"] == ",".join(str(int(u)) for u in found.plan.ulysses)
    assert galvatron_layerwise.read(doc) == found.plan
