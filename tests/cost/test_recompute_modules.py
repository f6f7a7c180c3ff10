"""Selective recompute modules (Megatron --recompute-modules): what each frees and re-runs, the
search's module sets, the command line, launch scripts and exports."""

import json
from itertools import combinations

import numpy as np
import pytest
from conftest import SCRIPTS, make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import activations as act
from autopar.cost import compute as C
from autopar.cost.recompute import layer_recompute_s, memory_saving_modules
from autopar.cost.stage import Stages, all_stages
from autopar.cost.stage_time import stage_time
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.search import search
from autopar.space import enumerate_layouts
from autopar.specs.script import read_script
from autopar.strategy import RECOMPUTE_MODULES, Strategy, module_names

MLA_MOE = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "moe")
ON = np.array([True])
DSV3 = make_problem("deepseek-v3", nodes=64, per_node=8, gbs=4096, seq=4096)


def _dsv3_layout(modules=("core_attn",), **kw):
    fields = dict(dp=32, tp=2, pp=8, ep=64, etp=1, mbs=1, sp=True, zero=1, recompute="selective")
    return Strategy(**{**fields, **kw}, recompute_modules=modules)


def _batch(modules=("core_attn",)):
    return LayoutBatch.from_strategy(_dsv3_layout(modules), 4096)


def test_mla_up_proj_frees_q_k_v_and_the_normed_latents():
    # DeepSeek-V3, tp 2 + SP, s 4096: the up-projections' latent norm outputs (1536 + 512 wide, SP
    # shard) and q (128 x 192), k (128 x 192), v (128 x 128) per rank: 2 B x 4096 x 2048 / 2 +
    # 2 B x 4096 x 65536 / 2 = 8,388,608 + 268,435,456 bytes.
    before = act.attention_bytes(DSV3, _batch(), ON)
    after = act.attention_bytes(DSV3, _batch(("core_attn", "mla_up_proj")), ON)
    assert (before - after)[0] == 8_388_608 + 268_435_456
    # layernorm: MLA's input norm is its own module: its output, 2 B x 4096 x 7168 / 2.
    assert (before - act.attention_bytes(DSV3, _batch(("core_attn", "layernorm")), ON))[0] == 2 * 4096 * 7168 / 2
    # Only where the row recomputes selectively.
    assert act.attention_bytes(DSV3, _batch(MLA_MOE), np.array([False]))[0] == \
        act.attention_bytes(DSV3, _batch(), np.array([False]))[0]


def test_moe_modules_free_their_activations():
    base = act.mlp_bytes(DSV3, _batch(), True, ON)
    # moe_act: the routed experts' SwiGLU output, 2 B x (4096 x 8 / 2 rows) x 2048 = 67,108,864.
    assert (base - act.mlp_bytes(DSV3, _batch(("moe_act",)), True, ON))[0] == 2 * 16384 * 2048
    # shared_experts: the shared expert's fc1 output and activation, 6 B x 4096 x 2048 / 2.
    assert (base - act.mlp_bytes(DSV3, _batch(("shared_experts",)), True, ON))[0] == 6 * 4096 * 2048 / 2
    # moe: the whole block; only the norm input and output (2 x 2 B x 4096 x 7168 / 2) stay.
    assert act.mlp_bytes(DSV3, _batch(("moe",)), True, ON)[0] == 2 * 2 * 4096 * 7168 / 2
    # Default core_attn frees nothing in the MLP block; selective off frees nothing either.
    assert base[0] == act.mlp_bytes(DSV3, _batch(), True)[0]
    assert base[0] == act.mlp_bytes(DSV3, _batch(MLA_MOE), True, np.array([False]))[0]


