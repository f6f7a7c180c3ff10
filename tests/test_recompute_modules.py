"""Selective recompute modules (Megatron --recompute-modules): what each frees and re-runs."""

from itertools import combinations

import numpy as np
import pytest

from autopar.cost import activations as act
from autopar.cost import compute as C
from autopar.cost.recompute import layer_recompute_s
from autopar.cost.stage import Stages, all_stages
from autopar.cost.stage_time import stage_time
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.search.grid import for_target
from autopar.specs.train import RECOMPUTE_MODULES
from autopar.strategy import LayoutBatch, Strategy
from conftest import SHARED, make_problem

MLA_MOE = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "shared_experts", "moe")


def _dsv3(modules=("core_attn",), **kw):
    return make_problem("deepseek-v3", nodes=64, per_node=8, gbs=4096, seq=4096, recompute_modules=modules, **kw)


def _dsv3_batch(recompute="selective"):
    s = Strategy(dp=32, tp=2, pp=8, ep=64, etp=1, mbs=1, sp=True, zero=1, recompute=recompute)
    return LayoutBatch.from_strategy(s, 4096)


def test_mla_up_proj_frees_q_k_v_and_the_normed_latents():
    # DeepSeek-V3, tp 2 + SP, s 4096: the up-projections' latent norm outputs (1536 + 512 wide, SP
    # shard) and q (128 x 192), k (128 x 192), v (128 x 128) per rank: 2 B x 4096 x 2048 / 2 +
    # 2 B x 4096 x 65536 / 2 = 8,388,608 + 268,435,456 bytes.
    b, on = _dsv3_batch(), np.array([True])
    before = act.attention_bytes(_dsv3(), b, on)
    after = act.attention_bytes(_dsv3(("core_attn", "mla_up_proj")), b, on)
    assert (before - after)[0] == 8_388_608 + 268_435_456
    # layernorm: MLA's input norm is its own module: its output, 2 B x 4096 x 7168 / 2.
    assert (before - act.attention_bytes(_dsv3(("core_attn", "layernorm")), b, on))[0] == 2 * 4096 * 7168 / 2


def test_moe_modules_free_their_activations():
    b, on = _dsv3_batch(), np.array([True])
    base = act.mlp_bytes(_dsv3(), b, True, on)
    # moe_act: the routed experts' SwiGLU output, 2 B x (4096 x 8 / 2 rows) x 2048 = 67,108,864.
    assert (base - act.mlp_bytes(_dsv3(("moe_act",)), b, True, on))[0] == 2 * 16384 * 2048
    # shared_experts: the shared expert's fc1 output and activation, 6 B x 4096 x 2048 / 2.
    assert (base - act.mlp_bytes(_dsv3(("shared_experts",)), b, True, on))[0] == 6 * 4096 * 2048 / 2
    # moe: the whole block; only the norm input and output (2 x 2 B x 4096 x 7168 / 2) stay.
    assert act.mlp_bytes(_dsv3(("moe",)), b, True, on)[0] == 2 * 2 * 4096 * 7168 / 2
    # Default core_attn frees nothing in the MLP block; selective off frees nothing either.
    assert base[0] == act.mlp_bytes(_dsv3(), b, True, np.array([False]))[0]
    assert base[0] == act.mlp_bytes(_dsv3(MLA_MOE), b, True, np.array([False]))[0]


def test_dense_mlp_recompute_keeps_only_the_mlp_input():
    # Llama-3-8B, tp 1, s 4096: fc1 input (2 B x 4096 x 4096) and SwiGLU fc1 output + activation
    # (6 B x 4096 x 14336) are freed: 33,554,432 + 352,321,536 bytes.
    p0 = make_problem("llama3-8b")
    p1 = make_problem("llama3-8b", recompute_modules=("core_attn", "mlp"))
    b, on = LayoutBatch.from_strategy(Strategy(dp=8, tp=1, mbs=1, recompute="selective"), 64), np.array([True])
    assert (act.mlp_bytes(p0, b, False, on) - act.mlp_bytes(p1, b, False, on))[0] == 33_554_432 + 352_321_536
    # A dense layer's norms are fused into TE's LayerNormLinear: layernorm recompute frees nothing.
    p2 = make_problem("llama3-8b", recompute_modules=("core_attn", "layernorm"))
    assert (act.attention_bytes(p2, b, on) + act.mlp_bytes(p2, b, False, on))[0] == \
        (act.attention_bytes(p0, b, on) + act.mlp_bytes(p0, b, False, on))[0]


