"""fp8 recipes (``TrainSpec.fp8_recipe``, :mod:`autopar.cost.fp8_recipe`): which device runs
which, their weight copies and scaling state, their quantisation traffic; read from Megatron
scripts and written by the exports, or refused."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from autopar.cost import fp8, fp8_recipe
from autopar.cost.stage import all_stages
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export.megatron import precision_flags
from autopar.export.torchtitan import config as torchtitan_config
from autopar.specs.cluster import load_device
from autopar.specs.script import read_script
from autopar.specs.train import TrainSpec
from autopar.strategy import Strategy
from conftest import make_problem
from test_script_flags import script  # a tp 2, pp 2 job on 8 devices plus the given flags

C11 = Strategy(dp=8, zero=1)
LLAMA2_7B_LINEAR = 6_476_005_376  # 32 * (4 h^2 + 3 h ffn), tests/cost/test_fp8.py


def test_cast_bytes_per_element_by_recipe():
    # read bf16 (2 B), write both layouts; + a 2 B amax read where the scale comes from the tensor.
    assert fp8_recipe.cast_bytes_per_element("delayed") == 2 + 1 + 1
    assert fp8_recipe.cast_bytes_per_element("tensorwise") == 2 + 2 + 1 + 1
    assert fp8_recipe.cast_bytes_per_element("blockwise") == 2 + 2 * (1 + 4 / 128)  # fp32 per 1x128 tile
    assert fp8_recipe.cast_bytes_per_element("mxfp8") == 2 + 2 * (1 + 1 / 32)  # E8M0 per 32
    assert fp8_recipe.cast_bytes_per_element("nvfp4") == 2 + 2 + 2 * (0.5 + 1 / 16)  # E4M3 per 16


@pytest.mark.parametrize("device, recipe, allowed", [
    ("h100-80gb", "delayed", True), ("h100-80gb", "tensorwise", True), ("h100-80gb", "blockwise", True),
    ("h100-80gb", "mxfp8", False), ("h100-80gb", "nvfp4", False),
    ("b200", "mxfp8", True), ("b200", "nvfp4", True), ("gb300", "nvfp4", True),
    ("mi300x", "tensorwise", True), ("mi300x", "mxfp8", False), ("mi300x", "blockwise", False),
    ("mi355x", "mxfp8", True), ("mi355x", "nvfp4", False),
])
def test_which_device_runs_which_recipe(device, recipe, allowed):
    assert (fp8_recipe.supported(load_device(device), recipe) is None) == allowed


def test_a_recipe_the_device_lacks_is_refused_by_name():
    p = make_problem("llama2-7b", gbs=64, seq=4096, precision="fp8", fp8_recipe="mxfp8")
    with pytest.raises(AutoparError, match=r"^--fp8-recipe=mxfp8: device h100-80gb has no block-scaled tensor cores"
                       r".*; recipes it runs: delayed, tensorwise, blockwise$"):  # blockwise runs on Hopper
        estimate(p, C11)
    p = make_problem("llama2-7b", device="a100-80gb", gbs=64, seq=4096, precision="fp8", fp8_recipe="tensorwise")
    with pytest.raises(AutoparError, match=r"^--precision=fp8: device a100-80gb has no fp8 peak"):
        estimate(p, C11)


def test_a_recipe_needs_fp8_training():
    with pytest.raises(ValidationError, match="fp8_recipe=mxfp8 applies to precision fp8, not bf16"):
        TrainSpec(global_batch_size=8, seq_len=128, fp8_recipe="mxfp8")


def _weights(recipe: str, device: str = "b200") -> float:
    p = make_problem("llama2-7b", device=device, gbs=64, seq=4096, precision="fp8", fp8_recipe=recipe)
    batch, stages = all_stages(p, C11)
    assert fp8.linear_params(p, batch, stages)[0] == LLAMA2_7B_LINEAR
    return float(fp8.extra_memory_bytes(p, batch, stages)[0])


def test_weight_copies_and_scaling_state_by_recipe():
    gemm_operands = 32 * 4 * 3  # 32 layers x 4 linear modules x (input, weight, gradient)
    assert _weights("delayed") == pytest.approx(2 * LLAMA2_7B_LINEAR + gemm_operands * 1026 * 4)
    assert _weights("tensorwise") == pytest.approx(2 * LLAMA2_7B_LINEAR + gemm_operands * 3 * 4)
    assert _weights("mxfp8") == pytest.approx((2 + 2 / 32) * LLAMA2_7B_LINEAR)
    assert _weights("nvfp4") == pytest.approx(2 * (0.5 + 1 / 16) * LLAMA2_7B_LINEAR + gemm_operands * 4)
    assert _weights("blockwise", "h100-80gb") == pytest.approx((2 + 8 / 128**2) * LLAMA2_7B_LINEAR)


def test_tensorwise_pays_one_more_read_and_cannot_quantise_in_the_norm():
    def compute_s(recipe):
        p = make_problem("llama2-7b", gbs=64, seq=4096, precision="fp8", fp8_recipe=recipe)
        return estimate(p, C11).time_breakdown_s["compute"]
    # Per token and layer, delayed scaling casts only the output-projection (4096) and fc2 (11008)
    # inputs, 4 B each: the norm writes the QKV and fc1 inputs in fp8. Current scaling needs each
    # tensor's amax first: all four inputs (4096, 4096, 4096, 11008) are cast, 6 B each.
    per_token = 6 * (3 * 4096 + 11008) - 4 * (4096 + 11008)
    # Backward (autopar.cost.fp8_backward): every output gradient is cast, 6 B instead of 4 B: QKV
    # 3 x 4096, fc1 2 x 11008, the two 4096-wide row-parallel outputs.
    backward_per_token = (6 - 4) * (3 * 4096 + 2 * 11008 + 2 * 4096)
    # 4096 tokens per micro-batch, 32 layers, 8 micro-batches.
    dev = load_device("h100-80gb")
    extra_bytes = (per_token + backward_per_token) * 4096 * 32 * 8
    expected = extra_bytes / (dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency)
    assert compute_s("tensorwise") - compute_s("delayed") == pytest.approx(expected, rel=1e-6)


def test_nvfp4_runs_linear_gemms_on_the_fp4_peak():
    p = make_problem("llama2-7b", device="b200", gbs=64, seq=4096, precision="fp8", fp8_recipe="nvfp4")
    assert fp8.gemm_precision(p, linear=True) == "fp4"
    assert fp8.gemm_precision(p, linear=False) == "bf16"
    mx = make_problem("llama2-7b", device="b200", gbs=64, seq=4096, precision="fp8", fp8_recipe="mxfp8")
    assert estimate(p, C11).step_time_s < estimate(mx, C11).step_time_s


@pytest.mark.parametrize("flags, recipe", [
    ("--fp8-format hybrid", "delayed"), ("--fp8-format hybrid --fp8-recipe tensorwise", "tensorwise"),
    ("--fp8-format e4m3 --fp8-recipe mxfp8", "mxfp8"), ("--fp8-format hybrid --fp8-recipe blockwise", "blockwise"),
    ("--fp4-format e2m1", "nvfp4"), ("--fp4-format e2m1 --fp4-recipe nvfp4", "nvfp4"),
])
def test_scripts_name_their_recipe(tmp_path, flags, recipe):
    train = read_script(script(tmp_path, flags)).train_fields
    assert (train["precision"], train["fp8_recipe"]) == ("fp8", recipe)


@pytest.mark.parametrize("flags, message", [
    ("--fp8-format hybrid --fp8-recipe custom", "--fp8-recipe='custom': allowed delayed, tensorwise, mxfp8, blockwise"),
    ("--fp4-format e2m1 --fp4-recipe custom", "--fp4-recipe='custom': autopar costs nvfp4"),
    ("--fp8-format hybrid --fp4-format e2m1", "--fp8-format with --fp4-format"),
    ("--fp4-format e3m2", "--fp4-format='e3m2': allowed e2m1"),
])
def test_scripts_with_a_recipe_autopar_cannot_cost_are_refused(tmp_path, flags, message):
    with pytest.raises(AutoparError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_script(script(tmp_path, flags))


@pytest.mark.parametrize("recipe, flags", [
    ("delayed", "--bf16 --fp8-format hybrid --fp8-recipe delayed"),
    ("mxfp8", "--bf16 --fp8-format hybrid --fp8-recipe mxfp8"),
    ("nvfp4", "--bf16 --fp4-format e2m1 --fp4-recipe nvfp4"),
])
def test_megatron_export_writes_the_recipe(recipe, flags):
    assert precision_flags(make_problem("llama2-7b", device="b200", precision="fp8", fp8_recipe=recipe)) == flags


def test_torchtitan_export_writes_its_converter_or_refuses():
    s = Strategy(dp=8, zero=3)
    tw = torchtitan_config(make_problem("llama3-8b", precision="fp8", fp8_recipe="tensorwise"), s)
    assert tw["model"]["converters"] == ["quantize.linear.float8"]
    mx = torchtitan_config(make_problem("llama3-8b", device="b200", precision="fp8", fp8_recipe="mxfp8"), s)
    assert mx["model"]["converters"] == ["quantize.linear.mx"]
    assert mx["quantize"]["linear"]["mx"]["recipe_name"] == "mxfp8_cublas"
    with pytest.raises(AutoparError, match="fp8 recipe delayed: torchtitan's float8 converters run tensorwise"):
        torchtitan_config(make_problem("llama3-8b", precision="fp8", fp8_recipe="delayed"), s)
    # No recipe named: each framework's own default, torchao's tensorwise for torchtitan.
    titan = make_problem("llama3-8b", precision="fp8", framework="torchtitan")
    assert titan.train.effective_fp8_recipe == "tensorwise"
    assert torchtitan_config(titan, s)["model"]["converters"] == ["quantize.linear.float8"]
    assert make_problem("llama3-8b", precision="fp8").train.effective_fp8_recipe == "delayed"


def test_megatron_bridge_names_the_recipe_or_refuses():
    from autopar.export.megatron_bridge import mixed_precision
    s = dict(precision="fp8", seq=4096)
    assert mixed_precision(make_problem("llama3-8b", device="b200", fp8_recipe="mxfp8", fp8_param_storage=True,
                                        **s)) == "bf16_with_mxfp8_mixed"
    assert mixed_precision(make_problem("llama3-8b", fp8_recipe="blockwise", **s)) == \
        "bf16_with_fp8_subchannel_scaling_mixed"
    with pytest.raises(AutoparError, match="bf16_with_fp8_subchannel_scaling_mixed .* sets fp8_param_gather=False"):
        mixed_precision(make_problem("llama3-8b", fp8_recipe="blockwise", fp8_param_storage=True, **s))
    # current scaling: Megatron-Bridge's recipe keeps the first and last layer in bf16 (mixed_precision.py)
    with pytest.raises(AutoparError, match="keeps 1,1 first,last layers in bf16, the plan 0,0"):
        mixed_precision(make_problem("llama3-8b", fp8_recipe="tensorwise", fp8_param_storage=True, **s))
    assert mixed_precision(make_problem("llama3-8b", fp8_recipe="tensorwise", fp8_param_storage=True,
                                        fp8_bf16_layers=(1, 1), **s)) == "bf16_with_fp8_current_scaling_mixed"


@pytest.mark.parametrize("recipe, framework, fused", [
    ("delayed", "megatron", True), ("mxfp8", "megatron", True), ("blockwise", "megatron", True),
    ("tensorwise", "megatron", False), ("nvfp4", "megatron", False), ("tensorwise", "torchtitan", False),
])
def test_the_norm_writes_the_quantised_input_where_the_scale_is_known_in_advance(recipe, framework, fused):
    # Transformer Engine LayerNormLinear (Megatron's QKV and fc1): 1024 x 4096 input elements.
    p = make_problem("llama3-8b", device="b200", precision="fp8", fp8_recipe=recipe, framework=framework)
    separate = fp8.cast_bytes(p, 1024, 4096, 1.0, linear=True)
    assert separate == fp8_recipe.cast_bytes_per_element(recipe) * 1024 * 4096
    assert fp8.cast_bytes(p, 1024, 4096, 1.0, linear=True, norm_input=True) == (0.0 if fused else separate)


CLI = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64", "--seq-len", "4096"]


@pytest.mark.parametrize("args, message", [
    (["--precision", "fp8", "--fp8-recipe", "mxfp8"], "error: --fp8-recipe=mxfp8: device h100-80gb has no block-scaled"),
    (["--fp8-recipe", "tensorwise"], "error: --fp8-recipe tensorwise with --precision=bf16"),
    (["--precision", "fp8", "--fp8-recipe", "e5m2"], "error: --fp8-recipe='e5m2': allowed delayed, tensorwise"),
])
def test_the_option_refuses_with_one_line(args, message):
    from typer.testing import CliRunner

    from autopar.cli import app
    out = CliRunner().invoke(app, ["estimate", *CLI, *args])
    assert out.exit_code == 2 and out.output.strip().startswith(message) and out.output.count("error:") == 1, out.output


def test_the_option_reaches_the_estimate_and_the_export():
    from typer.testing import CliRunner

    from autopar.cli import app
    runner = CliRunner()
    est = {r: runner.invoke(app, ["estimate", *CLI, "--precision", "fp8", "--fp8-recipe", r, "--json"])
           for r in ("delayed", "tensorwise")}
    assert all(o.exit_code == 0 for o in est.values())
    step = {r: json.loads(o.stdout)["step_time_s"] for r, o in est.items()}
    assert step["tensorwise"] > step["delayed"]  # the amax read and the unfused norm casts
    script = runner.invoke(app, ["export", "--format", "megatron", *CLI, "--precision", "fp8", "--fp8-recipe",
                                 "tensorwise"])
    assert script.exit_code == 0 and "--fp8-format hybrid --fp8-recipe tensorwise" in script.stdout


def test_devices_json_lists_the_recipes_each_preset_runs():
    from typer.testing import CliRunner

    from autopar.cli import app
    out = CliRunner().invoke(app, ["devices", "--json"])
    recipes = {d["name"]: d["fp8_recipes"] for d in json.loads(out.stdout)["devices"]}
    assert recipes["h100-80gb"] == ["delayed", "tensorwise", "blockwise"]
    assert recipes["b200"] == ["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]
    assert recipes["mi355x"] == ["delayed", "tensorwise", "mxfp8"]
    assert recipes["a100-80gb"] == []
