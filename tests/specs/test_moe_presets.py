"""The 2025 MoE presets (GPT-OSS-120B/20B, Qwen3-235B-A22B, GLM-4.5, Kimi-K2, Llama-4-Maverick):
their parameter counts against the publishers' figures, the layer structure each HF reader
builds, sliding-window attention FLOPs, attention sinks, and their Megatron flags."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import flops as F
from autopar.cost import window
from autopar.cost.stage import all_stages
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron import launch_script, megatron_args
from autopar.specs.hf import load_model, model_from_hf_dict, preset_names
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import MODELS, make_problem
from test_bad_input import one_line_error

NEW = ("gpt-oss-20b", "gpt-oss-120b", "qwen3-235b-a22b", "glm-4.5", "kimi-k2", "llama-4-maverick")


def test_presets_are_listed():
    assert set(NEW) <= set(preset_names())


def test_gpt_oss_parameters_by_hand():
    """GPT-OSS-120B per layer: q/k/v/o 2880 x (4096 + 2 x 512) + 4096 x 2880 = 26,542,080, their
    biases 4096 + 1024 + 2880, 64 sinks, 2 norms of 2880; 128 experts of 3 x 2880 x 2880 with
    biases 2 x 2880 + 2880 each; router 128 x 2880 + 128. 36 layers, untied 201,088 x 2880
    embedding and output, final norm: 116,829,156,672 (OpenAI's model card: 116.83B). Active
    (top-4) without the 579M unembedding: 5.13B as published; 20B: 20.91B and 3.61B."""
    layer = 26_542_080 + 8000 + 64 + 5760 + 128 * (24_883_200 + 8640) + 128 * 2880 + 128
    assert layer == 3_213_080_192
    big = load_model("gpt-oss-120b")
    assert big.num_params == 36 * layer + 2 * 201_088 * 2880 + 2880 == 116_829_156_672
    assert round((big.num_active_params - 201_088 * 2880) / 1e9, 2) == 5.13
    small = load_model("gpt-oss-20b")
    assert round(small.num_params / 1e9, 2) == 20.91
    assert round((small.num_active_params - 201_088 * 2880) / 1e9, 2) == 3.61


@pytest.mark.parametrize("name, total_b, active_b", [
    ("qwen3-235b-a22b", 235, 22), ("kimi-k2", 1026, 33), ("llama-4-maverick", 401, 17), ("glm-4.5", 353, 34)])
def test_totals_match_the_published_sizes(name, total_b, active_b):
    """Qwen3-235B-A22B, Kimi-K2 (1T / 32B), Llama 4 Maverick (400B / 17B); GLM-4.5's 355B / 32B
    include its MTP layer, which the copy found leaves out (SOURCES.md)."""
    m = load_model(name)
    assert round(m.num_params / 1e9) == total_b and round(m.num_active_params / 1e9) == active_b


def test_layer_structure_of_each_family():
    oss = load_model("gpt-oss-120b")
    assert oss.window_layers == tuple(range(0, 36, 2)) and oss.sliding_window == 128 and oss.attention_sinks
    assert oss.moe_layers == tuple(range(36)) and oss.num_experts_per_tok == 4 and oss.linear_bias
    maverick = load_model("llama-4-maverick")
    assert maverick.moe_layers == tuple(range(1, 48, 2))  # interleave_moe_layer_step 2: (i + 1) % 2 == 0
    assert (maverick.ffn_hidden_size, maverick.moe_ffn_hidden_size, maverick.shared_expert_ffn_hidden_size) == (
        16384, 8192, 8192)
    glm = load_model("glm-4.5")
    assert glm.moe_layers == tuple(range(3, 92)) and glm.qk_norm and glm.qkv_bias and glm.router_bias
    assert glm.router_num_groups == 0 and glm.router_topk_scaling_factor == 2.5 and glm.num_kv_heads == 8
    kimi = load_model("kimi-k2")
    assert kimi.mla and kimi.num_experts == 384 and kimi.moe_layers == tuple(range(1, 61))
    assert kimi.router_num_groups == 0 and kimi.router_topk_scaling_factor == 2.827 and kimi.mtp_num_layers == 0
    qwen = load_model("qwen3-235b-a22b")
    assert (qwen.num_layers, qwen.head_dim, qwen.moe_ffn_hidden_size, qwen.num_experts) == (94, 128, 1536, 128)


def test_window_layers_scale_attention_flops_with_seq_times_window():
    """GPT-OSS-20B at 4096 tokens: half the layers see 128 keys: (2 x 4096 x 128 - 128^2) / 4096^2
    = 0.0615 of a full causal layer, so the mean layer costs 0.5 + 0.5 x 0.0615 = 0.5308."""
    assert window.window_key_fraction(128, 4096) == pytest.approx(0.061523, abs=1e-6)
    p = make_problem("gpt-oss-20b", seq=4096)
    full = make_problem(load_model("gpt-oss-20b").model_copy(update=dict(window_layers=())), seq=4096)
    batch, _ = all_stages(p, Strategy(dp=8))
    ratio = F.attention_core_flops(p, batch) / F.attention_core_flops(full, batch)
    assert ratio[0] == pytest.approx(0.5 + 0.5 * (2 * 4096 * 128 - 128**2) / 4096**2)
    assert window.window_key_fraction(128, 100) == 1.0  # shorter than the window: full causal


def test_window_layers_make_attention_faster_not_free():
    """Window layers run at the short-block kernel rate (128 keys per row): the attention time
    drops less than its FLOPs."""
    s = Strategy(dp=8, ep=8, mbs=1, zero=1)
    m = load_model("gpt-oss-20b")
    with_window = estimate(make_problem(m, seq=32768, gbs=64), s)
    without = estimate(make_problem(m.model_copy(update=dict(window_layers=())), seq=32768, gbs=64), s)
    assert with_window.step_time_s < without.step_time_s
    flops_ratio = float(window.mean_key_fraction(m, 32768))
    eff = window.mixed_block_efficiency(m, 32768, 1.0)
    assert eff < 1.0 and flops_ratio < 0.52


def test_window_and_sink_flags_round_trip(tmp_path):
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    s = Strategy(dp=32, tp=2, ep=8, etp=1, sp=True, zero=1)
    args = megatron_args(p, s)
    assert '--window-size 128,0 --window-attn-skip-freq "[1,0,1,0' in args and "--softmax-type learnable" in args
    plan = read_script(tmp_path / "back.sh", launch_script(p, s))
    back = plan.model_spec()
    assert back.window_layers == p.model.window_layers and back.sliding_window == 128 and back.attention_sinks
    assert back.moe_layers == p.model.moe_layers


@pytest.mark.parametrize("flags, fields", [
    ("--window-size 128,0", dict(sliding_window=128, window_layers=(0, 1, 2, 3))),
    ("--window-size 64,0 --window-attn-skip-freq 2", dict(sliding_window=64, window_layers=(0, 2))),
    ("--window-size 64,0 --window-attn-skip-freq [1,1,1,0]", dict(window_layers=(0, 1, 2))),
    ("--softmax-type learnable", dict(attention_sinks=True, window_layers=())),
    ("--softmax-type off-by-one", dict(attention_sinks=False)),
])
def test_script_attention_flags(tmp_path, flags, fields):
    text = ("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 256 "
            f"--vocab-size 128 --bf16 {flags}")
    m = read_script(tmp_path / "s.sh", text).model_spec()
    assert {k: getattr(m, k) for k in fields} == fields


@pytest.mark.parametrize("flags, message", [
    ("--window-size 128", "--window-size='128': expected LEFT,0"),
    ("--window-size 128,5", "--window-size='128,5': expected LEFT,0"),
    ("--window-size 128,0 --window-attn-skip-freq [1,0]", "needs 4 entries of 0 (full) or 1 (window)"),
    ("--window-attn-skip-freq 2", "--window-attn-skip-freq without --window-size"),
    ("--softmax-type sparse", "--softmax-type='sparse': allowed vanilla, off-by-one, learnable"),
])
def test_bad_script_attention_flags_are_one_error(tmp_path, flags, message):
    script = tmp_path / "bad.sh"
    script.write_text("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 64 --num-attention-heads 4 "
                      f"--seq-length 256 --vocab-size 128 --bf16 {flags}\n")
    err = one_line_error(["estimate", "--script", str(script), "--device", "h100-80gb"])
    assert message in err


def test_bad_layer_types_name_the_key(tmp_path):
    raw = {**__import__("json").loads((MODELS / "gpt-oss-20b.json").read_text()),
           "layer_types": ["sliding_attention"] * 3}
    with pytest.raises(AutoparError, match="field 'layer_types' must list 'sliding_attention' or 'full_attention' "
                                           "for each of the num_hidden_layers=24 layers"):
        model_from_hf_dict(raw, "x")
    raw["layer_types"], raw["sliding_window"] = ["sliding_attention"] * 24, 0
    with pytest.raises(AutoparError, match="field 'sliding_window'=0 must be >= 1"):
        model_from_hf_dict(raw, "x")


def test_other_formats_refuse_window_layers():
    p = make_problem("gpt-oss-20b", nodes=1, gbs=64, seq=4096)
    with pytest.raises(AutoparError, match="export --format torchtitan: model gpt-oss-20b has sliding-window"):
        WRITERS["torchtitan"](p, Strategy(dp=8, ep=8, etp=1, zero=3))


def test_new_presets_estimate_on_h100():
    """Every preset costs without error on a layout Megatron accepts (smoke: positive, finite)."""
    cases = {"gpt-oss-20b": (1, Strategy(dp=8, ep=8, etp=1)),
             "gpt-oss-120b": (2, Strategy(dp=16, ep=16, etp=1)),
             "qwen3-235b-a22b": (8, Strategy(dp=8, tp=2, pp=4, ep=8, etp=1, sp=True)),
             "llama-4-maverick": (8, Strategy(dp=8, tp=2, pp=4, ep=8, etp=1, sp=True)),
             "glm-4.5": (16, Strategy(dp=16, tp=2, pp=4, ep=16, etp=1, sp=True)),
             "kimi-k2": (64, Strategy(dp=64, tp=2, pp=4, ep=64, etp=1, sp=True))}
    for name, (nodes, s) in cases.items():
        e = estimate(make_problem(name, nodes=nodes, gbs=1024, seq=4096), s)
        assert np.isfinite(e.step_time_s) and e.step_time_s > 0 and e.peak_memory_bytes > 0, name


def test_llama4_router_and_missing_max_positions_export_as_megatron_needs(tmp_path):
    """Llama 4's top-1 router is a sigmoid (Megatron's TransformerConfig refuses a softmax top-1
    router without --moe-router-pre-softmax); a config without max_position_embeddings exports the
    sequence length (Megatron's validate_args asserts the flag). Both read back."""
    p = make_problem("llama-4-maverick", nodes=16, gbs=512, seq=4096)
    s = Strategy(dp=8, tp=4, pp=4, ep=8, etp=1, sp=True)
    text = launch_script(p, s)
    assert "--moe-router-score-function sigmoid" in text and "--moe-router-enable-expert-bias" not in text
    assert "--max-position-embeddings 4096" in text and p.model.max_position_embeddings is None
    back = read_script(tmp_path / "l4.sh", text).model_spec()
    assert back.router_sigmoid and not back.router_bias and back.moe_layers == p.model.moe_layers
    top1 = load_model("llama-4-maverick").model_copy(update=dict(router_sigmoid=False))
    assert "--moe-router-pre-softmax" in megatron_args(make_problem(top1, nodes=16, gbs=512, seq=4096), s)


def test_window_layers_refuse_context_parallelism():
    """TE's p2p context parallelism (what autopar costs) asserts against sliding-window layers."""
    from autopar.rules import check_strategy

    p = make_problem("gpt-oss-20b", nodes=1, gbs=64, seq=8192)
    with pytest.raises(AutoparError, match="window_attention_cp: cp=2 with model gpt-oss-20b's sliding-window"):
        check_strategy(p, Strategy(dp=4, cp=2, ep=4, etp=1))
    check_strategy(make_problem("qwen3-30b-a3b", gbs=64, seq=8192), Strategy(dp=4, cp=2, ep=4, etp=1))