def test_mla_up_proj_recompute_costs_its_two_gemms():
    # q up: 2 x 4096 x 12288 x 1536 FLOPs, kv up: 2 x 4096 x 16384 x 512, at 989.4e12 x 0.64
    # (H100 bf16 GEMM rate); RoPE with the q/k concatenations, 2 B x 2 x 4096 x (24576 + 24576) / 2
    # = 402,653,184 bytes, and the latent norms, 2 x 2 B x 2048 x 2048 = 16,777,216 bytes, at
    # 3.35e12 x 0.7 B/s; 5 kernels (2 GEMMs, norm, RoPE, concatenation) x 4 us.
    b = _dsv3_batch()
    p = _dsv3(("mla_up_proj",))
    layer = C.layer_forward_times(p, b, moe=True)
    gemm_s = (2 * 4096 * 12288 * 1536 + 2 * 4096 * 16384 * 512) / (989.4e12 * 0.64)
    memory_s = (402_653_184 + 16_777_216) / (3.35e12 * 0.7)
    expected = gemm_s + memory_s + 5 * 4e-6
    assert layer_recompute_s(p, b, layer, moe=True)[0] == pytest.approx(expected, rel=1e-9)
    # Modules add up: core_attn + mla_up_proj = each alone.
    both = layer_recompute_s(_dsv3(("core_attn", "mla_up_proj")), b, layer, moe=True)
    alone = layer_recompute_s(_dsv3(), b, layer, moe=True) + layer_recompute_s(p, b, layer, moe=True)
    assert both[0] == pytest.approx(alone[0], rel=1e-12)


def test_moe_recompute_repeats_the_forward_all_to_all():
    # A MoE-only middle stage: dispatch + combine forward and backward per layer (4 all-to-alls),
    # plus the forward two again under 'moe' recompute: 1.5x the expert-parallel time.
    s = _dsv3_batch().strategy(0, 61)
    p0, p1 = _dsv3(), _dsv3(("core_attn", "moe"))
    batch, stages = all_stages(p0, s)
    middle = np.array([3])
    s0 = stage_time(p0, batch.take(middle), _take(stages, middle))
    s1 = stage_time(p1, batch.take(middle), _take(stages, middle))
    assert s1.ep_s[0] / s0.ep_s[0] == pytest.approx(1.5, rel=1e-12)


def _take(stages: Stages, rows: np.ndarray) -> Stages:
    return Stages(index=stages.index[rows], start=stages.start[rows], layers=stages.layers[rows])


@pytest.mark.parametrize("extra", [m for m in RECOMPUTE_MODULES if m != "core_attn" and m != "mlp"])
def test_each_module_saves_memory_and_costs_time(extra):
    # Adding a module to selective recompute never raises memory nor lowers step time.
    s = _dsv3_batch().strategy(0, 61)
    base, more = estimate(_dsv3(), s), estimate(_dsv3(("core_attn", extra)), s)
    assert more.peak_memory_bytes < base.peak_memory_bytes
    assert more.step_time_s > base.step_time_s


def test_module_subsets_are_monotone():
    s = _dsv3_batch().strategy(0, 61)
    for k in range(1, 3):
        for mods in combinations(MLA_MOE, k):
            for extra in set(MLA_MOE) - set(mods):
                a, b = estimate(_dsv3(mods), s), estimate(_dsv3(mods + (extra,)), s)
                assert b.peak_memory_bytes <= a.peak_memory_bytes, (mods, extra)
                assert b.step_time_s >= a.step_time_s, (mods, extra)


