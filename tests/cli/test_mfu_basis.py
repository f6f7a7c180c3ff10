"""MFU is of the device's dense peak at the training precision (the fp8 peak for fp8 training),
and the outputs say so: the table's caption and the estimate's headline where it is not bf16,
and ``mfu_peak_flops_per_s`` in the JSON."""

from __future__ import annotations

import json

import pytest
from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.flops import model_flops_per_token
from autopar.cost.step import mfu_peak_flops_per_s
from autopar.estimate import estimate
from autopar.strategy import Strategy

runner = CliRunner()
H100_FP8, H100_BF16 = 1978.9e12, 989.4e12  # devices.json: h100-80gb dense peaks (NVIDIA H100 SXM datasheet)
OPTS = ["-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--tp", "2"]


@pytest.mark.parametrize("precision, peak", [("bf16", H100_BF16), ("fp8", H100_FP8)])
def test_mfu_divides_by_the_precisions_dense_peak(precision, peak):
    p = make_problem("llama3-8b", gbs=64, precision=precision)
    assert mfu_peak_flops_per_s(p) == peak
    e = estimate(p, Strategy(dp=4, tp=2, sp=True, mbs=1))
    flops = model_flops_per_token(p) * 64 * 4096
    assert e.mfu == pytest.approx(flops / (e.step_time_s * 8 * peak), rel=1e-12)


def test_fp8_search_caption_and_json_name_the_fp8_peak():
    res = runner.invoke(app, ["search", *OPTS, "--precision", "fp8", "--top", "1"])
    assert res.exit_code == 0, res.output
    assert "MFU: of the h100-80gb's dense fp8 peak, 1,979 TFLOP/s per device (bf16: 989)" in res.stdout
    doc = json.loads(runner.invoke(app, ["search", *OPTS, "--precision", "fp8", "--top", "1", "--json"]).stdout)
    assert doc["mfu_peak_flops_per_s"] == H100_FP8


def test_bf16_search_has_no_mfu_note_and_json_names_the_bf16_peak():
    res = runner.invoke(app, ["search", *OPTS, "--top", "1"])
    assert res.exit_code == 0 and "MFU: of the" not in res.stdout
    doc = json.loads(runner.invoke(app, ["search", *OPTS, "--top", "1", "--json"]).stdout)
    assert doc["mfu_peak_flops_per_s"] == H100_BF16


def test_fp8_estimate_headline_and_json_name_the_fp8_peak():
    res = runner.invoke(app, ["estimate", *OPTS, "--precision", "fp8"])
    assert res.exit_code == 0, res.output
    assert "% (of the fp8 peak), peak " in res.stdout.splitlines()[2]
    doc = json.loads(runner.invoke(app, ["estimate", *OPTS, "--precision", "fp8", "--json"]).stdout)
    assert doc["mfu_peak_flops_per_s"] == H100_FP8


def test_fp8_batch_sweep_names_the_fp8_peak():
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs-range", "64:128",
                              "--precision", "fp8"])
    assert res.exit_code == 0, res.output
    assert "MFU: of the h100-80gb's dense fp8 peak, 1,979 TFLOP/s per device (bf16: 989)" in res.stdout.splitlines()
