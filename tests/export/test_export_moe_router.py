"""MoE router settings in the exports: the score function, expert bias and load-balancing loss each framework needs."""

from __future__ import annotations

import pytest

from autopar.export import WRITERS
from autopar.export.checks import violations
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem

MEMORY_SET = ("core_attn", "moe_act", "layernorm", "mla_up_proj")  # the search's #1 for DeepSeek-V3


@pytest.fixture(scope="module")
def deepseek_export():
    p = make_problem("deepseek-v3", nodes=256, gbs=4096, seq=4096)
    s = Strategy(tp=2, sp=True, pp=16, cp=2, dp=32, ep=8, etp=1, recompute="selective", recompute_modules=MEMORY_SET,
                 layers_per_stage=(4,) * 15 + (1,))
    return p, s, WRITERS["megatron"](p, s)


def test_deepseek_v3_megatron_export_carries_what_was_costed(tmp_path, deepseek_export):
    """The search's #1 on 2,048 H100 exported without group-limited routing, the sequence aux loss
    (both counted in cost/host.py's 72 router kernels), MLA's latent norms (Megatron builds them
    only with --qk-layernorm), the fused permute (DISPATCH_OPS) and fp32 router logits
    (moe_block_bytes). Values: HF config n_group 8, topk_group 4, routed_scaling_factor 2.5
    (transformers' defaults), DeepSeek-V3 report sec. 4.2 alpha = 0.0001."""
    p, s, text = deepseek_export
    for flags in ("--recompute-granularity selective", "--recompute-modules core_attn moe_act layernorm mla_up_proj",
                  "--qk-layernorm", "--moe-grouped-gemm", "--moe-permute-fusion --moe-router-dtype fp32",
                  "--moe-router-score-function sigmoid --moe-router-enable-expert-bias",
                  "--moe-router-load-balancing-type seq_aux_loss --moe-aux-loss-coeff 1e-4",
                  "--moe-router-num-groups 8 --moe-router-group-topk 4", "--moe-router-topk-scaling-factor 2.5",
                  "--decoder-first-pipeline-num-layers 4 --decoder-last-pipeline-num-layers 1"):
        assert flags in text, flags
    plan = read_script(tmp_path / "ds.sh", text)
    assert violations(plan) == []
    back = plan.model_spec()
    assert (back.router_num_groups, back.router_group_topk, back.router_topk_scaling_factor) == (8, 4, 2.5)
    assert back.num_params == p.model.num_params == 671_026_419_200  # the latent norms were counted already
    assert plan.layout["recompute_modules"] == MEMORY_SET


def test_mindspeed_and_softmax_routers_get_no_megatron_only_router_flags():
    """MindSpeed-LLM names group routing differently and predates --moe-permute-fusion /
    --moe-router-dtype; softmax top-k routers (Qwen3, Mixtral) get no group or seq-aux flags."""
    p = make_problem("deepseek-v3", nodes=2, gbs=64, seq=4096)
    text = WRITERS["mindspeed"](p, Strategy(tp=2, sp=True, pp=4, dp=2, ep=4, etp=1))
    assert "--moe-router-enable-expert-bias" in text and "--qk-layernorm" in text
    for flag in ("--moe-router-num-groups", "--moe-permute-fusion", "--moe-router-dtype", "seq_aux_loss"):
        assert flag not in text
    for model in ("qwen3-30b-a3b", "mixtral-8x7b"):
        text = WRITERS["megatron"](make_problem(model, gbs=64), Strategy(dp=8, ep=8, etp=1))
        assert "--moe-permute-fusion --moe-router-dtype fp32" in text
        assert "--moe-router-num-groups" not in text and "seq_aux_loss" not in text


def test_softmax_routers_export_their_load_balancing_loss(tmp_path):
    """Mixtral's config states router_aux_loss_coef 0.02; Qwen3-MoE's omits it (transformers'
    default 0.001). Megatron's own default coefficient is 0, which turns the loss the cost model
    counts (``ROUTER_OPS_TOPK``) off, so the export writes it; a script's value is read back."""
    from autopar.export import WRITERS
    from autopar.specs.script import read_script
    from autopar.strategy import Strategy
    from conftest import make_problem

    for model, coeff in (("mixtral-8x7b", "0.02"), ("qwen3-30b-a3b", "0.001")):
        p = make_problem(model, gbs=64)
        text = WRITERS["megatron"](p, Strategy(dp=8, ep=8, etp=1))
        words = text.split()
        assert words[words.index("--moe-aux-loss-coeff") + 1] == coeff
        assert read_script(tmp_path / f"{model}.sh", text).model_spec().router_aux_loss_coeff == float(coeff)
    assert read_script(SCRIPTS / "pretrain_mixtral_8x7b.sh").model_spec().router_aux_loss_coeff == 0.01
    assert "--moe-aux-loss-coeff" not in WRITERS["megatron"](make_problem("llama3-8b"), Strategy(dp=8))


def test_deepseek_v3_expert_bias_comes_with_the_sigmoid_score_function(tmp_path):
    """DeepSeek-V3 (topk_method noaux_tc, scoring_func sigmoid) exports
    ``--moe-router-enable-expert-bias``; Megatron-Core's TransformerConfig raises "Expert bias for
    aux-loss-free routing only supports sigmoid score function" unless
    ``--moe-router-score-function sigmoid`` is given too (its default is softmax)."""
    p = make_problem("deepseek-v3", nodes=2, gbs=64, seq=4096)
    s = Strategy(tp=2, sp=True, pp=4, dp=2, ep=4, etp=1, recompute="full", recompute_layers=1)
    for fmt in ("megatron", "mindspeed"):
        text = WRITERS[fmt](p, s)
        words = text.split()
        assert words[words.index("--moe-router-score-function") + 1] == "sigmoid"
        assert violations(read_script(tmp_path / f"{fmt}.sh", text)) == []
    # The check itself: the same script without the score function is refused, naming the flag.
    bad = text.replace("--moe-router-score-function sigmoid ", "")
    assert violations(read_script(tmp_path / "bad.sh", bad)) == [
        "expert_bias_needs_sigmoid: --moe-router-enable-expert-bias with score function softmax"]


def test_dense_and_softmax_moe_exports_name_no_score_function():
    """Mixtral and Qwen3-MoE route with softmax (Megatron's default): no score-function flag."""
    for model in ("mixtral-8x7b", "qwen3-30b-a3b", "llama3-8b"):
        p = make_problem(model, gbs=64, seq=4096)
        s = Strategy(dp=8, ep=8 if p.model.is_moe else 1, etp=1 if p.model.is_moe else None)
        assert "--moe-router-score-function" not in WRITERS["megatron"](p, s)
