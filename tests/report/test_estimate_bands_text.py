"""``autopar estimate``'s text carries the problem's error bands (a new user found them only in the
JSON): the step time and the peak with their ``±`` band, and a fitting layout whose peak plus its
memory band exceeds the device says it may not fit."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli.app import app

LLAMA8 = ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64"]


def _text(*extra: str) -> str:
    out = CliRunner().invoke(app, [*LLAMA8, *extra], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    return out.stdout


def test_step_and_peak_carry_their_bands():
    # dense bf16 on H100: 4.3 % step-time and 3.8 % memory MAPE (docs/accuracy.md)
    text = _text()
    assert "step 3.040 s ±4.3%," in text and "peak 77.13 GiB ±3.8% of 79.6 GiB: fits, marginal" in text
    assert "±: autopar's mean error (MAPE) on similar measured rows: step time on 37 dense bf16/fp16" in text


def test_a_peak_whose_band_crosses_the_device_may_not_fit():
    # 77.13 GiB x 1.038 = 80.06 GiB > 79.6 GiB; with mbs 1 and tp 2 the peak is far below
    assert "may not fit: the peak plus autopar's ±3.8% memory band is 80.06 GiB, above the device's 79.6 GiB" in _text()
    assert "may not fit" not in _text("--tp", "2", "--dp", "4")


def test_one_wording_weighs_a_gap_against_the_band():
    from autopar.report.ties import band_verdict

    assert band_verdict(104.0, 100.0, 4.3) == ("within autopar's ±4.3% band (its mean step-time error, MAPE, on similar "
                                               "measured rows): too close to rank")
    assert band_verdict(105.0, 100.0, 4.3, "dense rows").startswith("beyond autopar's ±4.3% band (its mean step-time "
                                                                    "error, MAPE, on dense rows)")
