"""Combinations of cost-free flags Megatron-LM's validate_args rejects are refused with its message
(autopar.specs.script_asserts); autopar exited 0 on each. The overlap pair was checked with
tools/realclients/megatron_check.py (Megatron-LM main: REJECTED); the grouped-GEMM and rampup asserts
are Megatron-LM v0.15.3's (arguments.py lines 791 and 877 at that tag), the version of the flag table."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS, mixtral_script
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script


def _llama(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "job.sh"  # distributed optimizer, --train-iters 5000, --bf16
    path.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("--bf16\n", f"--bf16 {extra}\n"))
    return path


def test_overlap_param_gather_needs_overlap_grad_reduce(tmp_path):
    with pytest.raises(AutoparError, match="--overlap-param-gather without --overlap-grad-reduce: Megatron-LM asserts "
                       "'Must use --overlap-param-gather with --overlap-grad-reduce'"):
        read_script(_llama(tmp_path, "--overlap-param-gather"))
    assert read_script(_llama(tmp_path, "--overlap-param-gather --overlap-grad-reduce")).train_fields[
        "overlap_grad_reduce"]


def test_overlap_param_gather_needs_a_sharded_optimizer(tmp_path):
    path = _llama(tmp_path, "--overlap-param-gather --overlap-grad-reduce")
    path.write_text(path.read_text().replace("--use-distributed-optimizer", ""))
    with pytest.raises(AutoparError, match="only supported with distributed optimizer, megatron fsdp"):
        read_script(path)


def test_grouped_gemm_needs_bf16(tmp_path):
    path = mixtral_script(tmp_path, "")
    path.write_text(path.read_text().replace("--bf16", "--fp16"))
    with pytest.raises(AutoparError, match=r"--moe-grouped-gemm without --bf16: Megatron-LM v0.15.3 \(the version of "
                       r"autopar's flag table\) asserts 'Currently GroupedGEMM for MoE only supports bf16 dtype.'"):
        read_script(path)


def test_export_of_an_fp16_moe_is_refused():
    out = CliRunner().invoke(app, ["export", "--model", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "4",
                                   "--precision", "fp16", "--tp", "2", "--pp", "4", "--ep", "4", "--gbs", "512",
                                   "--format", "megatron"])
    assert out.exit_code == 2 and "GroupedGEMM for MoE only supports bf16" in out.output


def test_rampup_needs_sample_based_training(tmp_path):
    with pytest.raises(AutoparError, match="--rampup-batch-size with --train-iters: Megatron-LM v0.15.3 .* 'expected "
                       "no batch-size rampup for iteration-based training'"):
        read_script(_llama(tmp_path, "--rampup-batch-size 16 16 1000"))
    path = _llama(tmp_path, "--rampup-batch-size 16 16 1000 --train-samples 1280000")
    path.write_text(path.read_text().replace("--train-iters 5000", ""))
    assert read_script(path).train_fields["global_batch_size"] == 256


def test_local_transformer_impl_is_refused_in_a_megatron_script(tmp_path):
    """It was costed as the Transformer Engine layers (8.447 s for the Llama script, as without the flag),
    and search --write-script added --tp-comm-overlap, which the local spec has no userbuffers for."""
    with pytest.raises(AutoparError, match="--transformer-impl local is not modelled by autopar: Megatron-LM's local "
                       "spec runs unfused attention"):
        read_script(_llama(tmp_path, "--transformer-impl local"))
    with pytest.raises(AutoparError, match="--transformer-impl='fast': allowed transformer_engine, local"):
        read_script(_llama(tmp_path, "--transformer-impl fast"))
    assert read_script(_llama(tmp_path, "--transformer-impl transformer_engine")).framework == "megatron"


def test_local_transformer_impl_is_mindspeeds_standard_spec(tmp_path):
    """MindSpeed-LLM's example scripts pass --transformer-impl local with MindSpeed's fused kernels."""
    plan = read_script(_llama(tmp_path, "--transformer-impl local --use-fused-rmsnorm"))
    assert plan.framework == "mindspeed"
