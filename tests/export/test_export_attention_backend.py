"""The attention kernel a plan is costed with is written by every export (issue 15): the Megatron
export wrote nothing for ``--no-flash-attention``, so Megatron-LM ran its default fused backend."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli.app import app

ARGS = ["export", "--model", "llama2-7b", "--device", "h100-80gb", "--nodes", "1", "--tp", "2", "--pp", "2",
        "--gbs", "64"]


def _export(*extra: str):
    return CliRunner().invoke(app, [*ARGS, *extra])


def test_megatron_export_writes_the_unfused_backend():
    fused, unfused = _export("--format", "megatron"), _export("--format", "megatron", "--no-flash-attention")
    assert fused.exit_code == 0 and unfused.exit_code == 0, fused.output + unfused.output
    assert "--attention-backend auto" in fused.output and "--attention-backend unfused" not in fused.output
    assert "--attention-backend unfused" in unfused.output and "--attention-backend auto" not in unfused.output
