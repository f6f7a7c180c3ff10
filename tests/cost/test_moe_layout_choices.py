"""The MoE dispatcher and EP overlap as layout choices: Megatron-Core's rules, the writers that have
them (Megatron-LM, Megatron-Bridge) and the ones that refuse them, and the search offering them by
target."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError, LayoutError
from autopar.export.megatron import megatron_args
from autopar.export.megatron_bridge import overrides
from autopar.export.torchtitan import write as torchtitan_write
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.search.grid import for_search
from autopar.space import SpaceOptions, enumerate_layouts
from autopar.specs.moe_runtime import MoeRuntime
from autopar.strategy import Strategy
from conftest import make_problem


def _qwen235(**train):
    return make_problem("qwen3-235b-a22b", nodes=32, gbs=2048, **train)


OVERLAP = Strategy(dp=16, tp=2, pp=8, vpp=4, ep=32, etp=1, sp=True, schedule="interleaved", moe_ep_overlap=True)


def test_strategy_round_trips_through_the_batch():
    s = OVERLAP.model_copy(update={"moe_dispatcher": "hybridep"})
    b = LayoutBatch.from_strategy(s, 2048)
    assert b.dispatcher_is("hybridep")[0] and b.moe_ep_overlap[0]
    back = b.strategy(0, 94)
    assert back.moe_dispatcher == "hybridep" and back.moe_ep_overlap


@pytest.mark.parametrize("update, rule, said", [
    ({"ep": 1, "dp": 16}, "ep_overlap_needs_ep", "only supported with expert model parallelism"),
    ({"moe_dispatcher": "allgather"}, "ep_overlap_dispatcher", "alltoall/flex token dispatcher"),
    ({"recompute": "full"}, "ep_overlap_no_full_recompute", "disable full recomputation"),
    ({"vpp": 1}, "ep_overlap_needs_vpp", "virtual_pipeline_model_parallel_size must be specified"),
])
def test_megatron_core_refuses_these_overlaps(update, rule, said):
    with pytest.raises(LayoutError, match=said) as err:
        check_strategy(_qwen235(), OVERLAP.model_copy(update=update))
    assert rule in str(err.value) or said in str(err.value)


def test_run_switches_that_need_or_exclude_the_overlap():
    with pytest.raises(LayoutError, match="Disable moe_shared_expert_overlap"):
        check_strategy(_qwen235(moe=MoeRuntime(shared_expert_overlap=True)), OVERLAP)
    with pytest.raises(LayoutError, match="--delay-wgrad-compute without moe_ep_overlap"):
        check_strategy(_qwen235(moe=MoeRuntime(delay_wgrad=True)), OVERLAP.model_copy(update={"moe_ep_overlap": False}))
    check_strategy(_qwen235(moe=MoeRuntime(delay_wgrad=True)), OVERLAP)  # the valid pairing


def test_dense_models_keep_the_defaults():
    p = make_problem("llama3-8b")
    with pytest.raises(LayoutError, match="has no routed experts"):
        check_strategy(p, Strategy(dp=8, moe_dispatcher="deepep"))


def test_megatron_writes_the_dispatcher_overlap_and_switches():
    p = _qwen235(moe=MoeRuntime(delay_wgrad=True, router_fusion=True, force_balance=True))
    words = megatron_args(p, OVERLAP.model_copy(update={"moe_dispatcher": "deepep"}))
    for flag in ("--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-router-fusion",
                 "--moe-permute-fusion", "--moe-router-force-load-balancing"):
        assert flag in words
    plain = megatron_args(_qwen235(), OVERLAP.model_copy(update={"moe_ep_overlap": False}))
    assert "--moe-token-dispatcher-type alltoall" in plain and "--overlap-moe-expert-parallel-comm" not in plain
    assert "--moe-flex-dispatcher-backend" not in plain and "--moe-router-fusion" not in plain


def test_megatron_bridge_writes_them_as_model_fields():
    p = make_problem("qwen3-30b-a3b", nodes=2, gbs=512)
    s = Strategy(dp=8, pp=2, vpp=4, ep=8, etp=1, schedule="interleaved", moe_dispatcher="hybridep", moe_ep_overlap=True)
    table = overrides(p, s)
    assert table["model.moe_token_dispatcher_type"] == "flex"
    assert table["model.moe_flex_dispatcher_backend"] == "hybridep"
    assert table["model.overlap_moe_expert_parallel_comm"] is True
    assert table["model.expert_tensor_parallel_size"] == 1


def test_targets_without_them_refuse_with_the_reason():
    p = make_problem("qwen3-30b-a3b")
    with pytest.raises(AutoparError, match="torchtitan cannot express this layout: moe_dispatcher=deepep"):
        torchtitan_write(p, Strategy(dp=8, ep=8, zero=3, moe_dispatcher="deepep"))
    with pytest.raises(AutoparError, match="MindSpeed-LLM cannot express this layout"):
        megatron_args(p, Strategy(dp=8, ep=8, moe_dispatcher="deepep"), dialect="mindspeed")


@pytest.mark.parametrize("target, dispatchers, overlap", [
    # megatron-bridge offers Qwen3-30B-A3B's recipe dispatcher, HybridEP (autopar.export.bridge_moe_recipes),
    # instead of DeepEP: on 8-GPU nodes the two cost the same (autopar.export.comm_knobs.flex_backends_tie)
    ("megatron", {"alltoall", "deepep"}, True), ("megatron-bridge", {"alltoall", "hybridep"}, True),
    ("torchtitan", {"alltoall"}, False), ("mindspeed", {"alltoall"}, False)])
def test_search_offers_the_choices_where_the_target_writes_them(target, dispatchers, overlap):
    p, options = for_search(make_problem("qwen3-30b-a3b", nodes=2), target, SpaceOptions(mbs=(1,), zero=(1,)))
    assert set(options.moe_dispatchers) == dispatchers and options.moe_ep_overlap is overlap
    batch = enumerate_layouts(p, options)
    assert bool(batch.moe_ep_overlap.any()) is overlap
    assert not (batch.moe_ep_overlap & (batch.ep == 1)).any()  # never offered where the rules refuse it


def test_flex_backend_follows_the_nvlink_domain():
    p, options = for_search(make_problem("qwen3-30b-a3b", device="gb200", nodes=16, per_node=4), "megatron", None)
    assert options.moe_dispatchers == ("alltoall", "hybridep")
