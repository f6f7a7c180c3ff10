"""fp8 training with bf16 first/last layers (``TrainSpec.fp8_bf16_layers``, Megatron
``--first-last-layers-bf16``; :mod:`autopar.cost.fp8_bf16_layers`): time and memory checked by
hand, read from a script, written by the Megatron-LM and Megatron-Bridge exports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from test_bad_input import one_line_error
from typer.testing import CliRunner

from autopar.cli import app

from autopar.cost import fp8_bf16_layers
from autopar.cost.stage import all_stages
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron_bridge import mixed_precision
from autopar.rules import check_strategy
from autopar.search.grid import for_target
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import make_problem, mixtral_script

CS = dict(seq=8192, precision="fp8", fp8_recipe="tensorwise")  # Llama-3-8B, current scaling
S = Strategy(dp=8)
# Llama-3-8B linear parameters per layer: qkv 4096 x (4096 + 2 x 1024) + proj 4096^2 + SwiGLU 3 x 4096 x 14336
LAYER_LINEAR = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336


def test_layer_linear_params_by_hand():
    assert LAYER_LINEAR == 218_103_808


def test_memory_of_two_bf16_layers_by_hand():
    """Per bf16 layer: no fp8 weight copy (tensorwise: 2 B per linear parameter) and no scaling state
    (4 linears x 3 operands x 12 B), but its linears save bf16 inputs: QKV input +h, fc1 input +h, fc2
    input +ffn bytes per token, and the attention output no longer twice (-h): s * (h + ffn) = 8192 x
    18432 B. Two layers (1,1), pp 1, one micro-batch in flight."""
    fp8 = estimate(make_problem("llama3-8b", **CS), S).peak_memory_bytes
    ends = estimate(make_problem("llama3-8b", fp8_bf16_layers=(1, 1), **CS), S).peak_memory_bytes
    saved_per_layer = 2 * LAYER_LINEAR + 4 * 3 * 12 - 8192 * (4096 + 14336)
    assert fp8 - ends == 2 * saved_per_layer == 570_425_632


def test_every_layer_in_bf16_is_bf16_training():
    """The mechanism, not a factor: with all 32 layers kept in bf16 the step time and the memory are
    bf16 training's (the embedding and output layer are bf16 under fp8 anyway)."""
    bf16 = estimate(make_problem("llama3-8b", seq=8192), S)
    ends = estimate(make_problem("llama3-8b", fp8_bf16_layers=(16, 16), **CS), S)
    fp8 = estimate(make_problem("llama3-8b", **CS), S)
    assert ends.step_time_s == pytest.approx(bf16.step_time_s, rel=1e-12)
    assert ends.peak_memory_bytes == bf16.peak_memory_bytes
    one = estimate(make_problem("llama3-8b", fp8_bf16_layers=(1, 1), **CS), S)
    # two of 32 layers slower: between fp8 and bf16, at 2/32 of the way
    assert one.step_time_s - fp8.step_time_s == pytest.approx((bf16.step_time_s - fp8.step_time_s) * 2 / 32, rel=1e-6)


def test_layers_sit_on_the_first_and_last_stage():
    """DeepSeek-V3 (61 layers, the first three dense), pp 4: the first bf16 layer is dense on stage
    0, the last one MoE on stage 3, none on stages 1 and 2."""
    p = make_problem("deepseek-v3", nodes=8, precision="fp8", fp8_recipe="blockwise", fp8_bf16_layers=(1, 2))
    batch, stages = all_stages(p, Strategy(dp=2, pp=4, ep=8))
    dense, moe = fp8_bf16_layers.layer_counts(p, batch, stages)
    assert dense.tolist() == [1, 0, 0, 0] and moe.tolist() == [0, 0, 0, 2]


def test_megatron_rules():
    with pytest.raises(ValidationError, match="Delayed scaling does not support first / last layer in BF16"):
        make_problem("llama3-8b", precision="fp8", fp8_bf16_layers=(1, 1))
    with pytest.raises(ValidationError, match="precision is bf16"):
        make_problem("llama3-8b", fp8_bf16_layers=(1, 1))
    p = make_problem("llama3-8b", fp8_bf16_layers=(9, 1), **CS)  # 32 layers over pp 4: at most 8 per end
    with pytest.raises(LayoutError, match="fp8_bf16_layers_per_stage|at most num_layers // pp = 8"):
        check_strategy(p, Strategy(dp=2, pp=4))