def test_dgxc_deepseek_v3_h100_recipe_fits_only_with_mla_up_proj():
    # dgxc-benchmarking deepseek_v3/pretraining/launch.sh (25.05.04): H100 512 GPUs, tp 2, pp 8,
    # ep 64, --recompute_modules mla_up_proj (selective). Without recompute it does not fit in 80 GB.
    s = Strategy(dp=32, tp=2, pp=8, ep=64, etp=1, mbs=1, sp=True, zero=1, layers_per_stage=(7, 8, 8, 8, 8, 8, 8, 6))
    assert not estimate(_dsv3(), s).fits
    recipe = s.model_copy(update={"recompute": "selective"})
    assert estimate(_dsv3(("mla_up_proj",)), recipe).fits


def test_modules_are_validated():
    with pytest.raises(ValueError, match="recompute_modules"):
        _dsv3(("attention",))
    with pytest.raises(ValueError, match="Megatron-LM option"):
        _dsv3(("core_attn", "moe_act"), framework="torchtitan")
    with pytest.raises(AutoparError, match="--target torchtitan.*Megatron-LM option"):
        for_target(_dsv3(("moe_act",)), "torchtitan")


# ----- command line, launch scripts, exports ---------------------------------------------------
DSV3_CLI = ["--model", "deepseek-v3", "--device", "h100-80gb", "--nodes", "64", "--devices-per-node", "8",
            "--gbs", "4096", "--seq-len", "4096", "--tp", "2", "--pp", "8", "--ep", "64", "--etp", "1",
            "--sp", "--zero", "1", "--recompute", "selective", "--json"]


def _cli(args):
    from typer.testing import CliRunner

    from autopar.cli import app
    return CliRunner().invoke(app, args)


def test_cli_recompute_modules_lower_the_estimated_memory():
    import json
    base = json.loads(_cli(["estimate", *DSV3_CLI]).stdout)
    more = json.loads(_cli(["estimate", *DSV3_CLI, "--recompute-modules", "core_attn,mla_up_proj,moe_act"]).stdout)
    assert more["peak_memory_bytes"] < base["peak_memory_bytes"]
    assert more["step_time_s"] > base["step_time_s"]


@pytest.mark.parametrize("value, needle", [
    ("attention", "--recompute-modules='attention': allowed core_attn, moe_act, layernorm"),
    ("", "--recompute-modules='': allowed"),
    ("mla_up_proj", "--recompute-modules: mla_up_proj needs multi-latent attention; model llama3-8b has none"),
    ("moe_act", "--recompute-modules: moe_act needs MoE layers; model llama3-8b has none"),
])
def test_cli_bad_recompute_modules_are_one_error_line(value, needle):
    res = _cli(["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--recompute", "selective",
                "--recompute-modules", value])
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr, res.stderr


def test_script_recompute_modules_are_read_and_written_back(tmp_path):
    from autopar.export import WRITERS
    from autopar.specs.script import read_script

    text = (SHARED / "scripts" / "pretrain_mixtral_8x7b.sh").read_text()
    assert "--recompute-modules" not in text
    script = tmp_path / "mixtral.sh"
    script.write_text(text.replace("--moe-grouped-gemm", "--moe-grouped-gemm --recompute-granularity selective "
                                   "--recompute-modules moe_act layernorm"))
    plan = read_script(script)
    assert plan.train_fields["recompute_modules"] == ("moe_act", "layernorm")
    # The Megatron export writes the modules; the default core_attn is left to the script.
    p = make_problem("mixtral-8x7b", gbs=64, recompute_modules=("moe_act", "layernorm"))
    s = Strategy(dp=8, ep=8, etp=1, recompute="selective")
    assert "--recompute-modules moe_act layernorm" in WRITERS["megatron"](p, s)
    assert "--recompute-modules" not in WRITERS["megatron"](make_problem("mixtral-8x7b", gbs=64), s)
    with pytest.raises(AutoparError, match="MindSpeed-LLM: recompute modules moe_act,layernorm"):
        WRITERS["mindspeed"](p, s)
    bad = tmp_path / "bad.sh"
    bad.write_text(text.replace("--moe-grouped-gemm", "--moe-grouped-gemm --recompute-modules attn"))
    with pytest.raises(AutoparError, match="bad.sh: --recompute-modules='attn': allowed"):
        read_script(bad)
