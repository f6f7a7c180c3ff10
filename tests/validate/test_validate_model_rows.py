"""Measured runs of the problem's own model on its class of device, with autopar's signed step-time
error (autopar.validate.bands.model_rows_note): a band averaged over other models hid that autopar
was 2x optimistic on the one Qwen3-30B-A3B H100 fp8 row (a new user's finding)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.validate.bands import model_rows, model_rows_note, step_time_error_pct


def test_a_rate_error_becomes_the_step_time_error_it_implies():
    # throughput predicted 12.14 % low (MBR-2511-H100-2) = step time 1 / 0.8786 - 1 = +13.8 % long
    assert step_time_error_pct({"metric": "tokens_per_s_per_gpu", "error_pct": -12.14}) == pytest.approx(13.82, abs=0.01)
    assert step_time_error_pct({"metric": "step_time", "error_pct": -8.5}) == -8.5


def test_rows_are_the_models_own_on_its_device_class():
    rows = model_rows("llama3-70b", "h100-80gb")
    assert len(rows) == 12 and {r["device_class"] for r in rows} == {"hopper"}
    assert {r["model"].lower() for r in rows} == {"llama3-70b"}  # MLM-LLAMA-FP8-2 is written LLAMA3-70B
    assert model_rows("llama3-70b", "gb200") == ()
    assert model_rows_note("mixtral-8x7b", "h100-80gb") is None


def test_the_note_names_the_worst_rows_signed_as_step_time():
    note = model_rows_note("qwen3-30b-a3b", "h100-80gb")
    # MBR-2511-H100-5: 11,180 predicted against 5,275 measured tokens/s: step time 5275 / 11180 - 1 = -52.8 %
    assert note.startswith("measured runs of qwen3-30b-a3b on hopper devices: 2 rows, autopar's step time -52.8..")
    assert "worst: MBR-2511-H100-5 (fp8, 16 devices) -52.8%" in note


def test_search_json_table_and_estimate_carry_it():
    args = ["-m", "qwen3-30b-a3b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "512", "--precision", "fp8"]
    doc = json.loads(CliRunner().invoke(app, ["search", *args, "--top", "1", "--json"]).stdout)
    assert doc["certainty"]["model_rows_note"].startswith("measured runs of qwen3-30b-a3b on hopper devices")
    table = CliRunner().invoke(app, ["search", *args, "--top", "1"], env={"COLUMNS": "250"})
    assert "worst: MBR-2511-H100-5 (fp8, 16 devices) -52.8%" in table.stdout
    text = CliRunner().invoke(app, ["estimate", *args, "--pp", "2", "--vpp", "24", "--ep", "8", "--mbs", "2"],
                              env={"COLUMNS": "250"})
    assert "measured runs of qwen3-30b-a3b on hopper devices" in text.stdout
