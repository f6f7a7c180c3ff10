"""``--noop-layers`` (MindSpeed): identity positions in the pipeline split, read and refused as MindSpeed does."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script
from conftest import mixtral_script


def script_with(tmp_path, extra: str, layers: int = 8, pp: int = 2) -> str:
    """A small tp 2, pp ``pp``, cp 2 Megatron launch script of ``layers`` layers plus ``extra`` flags."""
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py "
                    f"--num-layers {layers} --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
                    f"--vocab-size 1000 --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size {pp} "
                    f"--context-parallel-size 2 {extra}\n")
    return str(path)


runner = CliRunner()


def test_noop_layers_are_identity_positions_in_the_split(tmp_path):
    # DeepSeek-V3's recipe shape: 64 positions, noop 61,62,63, pp 8 -> 8 x 8 positions, last stage 5 real
    plan = read_script(script_with(tmp_path, "--noop-layers 61,62,63 --num-layer-list 1,1,1,1,1,1,1,57", 64, 8))
    m = plan.model_spec()
    assert m.num_layers == 61
    assert plan.layout["layers_per_stage"] == (8, 8, 8, 8, 8, 8, 8, 5)  # --num-layer-list ignored, as MindSpeed does
    # noop in the middle of stage 0 and the first/last-stage flags: positions 7 + 10 + 10 + 5 = 32
    plan = read_script(script_with(tmp_path, "--noop-layers 2,30 --decoder-first-pipeline-num-layers 7 "
                                         "--decoder-last-pipeline-num-layers 5", 32, 4))
    assert plan.model_spec().num_layers == 30 and plan.layout["layers_per_stage"] == (6, 10, 10, 4)


def test_noop_layers_with_virtual_stages_are_a_layout(tmp_path):
    # 8 positions over pp 2 x vpp 2: chunk v of rank r holds positions 2(2v + r), +1; noop 6 leaves
    # rank 1's second chunk (positions 6, 7) one real layer: E t t | t t | t t | t L.
    plan = read_script(script_with(tmp_path, "--noop-layers 6 --num-layers-per-virtual-pipeline-stage 2", 8, 2))
    assert plan.model_fields["num_layers"] == 7
    assert (plan.layout["vpp"], plan.layout["pipeline_layout"]) == (2, "Ett|(tt|)*2tL")


def test_noop_layers_renumber_moe_layers(tmp_path):
    plan = read_script(script_with(tmp_path, "--noop-layers 1,2 --num-experts 4 --moe-layer-freq 2", 8, 1))
    m = plan.model_spec()
    # positions 0..7, MoE at 0, 2, 4, 6; noop 1, 2 -> real positions 0, 3, 4, 5, 6, 7 -> MoE real 0, 2, 4
    assert m.num_layers == 6 and m.moe_layers == (0, 2, 4) and plan.layout["layers_per_stage"] is None


def test_noop_layers_cost_like_the_real_layer_count(tmp_path):
    args = ["--device", "h100-80gb", "--json", "--cp", "1", "--gbs", "64"]
    noop = runner.invoke(app, ["estimate", "--script", script_with(tmp_path, "--noop-layers 6,7 --use-flash-attn", 8, 1)] + args)
    (tmp_path / "b").mkdir()
    real = runner.invoke(app, ["estimate", "--script", script_with(tmp_path / "b", "", 6, 1)] + args)
    assert noop.exit_code == 0 and real.exit_code == 0, noop.output + real.output
    assert json.loads(noop.stdout)["step_time_s"] == json.loads(real.stdout)["step_time_s"]


@pytest.mark.parametrize("extra, layers, pp, needle", [
    ("--noop-layers 8", 8, 2, "each index must be in 0..7"),
    ("--noop-layers 1,x", 8, 2, "expected layer indices like 61,62,63"),
    ("--noop-layers 4,5,6,7", 8, 2, "leaves pipeline stage 1 without a real layer"),
    ("--noop-layers 6 --num-virtual-stages-per-pipeline-rank 4", 12, 2, "with virtual pipeline stages (vpp=4)"),
    ("--noop-layers 6", 9, 2, "--num-layers=9 (noop layers included) is not divisible by pp=2"),
])
def test_noop_layers_refusals(tmp_path, extra, layers, pp, needle):
    with pytest.raises(AutoparError, match="--noop-layers|--num-layers") as err:
        read_script(script_with(tmp_path, extra, layers, pp))
    assert needle in str(err.value)


def test_noop_layers_with_a_non_ascii_digit_is_one_error(tmp_path):
    # '³'.isdigit() is True but int('³') raised ValueError (a traceback).
    with pytest.raises(AutoparError, match="--noop-layers='³': expected layer indices like 61,62,63"):
        read_script(mixtral_script(tmp_path, "--noop-layers ³"))


def test_noop_layers_with_a_full_block_of_every_position(tmp_path):
    # 32 positions, pp 4: 8 per stage; noop 28..31 leaves 8,8,8,4 real layers. A block of 8
    # (Megatron allows up to the 8 positions per stage) recomputes every real layer; it was
    # refused as more than num_layers/pp = 28/4 = 7.
    script = mixtral_script(tmp_path, "--noop-layers 28,29,30,31 --recompute-granularity full --recompute-method block "
                               "--recompute-num-layers 8")
    lay = read_script(script).layout
    assert (lay["recompute"], lay["recompute_layers"], lay["layers_per_stage"]) == ("full", None, (8, 8, 8, 4))
