"""``balance`` balances within the device memory less ``--memory-margin`` (0.1, search's default),
as search ranks the layouts within it first; only where no split fits there does it use the whole
memory, and then says the plan is marginal (new-user report: balance packed stages to 100%)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.specs import load_device

runner = CliRunner()
H100_BYTES = load_device("h100-80gb").memory_bytes  # 81,559 MiB: 79.6 GiB
assert H100_BYTES == 81_559 * 2**20
LLAMA70 = ["-m", "llama3-70b", "--device", "h100-80gb", "--nodes", "4", "--gbs", "512", "--tp", "4", "--pp", "4"]


def _balance(*args: str) -> tuple[dict, str]:
    doc = runner.invoke(app, ["balance", *LLAMA70, *args, "--json"])
    text = runner.invoke(app, ["balance", *LLAMA70, *args])
    assert doc.exit_code == 0 and text.exit_code == 0, doc.output + text.output
    return json.loads(doc.stdout), text.stdout


def test_default_margin_limits_every_stage_to_90_percent():
    doc, text = _balance("--mbs", "1")
    assert doc["memory_limit_bytes"] == pytest.approx(0.9 * H100_BYTES)  # 71.7 GiB
    assert doc["memory_margin"] == 0.1 and doc["marginal"] is False
    assert max(doc["balanced"]["stage_memory_bytes"]) <= 0.9 * H100_BYTES
    assert text.splitlines()[0].endswith("256 micro-batches, limit 71.7 GiB (90% of 79.6 GiB: --memory-margin 0.1, "
                                         "as search)")


def test_margin_zero_is_the_whole_memory():
    doc, _ = _balance("--mbs", "1", "--memory-margin", "0")
    assert doc["memory_limit_bytes"] == H100_BYTES and doc["marginal"] is False


def test_nothing_within_the_margin_balances_within_the_whole_memory_and_says_marginal():
    """mbs 2 without recompute: no split fits 71.7 GiB, one fits 79.6 GiB."""
    doc, text = _balance("--mbs", "2", "--options", "none")
    assert doc["marginal"] is True and doc["memory_limit_bytes"] == H100_BYTES
    assert 0.9 * H100_BYTES < max(doc["balanced"]["stage_memory_bytes"]) <= H100_BYTES
    assert text.splitlines()[0].endswith("limit 79.6 GiB (the device's: no split fits within 90% of it, "
                                         "--memory-margin 0.1, so the plan is marginal, as search would call it)")


def test_margin_with_an_explicit_limit_is_refused():
    res = runner.invoke(app, ["balance", *LLAMA70, "--mbs", "1", "--memory-margin", "0.2", "--memory-limit-gib", "60"])
    assert res.exit_code == 2
    assert res.stderr.strip() == ("error: --memory-margin=0.2 with --memory-limit-gib: that limit is used as given; "
                                  "drop one")


def test_a_limit_above_the_device_memory_is_refused():
    """--memory-limit-gib 200 on an 80 GB device printed a plan with 95 GiB stages, exit 0."""
    r = runner.invoke(app, ["balance", *LLAMA70, "--memory-limit-gib", "200"])
    assert r.exit_code == 2
    assert "error: --memory-limit-gib=200: above the h100-80gb's 79.6 GiB" in r.output


def test_no_fit_advice_does_not_ask_for_full_recompute_when_it_is_allowed():
    r = runner.invoke(app, ["balance", *LLAMA70, "--memory-limit-gib", "30"])
    assert r.exit_code == 2 and "fits with recompute in {none, selective, full}" in r.output
    assert r.output.rstrip().endswith("; more stages or more memory")
    r = runner.invoke(app, ["balance", *LLAMA70, "--memory-limit-gib", "30",
                            "--options", "none,selective"])
    assert r.exit_code == 2 and "allow full recompute (--options ...,full)" in r.output
