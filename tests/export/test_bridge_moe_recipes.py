"""Megatron-Bridge MoE recipe defaults (:mod:`autopar.export.bridge_moe_recipes`): the dispatcher
and recompute of each recipe (Megatron-Bridge 067f987) are what ``--format megatron-bridge`` /
``--target megatron-bridge`` assume where nothing else says, and the output says so."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.export.bridge_moe_recipes import layout_fallbacks, note
from autopar.search.grid import for_search
from autopar.space import SpaceOptions
from conftest import make_problem

runner = CliRunner()


@pytest.mark.parametrize("model, device, dispatcher", [
    ("qwen3-30b-a3b", "h100-80gb", "hybridep"),   # qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config: flex + hybridep
    ("qwen3-235b-a22b", "h100-80gb", "deepep"),   # alltoall + deepep, switched to flex by apply_flex_dispatcher_backend
    ("qwen3-235b-a22b", "gb200", "alltoall"),     # ... which falls back to alltoall off Hopper/B200/B300
    ("deepseek-v3", "gb200", "hybridep"),         # HybridEP runs on GB200
    ("gpt-oss-120b", "h100-80gb", "alltoall"),    # names deepep, never applies it
])
def test_recipe_dispatcher_and_recompute(model, device, dispatcher):
    p = make_problem(model, device=device, per_node=4 if device == "gb200" else 8)
    assert layout_fallbacks(p) == {"moe_dispatcher": dispatcher, "recompute": "none"}


def test_models_without_a_moe_recipe_assume_nothing():
    assert layout_fallbacks(make_problem("llama3-8b")) == {} and note(make_problem("llama3-8b")) is None
    assert layout_fallbacks(make_problem("mixtral-8x7b")) == {}  # no Megatron-Bridge recipe at all


def test_search_offers_the_recipe_dispatcher_last():
    """Last: the one kept when the space must shrink (autopar.space.blocks). On H100 deepep and
    hybridep cost the same (autopar.export.comm_knobs.flex_backends_tie): the recipe's hybridep
    only, not a silent tie with deepep."""
    _, options = for_search(make_problem("qwen3-30b-a3b", nodes=2), "megatron-bridge", SpaceOptions())
    assert options.moe_dispatchers == ("alltoall", "hybridep")
    _, options = for_search(make_problem("gpt-oss-120b", nodes=2), "megatron-bridge", SpaceOptions())
    assert options.moe_dispatchers == ("deepep", "alltoall")


QWEN = ["--format", "megatron-bridge", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--nodes", "2",
        "--gbs", "512", "--seq-len", "4096", "--tp", "1", "--pp", "2", "--ep", "8", "--mbs", "2"]


def test_export_takes_the_recipe_default_and_says_so():
    text = runner.invoke(app, ["export", *QWEN]).stdout
    assert "model.moe_token_dispatcher_type=flex" in text and "model.moe_flex_dispatcher_backend=hybridep" in text
    assert "model.recompute_granularity=null" in text
    assert "# Megatron-Bridge recipe qwen3_30b_a3b_pretrain_config, an alias of " \
        "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config (src/megatron/bridge/recipes/" \
        "qwen/h100/qwen3_moe.py at 067f987df03b) defaults assumed where not given: dispatcher hybridep" in text
    given = runner.invoke(app, ["export", *QWEN, "--moe-dispatcher", "alltoall"]).stdout  # the option wins
    assert "model.moe_token_dispatcher_type=alltoall" in given
    megatron = runner.invoke(app, ["export", *QWEN[2:], "--format", "megatron"]).stdout  # other targets: alltoall
    assert "--moe-token-dispatcher-type alltoall" in megatron


def test_search_says_what_it_assumes():
    args = ["search", *QWEN[2:], "--target", "megatron-bridge", "--top", "1", "-q"]
    text = " ".join(runner.invoke(app, args).stdout.split())
    assert "--target megatron-bridge: Megatron-Bridge recipe qwen3_30b_a3b_pretrain_config, an alias of " \
        "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in text
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert "dispatcher hybridep, recompute none" in doc["target_assumes"]


def test_the_note_names_the_launched_recipe_and_leaves_selective_modules_to_the_layout():
    """DeepSeek-V3's Bridge script named deepseek_v3_pretrain_1024gpu_h100_bf16_config in its
    header but launched --recipe deepseek_v3_pretrain_config (the library alias of that function);
    and its note said "recompute none (modules core_attn)" above a row recomputing selectively with
    other modules. The header now names both recipes, and the recompute default holds only where
    the layout leaves recompute open."""
    args = ["export", "--format", "megatron-bridge", "--model", "deepseek-v3", "--device", "h100-80gb", "--nodes",
            "128", "--gbs", "8192", "--seq-len", "4096", "--tp", "2", "--pp", "16", "--ep", "64", "--mbs", "1",
            "--recompute", "selective", "--recompute-modules", "core_attn,moe_act"]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert "--recipe deepseek_v3_pretrain_config" in text
    assert "recipe deepseek_v3_pretrain_config, an alias of deepseek_v3_pretrain_1024gpu_h100_bf16_config" in text
    assert "(modules core_attn)" not in text
    assert "recompute none where the layout leaves it open (a selective layout recomputes its own modules)" in text
    assert "'model.recompute_modules=[core_attn,moe_act]'" in text