def test_dense_mlp_recompute_keeps_only_the_mlp_input():
    # Llama-3-8B, tp 1, s 4096: fc1 input (2 B x 4096 x 4096) and SwiGLU fc1 output + activation
    # (6 B x 4096 x 14336) are freed: 33,554,432 + 352,321,536 bytes.
    p = make_problem("llama3-8b")
    batch = lambda mods: LayoutBatch.from_strategy(Strategy(dp=8, recompute="selective", recompute_modules=mods), 64)  # noqa: E731
    b0, b1, b2 = batch(("core_attn",)), batch(("core_attn", "mlp")), batch(("core_attn", "layernorm"))
    assert (act.mlp_bytes(p, b0, False, ON) - act.mlp_bytes(p, b1, False, ON))[0] == 33_554_432 + 352_321_536
    # A dense layer's norms are fused into TE's LayerNormLinear: layernorm recompute frees nothing
    # (and the model rule refuses nothing: the module exists, it has no separate norm to run).
    assert (act.attention_bytes(p, b2, ON) + act.mlp_bytes(p, b2, False, ON))[0] == \
        (act.attention_bytes(p, b0, ON) + act.mlp_bytes(p, b0, False, ON))[0]


def test_mla_up_proj_recompute_costs_its_two_gemms():
    # q up: 2 x 4096 x 12288 x 1536 FLOPs, kv up: 2 x 4096 x 16384 x 512, at 989.4e12 x 0.64
    # (H100 bf16 GEMM rate); RoPE with the q/k concatenations, 2 B x 2 x 4096 x (24576 + 24576) / 2
    # = 402,653,184 bytes, and the latent norms, 2 x 2 B x 2048 x 2048 = 16,777,216 bytes, at
    # 3.35e12 x 0.7 B/s; 5 kernels (2 GEMMs, norm, RoPE, concatenation) x 4 us.
    b = _batch(("mla_up_proj",))
    layer = C.layer_forward_times(DSV3, b, moe=True)
    gemm_s = (2 * 4096 * 12288 * 1536 + 2 * 4096 * 16384 * 512) / (989.4e12 * 0.64)
    memory_s = (402_653_184 + 16_777_216) / (3.35e12 * 0.7)
    assert layer_recompute_s(DSV3, b, layer, moe=True)[0] == pytest.approx(gemm_s + memory_s + 5 * 4e-6, rel=1e-9)
    # Modules add up: core_attn + mla_up_proj = each alone.
    both = layer_recompute_s(DSV3, _batch(("core_attn", "mla_up_proj")), layer, moe=True)
    alone = layer_recompute_s(DSV3, _batch(), layer, moe=True) + layer_recompute_s(DSV3, b, layer, moe=True)
    assert both[0] == pytest.approx(alone[0], rel=1e-12)


def _take(stages: Stages, rows: np.ndarray) -> Stages:
    return Stages(index=stages.index[rows], start=stages.start[rows], layers=stages.layers[rows])


def test_moe_recompute_repeats_the_forward_all_to_all():
    # A MoE-only middle stage: dispatch + combine forward and backward per layer (4 all-to-alls),
    # plus the forward two again under 'moe' recompute: 1.5x the expert-parallel time.
    middle = np.array([3])
    times = []
    for mods in (("core_attn",), ("core_attn", "moe")):
        batch, stages = all_stages(DSV3, _dsv3_layout(mods))
        times.append(stage_time(DSV3, batch.take(middle), _take(stages, middle)).ep_s[0])
    assert times[1] / times[0] == pytest.approx(1.5, rel=1e-12)


@pytest.mark.parametrize("extra", [m for m in RECOMPUTE_MODULES if m not in ("core_attn", "mlp")])
def test_each_module_saves_memory_and_costs_time(extra):
    # Adding a module to selective recompute lowers memory and raises step time.
    base, more = estimate(DSV3, _dsv3_layout()), estimate(DSV3, _dsv3_layout(("core_attn", extra)))
    assert more.peak_memory_bytes < base.peak_memory_bytes
    assert more.step_time_s > base.step_time_s


