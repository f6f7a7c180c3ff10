"""The per-layer Galvatron JSON of a layer-wise plan, and what the other formats say about it."""

from __future__ import annotations

import pytest
from conftest import make_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.export import galvatron_layerwise as G
from autopar.layerwise import LayerwisePlan

P = make_problem("llama2-7b", device="a100-40gb", gbs=64, seq=4096)
PLAN = LayerwisePlan(pp=2, num_microbatches=8, layers_per_stage=(12, 20), tp=(1,) * 4 + (2,) * 28,
                     zero3=(True,) * 10 + (False,) * 22, recompute=(True,) * 3 + (False,) * 29, default_zero=2,
                     vocab_tp=2, vocab_zero3=True, sp=False)


def test_every_per_layer_field_has_the_plans_values():
    doc = G.config(P, PLAN)
    assert doc["tp_sizes_enc"] == "1,1,1,1," + ",".join(["2"] * 28)
    assert doc["dp_types_enc"] == ",".join(["1"] * 10 + ["0"] * 22)
    assert doc["checkpoint"] == "1,1,1," + ",".join(["0"] * 29)
    for key in ("tp_consecutive_flags", "cp_sizes_enc"):
        assert doc[key] == ",".join(["1"] * 32)
    assert doc["use_sp"] == ",".join(["0"] * 32)
    assert {k: doc[k] for k in ("pp_deg", "pp_division", "chunks", "global_bsz", "pipeline_type", "default_dp_type",
                                "vtp", "vsp", "vcp", "embed_sdp", "vocab_sdp")} == {
        "pp_deg": 2, "pp_division": "12,20", "chunks": 8, "global_bsz": 64, "pipeline_type": "pipedream_flush",
        "default_dp_type": "zero2", "vtp": 2, "vsp": 0, "vcp": 1, "embed_sdp": 1, "vocab_sdp": 1}


def test_read_gives_the_plan_back():
    assert G.read(G.config(P, PLAN)) == PLAN


def test_other_formats_refuse_a_layerwise_plan_with_their_reason():
    assert G.layerwise_refusal("galvatron") is None
    assert "one --tensor-model-parallel-size" in G.layerwise_refusal("megatron")
    assert "tensor_parallel_degree" in G.layerwise_refusal("torchtitan")
    for fmt in ("megatron-bridge", "mindspeed", "deepspeed", "sapp"):
        assert G.layerwise_refusal(fmt).endswith("a layer-wise plan is written only as --format galvatron")


def test_galvatron_refuses_moe_and_fp8_plans():
    moe = make_problem("qwen3-30b-a3b", nodes=1)
    plan = PLAN.model_copy(update=dict(layers_per_stage=(24, 24), tp=(1,) * 48, zero3=(False,) * 48,
                                       recompute=(False,) * 48))
    with pytest.raises(AutoparError, match="MoE model"):
        G.config(moe, plan)
    with pytest.raises(AutoparError, match="fp8"):
        G.config(make_problem("llama2-7b", device="h100-80gb", gbs=64, seq=4096, precision="fp8"), PLAN)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("chunks"), "key 'chunks' is missing"),
    (lambda d: d.update(use_sp="2," * 31 + "2"), "use_sp='2,"),
    (lambda d: d.update(use_sp="1," * 31 + "1"), r"use_sp 1\) splits the sequence over its tp ranks: it needs tp > 1"),
    (lambda d: d.update(use_sp="0,1"), "use_sp has 2 entries; tp_sizes_enc has 32"),
    (lambda d: d.update(tp_sizes_enc="2,x"), "tp_sizes_enc='2,x' is not a comma-separated list"),
    (lambda d: d.update(default_dp_type="zero3"), "default_dp_type='zero3': allowed ddp, zero2"),
    (lambda d: d.update(pp_division="10,10"), "pp_division='10,10' must be pp_deg=2 positive parts summing to the 32"),
    (lambda d: d.update(chunks=0), "chunks: Input should be greater than 0"),
    (lambda d: d.update(checkpoint="0,1"), "checkpoint has 2 entries; tp_sizes_enc has 32"),
])
def test_read_names_the_bad_key(change, message):
    doc = G.config(P, PLAN)
    change(doc)
    with pytest.raises(AutoparError, match=message):
        G.read(doc, "plan.json")


@st.composite
def plans(draw):
    """Valid layer-wise plans of Llama-7B on 8 devices with gbs 64 (pp and tp powers of two)."""
    pp = draw(st.sampled_from([1, 2, 4]))
    cut = sorted(draw(st.sets(st.integers(1, 31), min_size=pp - 1, max_size=pp - 1)))
    split = tuple(b - a for a, b in zip([0, *cut], [*cut, 32]))
    tps = [t for t in (1, 2, 4, 8) if t * pp <= 8]
    tp = tuple(draw(st.lists(st.sampled_from(tps), min_size=32, max_size=32)))
    ulysses = tuple(t > 1 and u for t, u in zip(tp, draw(st.lists(st.booleans(), min_size=32, max_size=32))))
    return LayerwisePlan(pp=pp, num_microbatches=draw(st.sampled_from([1, 2, 4, 8])), layers_per_stage=split,
                         tp=tp, ulysses=ulysses, sp=any(ulysses),
                         zero3=tuple(draw(st.lists(st.booleans(), min_size=32, max_size=32))),
                         recompute=tuple(draw(st.lists(st.booleans(), min_size=32, max_size=32))),
                         default_zero=draw(st.sampled_from([0, 2])), vocab_tp=draw(st.sampled_from(tps)),
                         vocab_zero3=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(plans())
def test_any_plan_survives_the_json(plan):
    """Every field Galvatron reads carries the plan: read(config(plan)) is the plan (sp is a
    runtime flag, not a JSON key: plans here have it exactly where a layer is Ulysses, which
    Galvatron runs under --sequence-parallel)."""
    doc = G.config(P, plan)
    assert all(len(doc[k].split(",")) == 32 for k in ("tp_sizes_enc", "dp_types_enc", "checkpoint", "use_sp"))
    assert G.read(doc) == plan
