"""A new user's MoE planning session (DeepSeek-V3, Qwen3-30B-A3B, Mixtral): the tables explain
their short forms, the Megatron export carries every flag the costing assumed and passes the
framework's start-up checks, and ``balance`` / ``--script`` keep what the layout and script say."""

from __future__ import annotations

import html
import json
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import WRITERS
from autopar.export.checks import violations
from autopar.specs.hf import model_from_hf_dict
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import MODELS, SCRIPTS, make_problem

MEMORY_SET = ("core_attn", "moe_act", "layernorm", "mla_up_proj")  # the search's #1 for DeepSeek-V3


def _row(s: Strategy) -> SimpleNamespace:
    return SimpleNamespace(strategy=s, marginal=False, peak_memory_bytes=1.0, step_time_s=1.0,
                           tokens_per_s_per_device=1.0, mfu=0.5, time_breakdown_s={"pp_bubble": 0.0})


def test_ranking_table_explains_recompute_short_forms():
    """The DeepSeek-V3 table showed 'sel attn+act+norm+mla' and 'full x1' with no legend ('full x1'
    is block recompute of one layer per chunk, not of every layer); the caption and the HTML
    report now spell out each abbreviation used, and say nothing when none is used."""
    from autopar.report.html import _table
    from autopar.report.table import recompute_label, recompute_notes, table_notes

    sel = Strategy(dp=8, recompute="selective", recompute_modules=MEMORY_SET)
    block = Strategy(dp=8, recompute="full", recompute_layers=1)
    assert (recompute_label(_row(sel)), recompute_label(_row(block))) == ("sel attn+act+norm+mla", "full x1")
    notes = recompute_notes([_row(sel), _row(block)])
    assert notes[0] == ("sel a+b: selective recompute of Megatron --recompute-modules: attn = core_attn, "
                        "act = moe_act, norm = layernorm, mla = mla_up_proj")
    assert notes[1].startswith("full xN: full recompute of the first N layers of each pipeline chunk "
                               "(--recompute-method block --recompute-num-layers N)")
    page = _table(SimpleNamespace(layouts=[_row(sel), _row(block)]))
    assert all(html.escape(n) in page for n in notes)
    plain = [_row(Strategy(dp=8, recompute=r)) for r in ("none", "selective", "full")]
    assert recompute_notes(plain) == [] and table_notes(plain) is None


def test_estimate_spells_out_the_recompute_modules():
    """``autopar estimate`` printed 'recompute sel attn+act+norm+mla' without saying which modules."""
    out = CliRunner().invoke(app, ["estimate", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--ep", "8",
                                   "--etp", "1", "--zero", "1", "--recompute", "selective",
                                   "--recompute-modules", "core_attn,moe_act"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "act = moe_act" in out.output and "attn = core_attn" in out.output


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


def _deepseek_config(**over) -> dict:
    raw = json.loads((MODELS / "deepseek-v3.json").read_text())
    raw.update(over)
    return raw


def test_group_routing_read_from_the_hf_config():
    """n_group / topk_group / routed_scaling_factor, with transformers' DeepseekV3Config defaults
    (8, 4, 2.5) when absent; greedy routing or one group is not group-limited; groups that do not
    split the experts or cannot hold top-k experts are one error line."""
    m = model_from_hf_dict(_deepseek_config(n_group=16, topk_group=2, routed_scaling_factor=1.5), "x")
    assert (m.router_num_groups, m.router_group_topk, m.router_topk_scaling_factor) == (16, 2, 1.5)
    raw = _deepseek_config()
    del raw["n_group"], raw["topk_group"]
    m = model_from_hf_dict(raw, "x")
    assert (m.router_num_groups, m.router_group_topk, m.router_topk_scaling_factor) == (8, 4, 2.5)
    assert model_from_hf_dict(_deepseek_config(topk_method="greedy"), "x").router_num_groups == 0
    assert model_from_hf_dict(_deepseek_config(n_group=1, topk_group=1), "x").router_num_groups == 0
    with pytest.raises(AutoparError, match="n_group=7 with topk_group=4"):
        model_from_hf_dict(_deepseek_config(n_group=7), "x")  # 256 experts in 7 groups
    with pytest.raises(AutoparError, match="n_group=64 with topk_group=1"):  # top 1 of 64 groups holds 4 < 8 experts
        model_from_hf_dict(_deepseek_config(n_group=64, topk_group=1), "x")


def test_script_rotary_base_and_norm_epsilon_survive_into_the_printed_arguments(tmp_path):
    """`search --script pretrain_mixtral_8x7b.sh` printed Megatron arguments without the script's
    --rotary-base 1000000 (Megatron's default is 10000): the reader dropped it."""
    src = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()
    script = tmp_path / "mix.sh"
    script.write_text(src.replace("--rotary-base 1000000", "--rotary-base 1000000\n    --norm-epsilon 1e-5"))
    spec = read_script(script).model_spec()
    assert (spec.rope_theta, spec.norm_eps) == (1e6, 1e-5)
    out = CliRunner().invoke(app, ["search", "--script", str(script), "--device", "h100-80gb", "--top", "1"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "--rotary-base 1000000" in out.output and "--norm-epsilon 1e-05" in out.output


def test_balance_takes_and_writes_the_recompute_modules():
    """`autopar balance` had no --recompute-modules, so the search's #1 (selective with the
    memory-saving set) could not be balanced as costed, and its Megatron line lacked the set."""
    args = ["balance", "--model", "deepseek-v3", "--device", "h100-80gb", "--nodes", "256", "--gbs", "4096",
            "--tp", "2", "--sp", "--pp", "16", "--cp", "2", "--ep", "8", "--etp", "1", "--recompute", "selective",
            "--form", "megatron", "--options", "selective"]
    out = CliRunner().invoke(app, args + ["--recompute-modules", ",".join(MEMORY_SET)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "--recompute-granularity selective --recompute-modules core_attn moe_act layernorm mla_up_proj" in out.output
    assert "not --recompute-modules core_attn,moe_act,layernorm,mla_up_proj" in out.output  # the SAPP line says so
    plain = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert plain.exit_code == 0 and "--recompute-modules" not in plain.output


def test_softmax_routers_export_their_load_balancing_loss(tmp_path):
    """Mixtral's config states router_aux_loss_coef 0.02; Qwen3-MoE's omits it (transformers'
    default 0.001). Megatron's own default coefficient is 0, which turns the loss the cost model
    counts (``ROUTER_OPS_TOPK``) off, so the export writes it; a script's value is read back."""
    from autopar.export import WRITERS
    from autopar.specs.script import read_script
    from autopar.strategy import Strategy
    from conftest import MODELS, SCRIPTS, make_problem

    for model, coeff in (("mixtral-8x7b", "0.02"), ("qwen3-30b-a3b", "0.001")):
        p = make_problem(model, gbs=64)
        text = WRITERS["megatron"](p, Strategy(dp=8, ep=8, etp=1))
        words = text.split()
        assert words[words.index("--moe-aux-loss-coeff") + 1] == coeff
        assert read_script(tmp_path / f"{model}.sh", text).model_spec().router_aux_loss_coeff == float(coeff)
    assert read_script(SCRIPTS / "pretrain_mixtral_8x7b.sh").model_spec().router_aux_loss_coeff == 0.01
    assert "--moe-aux-loss-coeff" not in WRITERS["megatron"](make_problem("llama3-8b"), Strategy(dp=8))