def test_module_subsets_are_monotone():
    for k in range(1, 3):
        for mods in combinations(MLA_MOE, k):
            for extra in set(MLA_MOE) - set(mods):
                a, b = estimate(DSV3, _dsv3_layout(mods)), estimate(DSV3, _dsv3_layout(mods + (extra,)))
                assert b.peak_memory_bytes <= a.peak_memory_bytes, (mods, extra)
                assert b.step_time_s >= a.step_time_s, (mods, extra)


def test_dgxc_deepseek_v3_h100_recipe_fits_only_with_mla_up_proj():
    # dgxc-benchmarking deepseek_v3/pretraining/launch.sh (25.05.04): H100 512 GPUs, tp 2, pp 8,
    # ep 64, --recompute_modules mla_up_proj (selective). Without recompute it does not fit in 80 GB.
    split = (7, 8, 8, 8, 8, 8, 8, 6)
    assert not estimate(DSV3, _dsv3_layout(recompute="none", layers_per_stage=split)).fits
    assert estimate(DSV3, _dsv3_layout(("mla_up_proj",), layers_per_stage=split)).fits


def test_layouts_validate_their_modules():
    with pytest.raises(ValueError, match="recompute_modules"):
        Strategy(dp=8, recompute="selective", recompute_modules=("attention",))
    with pytest.raises(ValueError, match="applies to selective recompute; this layout recomputes full"):
        Strategy(dp=8, recompute="full", recompute_modules=("moe_act",))
    assert Strategy(dp=8, recompute="selective", recompute_modules=("moe_act", "core_attn")).recompute_modules \
        == ("core_attn", "moe_act")  # Megatron's order
    llama = make_problem("llama3-8b")
    with pytest.raises(LayoutError, match="recompute_modules_in_model: .*mla_up_proj needs multi-latent attention"):
        check_strategy(llama, Strategy(dp=8, recompute="selective", recompute_modules=("mla_up_proj",)))
    titan = make_problem("deepseek-v3", nodes=64, per_node=8, gbs=4096, framework="torchtitan")
    with pytest.raises(LayoutError, match="recompute_modules_megatron: .*torchtitan recomputes its own way"):
        check_strategy(titan, _dsv3_layout(("core_attn", "moe_act"), zero=3))


def test_search_offers_the_memory_saving_set_where_the_model_has_it():
    assert memory_saving_modules(DSV3) == ("core_attn", "layernorm", "mla_up_proj", "moe_act")
    assert memory_saving_modules(make_problem("mixtral-8x7b")) == ("core_attn", "layernorm", "moe_act")
    assert memory_saving_modules(make_problem("llama3-8b")) == ("core_attn",)
    masks = set(enumerate_layouts(make_problem("deepseek-v3", nodes=8)).recompute_modules.tolist())
    assert {module_names(m) for m in masks} == {("core_attn",), ("core_attn", "moe_act", "layernorm", "mla_up_proj")}
    assert set(enumerate_layouts(make_problem("llama3-8b")).recompute_modules.tolist()) == {1}


