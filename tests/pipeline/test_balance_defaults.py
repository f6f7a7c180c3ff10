"""``autopar balance`` defaults: the memory limit is the device's less search's --memory-margin."""

from __future__ import annotations


def test_balance_default_limit_is_the_device_less_the_margin():
    """``balance`` limits memory to 90% of the device (--memory-margin 0.1, search's default; search
    re-balances under the same 90%) unless --memory-limit-gib says otherwise (H100 80GB preset:
    79.6 GiB, `autopar devices`; 90% is 71.7 GiB); --memory-margin 0 is the whole device."""
    from typer.testing import CliRunner

    from autopar.cli import app

    args = ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--pp", "4", "--gbs", "32"]
    runner = CliRunner(env={"COLUMNS": "200"})
    assert "limit 71.7 GiB (90% of 79.6 GiB: --memory-margin 0.1, as search)" in runner.invoke(app, args).output
    assert "limit 79.6 GiB" in runner.invoke(app, [*args, "--memory-margin", "0"]).output
    assert "limit 60.0 GiB" in runner.invoke(app, [*args, "--memory-limit-gib", "60"]).output
