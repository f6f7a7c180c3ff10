"""fp16 training keeps fp16 gradients unless --accumulate-allreduce-grads-in-fp32 (issue 15): Megatron-LM
main training.py passes ``grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32`` and
param_and_grad_buffer.py allocates ``torch.float if grad_reduce_in_fp32 else param.dtype``; only bf16
forces fp32 (arguments.py). autopar costed 4-byte gradients for fp16 scripts too."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script


def _fp16(tmp_path: Path, extra: str = "") -> Path:
    """The shipped llama2-7b script (tp 2, pp 4, distributed optimizer, 2 x 8 GPUs) in fp16."""
    path = tmp_path / f"fp16{len(extra)}.sh"
    path.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text()
                    .replace("--bf16\n", f"--fp16 --vocab-size 32000 {extra}\n"))
    return path


def _peak_bytes(path: Path) -> float:
    import json

    out = CliRunner().invoke(app, ["estimate", "--script", str(path), "--device", "h100-80gb", "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["peak_memory_bytes"]


def test_fp16_script_has_fp16_gradients(tmp_path):
    assert read_script(_fp16(tmp_path)).train_fields["grad_dtype"] == "fp16"
    fp32 = _fp16(tmp_path, "--accumulate-allreduce-grads-in-fp32")
    assert read_script(fp32).train_fields["grad_dtype"] == "fp32"
    # the peak stage 0 holds 8 layers and the embedding over tp 2: per layer 4*4096^2 (attention) +
    # 3*4096*11008 (SwiGLU MLP) sharded, 2*4096 norm weights replicated; 32000*4096/2 embedding rows:
    # 8*(202,375,168/2 + 8,192) + 65,536,000 = 875,102,208 parameters, 2 B less per gradient
    assert _peak_bytes(fp32) - _peak_bytes(_fp16(tmp_path)) == 2 * 875_102_208


def test_bf16_gradients_with_fp16_are_refused(tmp_path):
    with pytest.raises(AutoparError, match="--fp16 with --grad-reduce-in-bf16: Megatron-LM reads bf16 gradients"):
        read_script(_fp16(tmp_path, "--grad-reduce-in-bf16"))


def test_megatron_export_writes_fp32_gradients_of_fp16_training():
    args = ["export", "--model", "llama2-7b", "--device", "h100-80gb", "--nodes", "1", "--tp", "2", "--gbs", "64",
            "--precision", "fp16"]
    out = CliRunner().invoke(app, [*args, "--format", "megatron"])
    assert out.exit_code == 0 and "--accumulate-allreduce-grads-in-fp32" in out.output  # costed with fp32 gradients


def test_an_fp16_script_exports_its_fp16_gradients(tmp_path):
    out = CliRunner().invoke(app, ["export", "--script", str(_fp16(tmp_path)), "--device", "h100-80gb",
                                   "--format", "megatron"])
    assert out.exit_code == 0, out.output
    assert "--fp16" in out.output and "--accumulate-allreduce-grads-in-fp32" not in out.output
    assert "--grad-reduce-in-bf16" not in out.output


def test_fp16_gradients_stay_with_the_scripts_precision(tmp_path):
    """--precision bf16 on an fp16 script: the script's fp16 gradients are fp16 training's own dtype, so
    the bf16 plan gets Megatron's fp32 gradients (the script's state carried over would be invalid)."""
    path = _fp16(tmp_path)
    out = CliRunner().invoke(app, ["estimate", "--script", str(path), "--device", "h100-80gb", "--precision",
                                   "bf16"])
    assert out.exit_code == 0, out.output
