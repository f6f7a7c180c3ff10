"""The first line of ``search``, ``estimate`` and ``plan`` names the problem, its precision and,
for fp8 training, the recipe costed: a user sees whether the script's ``--fp8-format`` and
``--fp8-recipe`` were read."""

from __future__ import annotations

import pytest
from conftest import SCRIPTS
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
QWEN_FP8 = ["--script", str(SCRIPTS / "pretrain_qwen3_30b_a3b_h100_fp8cs.sh"), "--device", "h100-80gb"]
# the script: 2 x 8 H100, gbs 512, seq 4096, --fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather
QWEN_TITLE = ("pretrain_qwen3_30b_a3b_h100_fp8cs (30.5 B params) on 2 x 8 h100-80gb, gbs 512, seq 4096, "
              "fp8 (tensorwise recipe, fp8 weights only)")


def _first_line(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()[0]


@pytest.mark.parametrize("command", [["estimate"], ["search", "--top", "1", "--tp", "1", "--pp", "2", "--ep", "8"]])
def test_fp8_script_title_says_the_recipe_read(command):
    assert _first_line([*command, *QWEN_FP8]) == QWEN_TITLE


@pytest.mark.parametrize("options, precision", [
    ([], "bf16"),
    (["--precision", "fp8"], "fp8 (delayed recipe)"),  # Megatron-LM's default --fp8-recipe
    (["--precision", "fp8", "--fp8-recipe", "tensorwise", "--fp8-bf16-layers", "1,1"],
     "fp8 (tensorwise recipe, first 1 and last 1 layers in bf16)"),
])
def test_estimate_title_names_model_cluster_batch_and_precision(options, precision):
    line = _first_line(["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", *options])
    assert line == f"llama3-8b (8.0 B params) on 1 x 8 h100-80gb, gbs 64, seq 4096, {precision}"


def test_nvfp4_title_says_fp4():
    line = _first_line(["estimate", "-m", "llama3-8b", "--device", "b200", "--gbs", "64", "--precision", "fp8",
                        "--fp8-recipe", "nvfp4"])
    assert line.endswith("seq 4096, fp4 (nvfp4 recipe, fp4 linear layers)")