def test_script_reads_the_flags(tmp_path):
    fp8 = "--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16"
    plan = read_script(mixtral_script(tmp_path, fp8 + " --num-layers-at-start-in-bf16 2"))
    assert plan.train_fields["fp8_bf16_layers"] == (2, 1)  # Megatron's default 1 for the end
    assert "fp8_bf16_layers" not in read_script(mixtral_script(tmp_path, "--fp8-format hybrid")).train_fields
    with pytest.raises(AutoparError, match="--first-last-layers-bf16 with the delayed fp8 recipe"):
        read_script(mixtral_script(tmp_path, "--fp8-format hybrid --first-last-layers-bf16"))


def test_exports_write_them():
    p = make_problem("llama3-8b", fp8_bf16_layers=(1, 2), **CS)
    assert "--first-last-layers-bf16 --num-layers-at-start-in-bf16 1 --num-layers-at-end-in-bf16 2" in \
        WRITERS["megatron"](p, S)
    with pytest.raises(AutoparError, match="export --format torchtitan: fp8 training with bf16 first/last layers"):
        WRITERS["torchtitan"](p, Strategy(dp=8, zero=3))
    # Megatron-Bridge: its current-scaling recipe is (1, 1), and --target megatron-bridge assumes it
    bridge = make_problem("llama3-8b", fp8_param_storage=True, **CS)
    assert for_target(bridge, "megatron-bridge").train.fp8_bf16_layers == (1, 1)
    assert mixed_precision(for_target(bridge, "megatron-bridge")) == "bf16_with_fp8_current_scaling_mixed"
    with pytest.raises(AutoparError, match="keeps 1,1 first,last layers in bf16, the plan 1,2"):
        mixed_precision(make_problem("llama3-8b", fp8_param_storage=True, fp8_bf16_layers=(1, 2), **CS))


@pytest.mark.parametrize("recipe, gathers", [("delayed", True), ("tensorwise", True), ("blockwise", False)])
def test_bridge_target_takes_its_recipes_fp8_weight_storage_unless_given(recipe, gathers):
    """Megatron-Bridge's mixed-precision recipes set fp8_param_gather (True for delayed and current
    scaling, False for subchannel/blockwise: FP8_MIXED_PRECISION); --target megatron-bridge plans with
    it where the user gave no --fp8-param-storage (a plain fp8 search failed: 'plan with
    --fp8-param-storage'), and keeps what the user gave."""
    p = make_problem("llama3-8b", precision="fp8", fp8_recipe=recipe)
    assert for_target(p, "megatron-bridge").train.fp8_param_storage is gathers
    given = make_problem("llama3-8b", precision="fp8", fp8_recipe=recipe, fp8_param_storage=not gathers)
    assert for_target(given, "megatron-bridge").train.fp8_param_storage is (not gathers)
    assert for_target(p, "megatron").train.fp8_param_storage is False  # Megatron-LM's default


@pytest.mark.parametrize("extra, needle", [
    (["--fp8-bf16-layers", "1"], "--fp8-bf16-layers='1': expected FIRST,LAST"),
    (["--fp8-bf16-layers", "1,1"], "--fp8-bf16-layers=1,1 with --precision=bf16"),
    (["--fp8-bf16-layers", "1,1", "--precision", "fp8"], "with the delayed fp8 recipe"),
    (["--fp8-bf16-layers", "20,20", "--precision", "fp8", "--fp8-recipe", "tensorwise"], "the model has 32 layers"),
])
def test_bad_option_values_are_one_line(extra, needle):
    assert needle in one_line_error(["estimate", "-m", "llama3-8b", "--device", "h100-80gb", *extra])


def test_option_changes_the_estimate():
    base = ["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--precision", "fp8", "--fp8-recipe",
            "tensorwise", "--seq-len", "8192", "--gbs", "64", "--json"]
    runner = CliRunner()
    plain = json.loads(runner.invoke(app, base).stdout)
    ends = json.loads(runner.invoke(app, [*base, "--fp8-bf16-layers", "1,1"]).stdout)
    assert plain["peak_memory_bytes"] - ends["peak_memory_bytes"] == 570_425_632
    assert np.isclose(ends["step_time_s"], estimate(make_problem("llama3-8b", fp8_bf16_layers=(1, 1), **CS),
                                                    S).step_time_s)
