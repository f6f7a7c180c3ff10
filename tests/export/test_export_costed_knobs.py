"""Each export writes the knobs its plan was costed with, or refuses them (issue 15): the Megatron
export wrote nothing for ``--no-flash-attention`` (Megatron-LM ran its default fused backend);
torchtitan wrote the same TOML with and without unfused attention or fp8 parameter storage;
Megatron-Bridge wrote ``ddp.overlap_grad_reduce=false`` at zero 0 while the estimate overlapped it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli.app import app

LLAMA = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64"]


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_megatron_export_writes_the_unfused_backend():
    fused = _run("export", *LLAMA, "--tp", "2", "--format", "megatron")
    unfused = _run("export", *LLAMA, "--tp", "2", "--format", "megatron", "--no-flash-attention")
    assert fused.exit_code == 0 and unfused.exit_code == 0, fused.output + unfused.output
    assert "--attention-backend auto" in fused.output and "--attention-backend unfused" not in fused.output
    assert "--attention-backend unfused" in unfused.output and "--attention-backend auto" not in unfused.output


@pytest.mark.parametrize("extra, needle", [
    (["--no-flash-attention"], "unfused attention (--no-flash-attention): torchtitan's models run SDPA or flex"),
    (["--precision", "fp8", "--fp8-param-storage"], "fp8 parameter storage (--fp8-param-storage): torchtitan's FSDP2"),
])
def test_torchtitan_refuses_what_it_cannot_write(extra, needle):
    args = ["export", *LLAMA, "--tp", "2", "--sp", "--zero", "3", "--format", "torchtitan"]
    assert _run(*args, "--precision", "fp8").exit_code == 0
    out = _run(*args, *extra)
    assert out.exit_code == 2 and out.output.startswith("error: torchtitan cannot express this layout: " + needle)


def test_torchtitan_refuses_a_model_with_dropout():
    from autopar.errors import AutoparError
    from autopar.export.torchtitan import config
    from autopar.problem import Problem
    from autopar.specs import load_device, load_model, make_cluster
    from autopar.specs.train import TrainSpec
    from autopar.strategy import Strategy

    model = load_model("llama3-8b").model_copy(update={"dropout": True})
    p = Problem(model, make_cluster(load_device("h100-80gb"), 1, 8), TrainSpec(global_batch_size=64, seq_len=8192))
    with pytest.raises(AutoparError, match="dropout: model llama3-8b is costed with dropout masks"):
        config(p, Strategy(dp=4, tp=2, sp=True, zero=3))


def test_bridge_writes_the_overlapped_grad_reduce_at_zero_0():
    """The estimate costs no exposed dp_comm at zero 0 with the overlap; the Megatron export writes
    --overlap-grad-reduce for it, and Megatron-Core's DDP overlaps without the distributed optimizer."""
    est = _run("estimate", *LLAMA, "--tp", "2", "--zero", "0", "--json")
    import json

    assert json.loads(est.stdout)["time_breakdown_s"]["dp_comm"] == 0.0
    bridge = _run("export", *LLAMA, "--tp", "2", "--zero", "0", "--format", "megatron-bridge")
    assert "ddp.overlap_grad_reduce=true" in bridge.output and "ddp.overlap_param_gather=false" in bridge.output
    megatron = _run("export", *LLAMA, "--tp", "2", "--zero", "0", "--format", "megatron")
    assert "--overlap-grad-reduce" in megatron.output and "--overlap-param-gather" not in megatron.output


def test_bridge_writes_both_dropout_rates():
    out = _run("export", *LLAMA, "--tp", "2", "--format", "megatron-bridge")
    assert "model.attention_dropout=0.0" in out.output and "model.hidden_dropout=0.0" in out.output