def test_deepseek_v3_search_picks_the_memory_saving_modules():
    # On 64 x 8 H100 (gbs 4096, seq 4096) the best plans shard the experts 256 ways (with DeepEP and
    # the EP overlap hiding the all-to-all) and need no recompute; where they recompute, it is the
    # cheap, memory-heavy modules, not whole layers.
    p = make_problem("deepseek-v3", nodes=64, per_node=8, gbs=4096, seq=4096)
    layouts = [e.strategy for e in search(p, top_k=200).layouts]
    assert layouts[0].recompute == "none"
    selective = [s for s in layouts if s.recompute == "selective"]
    assert selective and "mla_up_proj" in selective[0].recompute_modules
    assert all(s.recompute != "full" for s in layouts[:len(layouts) // 2])


# ----- command line, launch scripts, exports ---------------------------------------------------
DSV3_CLI = ["--model", "deepseek-v3", "--device", "h100-80gb", "--nodes", "64", "--devices-per-node", "8",
            "--gbs", "4096", "--seq-len", "4096", "--tp", "2", "--pp", "8", "--ep", "64", "--etp", "1",
            "--sp", "--zero", "1", "--recompute", "selective", "--json"]


def _cli(args):
    return CliRunner().invoke(app, args)


def test_cli_recompute_modules_lower_the_estimated_memory():
    base = json.loads(_cli(["estimate", *DSV3_CLI]).stdout)
    more = json.loads(_cli(["estimate", *DSV3_CLI, "--recompute-modules", "core_attn,mla_up_proj,moe_act"]).stdout)
    assert more["peak_memory_bytes"] < base["peak_memory_bytes"]
    assert more["step_time_s"] > base["step_time_s"]
    assert more["strategy"]["recompute_modules"] == ["core_attn", "moe_act", "mla_up_proj"]


@pytest.mark.parametrize("args, needle", [
    (["--recompute-modules", "attention"], "--recompute-modules='attention': allowed core_attn, moe_act, layernorm"),
    (["--recompute-modules", ""], "--recompute-modules='': empty"),
    (["--recompute-modules", "mla_up_proj"],
     "--recompute-modules='mla_up_proj': mla_up_proj needs multi-latent attention; model llama3-8b has none "
     "(allowed for it: core_attn, mlp)"),
    (["--recompute-modules", "moe_act"], "moe_act needs MoE layers; model llama3-8b has none"),
    (["--recompute", "full", "--recompute-modules", "mlp"],
     "error: --recompute-modules=mlp with --recompute=full: the modules are what selective recompute recomputes"),
])
def test_cli_bad_recompute_modules_are_one_error_line(args, needle):
    recompute = [] if "--recompute" in args else ["--recompute", "selective"]  # each option given once
    res = _cli(["estimate", "--model", "llama3-8b", "--device", "h100-80gb", *recompute, *args])
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr, res.stderr


def test_search_recompute_modules_pin_the_set():
    res = _cli(["search", "--model", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "256",
                "--recompute-modules", "moe_act", "--recompute", "selective,full", "--json", "--top", "30"])
    doc = json.loads(res.stdout)
    selective = [lay["strategy"] for lay in doc["layouts"] if lay["strategy"]["recompute"] == "selective"]
    assert selective and all(s["recompute_modules"] == ["moe_act"] for s in selective)
    assert all(lay["strategy"]["recompute_modules"] == ["core_attn"] for lay in doc["layouts"]
               if lay["strategy"]["recompute"] != "selective")


def test_script_recompute_modules_are_read_and_written_back(tmp_path):
    text = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()
    assert "--recompute-modules" not in text and "--recompute-granularity" not in text
    script = tmp_path / "mixtral.sh"
    script.write_text(text.replace("--moe-grouped-gemm", "--moe-grouped-gemm --recompute-granularity selective "
                                   "--recompute-modules moe_act layernorm"))
    assert read_script(script).layout["recompute_modules"] == ("moe_act", "layernorm")
    # Megatron reads the modules under selective granularity only.
    full = tmp_path / "full.sh"
    full.write_text(text.replace("--moe-grouped-gemm", "--moe-grouped-gemm --recompute-granularity full "
                                 "--recompute-method uniform --recompute-num-layers 1 --recompute-modules moe_act"))
    assert read_script(full).layout["recompute_modules"] == ("core_attn",)
    # The Megatron export writes the modules; the default core_attn is left to the script.
    p = make_problem("mixtral-8x7b", gbs=64)
    s = Strategy(dp=8, ep=8, etp=1, recompute="selective", recompute_modules=("moe_act", "layernorm"))
    assert "--recompute-modules moe_act layernorm" in WRITERS["megatron"](p, s)
    assert "--recompute-modules" not in WRITERS["megatron"](p, s.model_copy(update={"recompute_modules": ("core_attn",)}))
    with pytest.raises(AutoparError, match="MindSpeed-LLM cannot express this layout: recompute modules moe_act"):
        WRITERS["mindspeed"](p, s)
    bad = tmp_path / "bad.sh"
    bad.write_text(text.replace("--moe-grouped-gemm", "--moe-grouped-gemm --recompute-granularity selective "
                                "--recompute-modules attn"))
    with pytest.raises(AutoparError, match="bad.sh: --recompute-modules='attn': allowed"):
        read_script(bad)


def test_exported_module_sets_pass_megatrons_checks(tmp_path):
    # The DeepSeek-V3 export with the memory-saving set reads back clean (MLA, grouped GEMM);
    # the checker catches rule 25 on a hand-edited script.
    from autopar.export.checks import violations

    s = _dsv3_layout(("core_attn", "layernorm", "mla_up_proj", "moe_act"))
    text = WRITERS["megatron"](DSV3, s)
    assert "--recompute-modules core_attn moe_act layernorm mla_up_proj" in text
    assert violations(read_script(tmp_path / "ok.sh", text)) == []
    bad = text.replace("--moe-grouped-gemm ", "")
    assert violations(read_script(tmp_path / "bad.sh", bad)) == [
        "recompute_modules: --recompute-modules moe_act without --moe-grouped-gemm"]


def test_writers_without_a_module_list_refuse_other_sets():
    s = _dsv3_layout(("core_attn", "moe_act"))
    for fmt, name in (("sapp", "SAPP"), ("torchtitan", "torchtitan"), ("deepspeed", "DeepSpeed")):
        with pytest.raises(AutoparError, match=f"{name} cannot express this layout: recompute modules core_attn,moe_act"):
            WRITERS[fmt](DSV3, s)
    res = _cli(["export", "--format", "torchtitan", *DSV3_CLI[:-1], "--recompute-modules", "core_attn,moe_act"])
    assert res.exit_code == 2 and "is Megatron-LM's; torchtitan recomputes its own way" in res.stderr, res.stderr


def test_search_targets_without_module_lists_try_only_core_attn():
    p = make_problem("mixtral-8x7b", nodes=2, gbs=256)
    for target in ("mindspeed", "sapp"):
        result = search(p, top_k=30, target=target)
        assert all(e.strategy.recompute_modules == ("core_attn",) for e in result.layouts)
    res = _cli(["search", "--model", "mixtral-8x7b", "--device", "ascend-910b", "--nodes", "2", "--gbs", "256",
                "--target", "sapp", "--recompute-modules", "moe_act"])  # MindFormers runs on Ascend
    assert res.exit_code == 2 and "error: --recompute-modules moe_act with --target sapp: only megatron" in res.stderr


def test_balance_takes_the_moe_and_fp8_options():
    # Mixtral on 16 H100: a busier expert rank (imbalance 1.5) costs more per micro-batch.
    base = ["balance", "--model", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "256",
            "--pp", "4", "--ep", "4", "--etp", "1", "--tp", "1", "--recompute", "full"]
    even, skewed = _cli(base), _cli(base + ["--moe-token-imbalance", "1.5"])
    assert even.exit_code == 0 and skewed.exit_code == 0, skewed.output
    step = lambda out: float(out.split("balanced ")[1].split(" s")[0])  # noqa: E731
    assert step(skewed.stdout) > step(even.stdout)
    res = _cli(base + ["--fp8-param-storage"])
    assert res.exit_code == 2 and "--fp8-param-storage with --precision=bf16" in res.stderr


def test_module_check_does_not_build_a_tuple_per_stage():
    """A recompute-module set on a layout with a huge pp is checked from the options, not from one
    entry per stage (pp = 2**31 ran out of memory building ``stage_recompute``)."""
    from autopar.strategy import Strategy

    assert Strategy(dp=1, pp=2**31, recompute="selective", recompute_modules=("core_attn", "mla_up_proj")).pp == 2**31
    with pytest.raises(ValueError, match="applies to selective recompute; this layout recomputes full"):
        Strategy(dp=1, pp=2**31, recompute="full", recompute_modules=("core_attn", "mla_up_proj"))
