"""``autopar balance`` defaults: the memory limit is the whole device."""

from __future__ import annotations


def test_balance_default_limit_is_the_whole_device():
    """README: ``balance`` limits memory to the whole device unless --memory-limit-gib says
    otherwise (H100 80GB preset: 79.6 GiB, `autopar devices`)."""
    from typer.testing import CliRunner

    from autopar.cli import app

    args = ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--pp", "4", "--gbs", "32"]
    runner = CliRunner(env={"COLUMNS": "200"})
    assert "limit 79.6 GiB" in runner.invoke(app, args).output
    assert "limit 60.0 GiB" in runner.invoke(app, [*args, "--memory-limit-gib", "60"]).output
