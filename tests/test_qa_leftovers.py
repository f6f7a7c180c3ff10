"""QA leftovers: one error line without a warning before it, tp suggestions that pass the model's
tp rules, Galvatron refusing fp8, and the script flags --cp-comm-type / --noop-layers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script
from conftest import MODELS

runner = CliRunner()
LLAMA3_8B = str(MODELS / "llama3-8b.json")  # 32 heads, 8 KV heads, ffn 14336, 8192 positions


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and "Traceback" not in err, err
    return err


def test_seq_len_beyond_positions_that_then_fails_prints_only_the_error():
    # 16M tokens on 8 H100: nothing fits; the max-positions warning must not precede the error
    result = runner.invoke(app, ["search", "--model", LLAMA3_8B, "--device", "h100-80gb", "--seq-len", "16000000"])
    assert "no layout fits" in _one_error_line(result)


def test_seq_len_beyond_positions_that_succeeds_keeps_the_warning():
    result = runner.invoke(app, ["estimate", "--model", LLAMA3_8B, "--device", "h100-80gb", "--seq-len", "16384",
                                 "--tp", "8", "--recompute", "full", "--gbs", "8"])
    assert result.exit_code == 0, result.output
    assert "warning: --seq-len 16384 exceeds the model's max_position_embeddings 8192" in result.stderr


def test_tp_suggestion_drops_values_the_kv_heads_rule_refuses():
    # 4 nodes x 8 = 32 devices: divisors 1, 2, 4, 8, 16, 32; 8 KV heads refuse 16 and 32
    result = runner.invoke(app, ["estimate", "--model", LLAMA3_8B, "--device", "h100-80gb", "--nodes", "4",
                                 "--tp", "3"])
    err = _one_error_line(result)
    assert "--tp may be 1, 2, 4, 8 (" in err


def test_tp_suggestion_follows_pp_and_cp_and_moe_ffn():
    # qwen3-30b-a3b: 32 heads, 4 KV heads -> tp in 1, 2, 4; world 32 / (pp 2 * cp 2) = 8
    result = runner.invoke(app, ["estimate", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--nodes", "4",
                                 "--tp", "3", "--pp", "2", "--cp", "2"])
    assert "--tp may be 1, 2, 4 (" in _one_error_line(result)


@pytest.mark.parametrize("command", [
    ["export", "--format", "galvatron", "--zero", "0"],
    ["search", "--target", "galvatron", "--top", "1"],
])
def test_galvatron_refuses_fp8(command):
    result = runner.invoke(app, command + ["--model", "llama3-8b", "--device", "h100-80gb", "--precision", "fp8"])
    err = _one_error_line(result)
    assert "precision fp8" in err and "--format megatron or torchtitan" in err


def test_galvatron_bf16_still_written():
    result = runner.invoke(app, ["export", "--format", "galvatron", "--model", "llama3-8b", "--device", "h100-80gb",
                                 "--zero", "0", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tp_sizes_enc"].split(",") == ["2"] * 32


def _script(tmp_path, extra: str, layers: int = 8, pp: int = 2) -> str:
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py "
                    f"--num-layers {layers} --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
                    f"--vocab-size 1000 --bf16 --tensor-model-parallel-size 2 --pipeline-model-parallel-size {pp} "
                    f"--context-parallel-size 2 {extra}\n")
    return str(path)


@pytest.mark.parametrize("flag", ["--cp-comm-type p2p", "--cp-comm-type p2p p2p p2p p2p p2p p2p p2p p2p", ""])
def test_cp_comm_type_p2p_is_read(tmp_path, flag):
    assert read_script(_script(tmp_path, flag)).layout["cp"] == 2


@pytest.mark.parametrize("flag, needle", [
    ("--cp-comm-type a2a+p2p", "needs --hierarchical-context-parallel-sizes A P"),
    ("--cp-comm-type p2p p2p allgather p2p p2p p2p p2p a2a+p2p", "mixes a2a+p2p, allgather, p2p across layers"),
    ("--cp-comm-type ring", "ring not allowed; Megatron-LM accepts p2p, a2a, allgather, a2a+p2p"),
])
def test_cp_comm_type_bad_values_are_refused(tmp_path, flag, needle):
    with pytest.raises(AutoparError, match="--cp-comm-type") as err:
        read_script(_script(tmp_path, flag))
    assert needle in str(err.value)
    result = runner.invoke(app, ["estimate", "--script", _script(tmp_path, flag), "--device", "h100-80gb"])
    assert needle in _one_error_line(result)


def test_noop_layers_are_identity_positions_in_the_split(tmp_path):
    # DeepSeek-V3's recipe shape: 64 positions, noop 61,62,63, pp 8 -> 8 x 8 positions, last stage 5 real
    plan = read_script(_script(tmp_path, "--noop-layers 61,62,63 --num-layer-list 1,1,1,1,1,1,1,57", 64, 8))
    m = plan.model_spec()
    assert m.num_layers == 61
    assert plan.layout["layers_per_stage"] == (8, 8, 8, 8, 8, 8, 8, 5)  # --num-layer-list ignored, as MindSpeed does
    # noop in the middle of stage 0 and the first/last-stage flags: positions 7 + 10 + 10 + 5 = 32
    plan = read_script(_script(tmp_path, "--noop-layers 2,30 --decoder-first-pipeline-num-layers 7 "
                                         "--decoder-last-pipeline-num-layers 5", 32, 4))
    assert plan.model_spec().num_layers == 30 and plan.layout["layers_per_stage"] == (6, 10, 10, 4)


def test_noop_layers_with_virtual_stages_are_a_layout(tmp_path):
    # 8 positions over pp 2 x vpp 2: chunk v of rank r holds positions 2(2v + r), +1; noop 6 leaves
    # rank 1's second chunk (positions 6, 7) one real layer: E t t | t t | t t | t L.
    plan = read_script(_script(tmp_path, "--noop-layers 6 --num-layers-per-virtual-pipeline-stage 2", 8, 2))
    assert plan.model_fields["num_layers"] == 7
    assert (plan.layout["vpp"], plan.layout["pipeline_layout"]) == (2, "Ett|(tt|)*2tL")


def test_noop_layers_renumber_moe_layers(tmp_path):
    plan = read_script(_script(tmp_path, "--noop-layers 1,2 --num-experts 4 --moe-layer-freq 2", 8, 1))
    m = plan.model_spec()
    # positions 0..7, MoE at 0, 2, 4, 6; noop 1, 2 -> real positions 0, 3, 4, 5, 6, 7 -> MoE real 0, 2, 4
    assert m.num_layers == 6 and m.moe_layers == (0, 2, 4) and plan.layout["layers_per_stage"] is None


def test_noop_layers_cost_like_the_real_layer_count(tmp_path):
    args = ["--device", "h100-80gb", "--json", "--cp", "1", "--gbs", "64"]
    noop = runner.invoke(app, ["estimate", "--script", _script(tmp_path, "--noop-layers 6,7", 8, 1)] + args)
    (tmp_path / "b").mkdir()
    real = runner.invoke(app, ["estimate", "--script", _script(tmp_path / "b", "", 6, 1)] + args)
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
        read_script(_script(tmp_path, extra, layers, pp))
    assert needle in str(err.value)
