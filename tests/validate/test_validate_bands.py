"""Error bands (autopar.validate.bands) and the ties they mark in the search ranking
(autopar.report.ties): hand-made rows with hand-computed MAPEs, the fallback to wider groups,
the cached per-row errors against a fresh scoring of the shipped CSV, and the table."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autopar.cli import app
from autopar.report.ties import rank_marks, ties_note, within_band
from autopar.validate.bands import (ERRORS_PATH, MIN_ROWS, Certainty, band_from, certainty, device_class, row_errors,
                                    similarity_keys)


def _rows(errors, family="dense", precision="bf16/fp16", device="hopper", kind="step_time", prefix="R"):
    return [{"id": f"{prefix}{i}", "kind": kind, "family": family, "precision": precision, "device_class": device,
             "error_pct": e} for i, e in enumerate(errors)]


H100_DENSE = similarity_keys(False, "bf16", "h100-80gb")


def test_device_classes():
    assert [device_class(n) for n in ("a100-40gb", "h100-96gb-500w", "h200", "gb200", "b300", "mi355x",
                                      "ascend-910c", "my-gpu")] == [
        "ampere", "hopper", "hopper", "blackwell", "blackwell", "amd-instinct", "ascend", "other"]
    assert H100_DENSE == {"family": "dense", "precision": "bf16/fp16", "device_class": "hopper"}
    assert similarity_keys(True, "fp16", "b200")["precision"] == "bf16/fp16"


def test_band_is_the_mape_of_the_similar_rows():
    # |+2| |-4| |+6| |-8| |+10| -> 30 / 5 = 6.0; the A100 and fp8 rows are not similar.
    records = _rows([2, -4, 6, -8, 10]) + _rows([50], device="ampere", prefix="A") + _rows([90], precision="fp8",
                                                                                           prefix="F")
    band = band_from(records, "step_time", H100_DENSE)
    assert band.band_pct == 6.0 and band.rows == ("R0", "R1", "R2", "R3", "R4")
    assert band.group == "dense bf16/fp16 step-time/throughput rows on hopper devices"


def test_small_groups_fall_back_to_wider_ones():
    assert MIN_ROWS == 5
    # 4 Hopper rows are too few: every dense 16-bit row counts (4 + 2 A100 rows): (1+1+1+1+7+7)/6 = 3.0.
    records = _rows([1, -1, 1, -1]) + _rows([7, -7], device="ampere", prefix="A")
    band = band_from(records, "step_time", H100_DENSE)
    assert band.band_pct == 3.0 and len(band.rows) == 6 and band.group.endswith("rows on any device")
    # No dense row at all: every row of the kind, whatever its family.
    moe = _rows([4, 8], family="MoE", prefix="M")
    band = band_from(moe, "step_time", H100_DENSE)
    assert band.band_pct == 6.0 and band.group == "step-time/throughput rows on any device, none of them dense"
    assert band_from(moe, "memory", H100_DENSE).band_pct is None
    # A wide group that does hold rows of the problem's family says nothing more.
    mixed = band_from(moe + _rows([2], prefix="D"), "step_time", H100_DENSE)
    assert mixed.group == "step-time/throughput rows on any device"


def test_cached_row_errors_are_a_fresh_scoring_of_the_shipped_csv():
    from autopar.validate import DEFAULT_CSV
    from autopar.validate.measurements import read_rows
    from autopar.validate.score import score_rows

    fresh = row_errors(score_rows(read_rows(DEFAULT_CSV)))
    cached = json.loads(ERRORS_PATH.read_text())["rows"]
    assert cached == fresh, "stale: run python -m autopar.validate.bands"


def test_shipped_bands_for_an_h100_dense_bf16_plan():
    c = certainty(False, "bf16", "h100-80gb")
    rows = [r for r in json.loads(ERRORS_PATH.read_text())["rows"] if r["kind"] == "step_time"
            and r["family"] == "dense" and r["precision"] == "bf16/fp16" and r["device_class"] == "hopper"]
    assert len(c.step_time.rows) == len(rows) >= MIN_ROWS
    assert c.step_time.band_pct == round(sum(abs(r["error_pct"]) for r in rows) / len(rows), 1)


def test_rank_marks_by_hand():
    assert within_band(105.0, 100.0, 5.0) and not within_band(105.1, 100.0, 5.0)
    assert rank_marks([100.0, 103.0, 105.0, 105.1], 5.0) == ["1", "≈1", "≈1", "4"]
    assert rank_marks([100.0, 103.0], None) == ["1", "2"]  # no band: plain ranks
    assert rank_marks([], 5.0) == []


def test_ties_note_names_the_band_only_when_a_rank_is_tied():
    c = Certainty(band_from(_rows([2, -4, 6, -8, 10]), "step_time", H100_DENSE),
                  band_from(_rows([3, -3, 3, -3, 3], kind="memory"), "memory", H100_DENSE))
    assert ties_note(c, ["1", "2"]) is None
    note = ties_note(c, ["1", "≈1"])
    assert note.startswith("≈1: step time within ±6% of #1's") and "5 dense bf16/fp16 step-time" in note
    assert "memory: ±3% on 5 dense bf16/fp16 peak-memory rows on hopper devices" in note


def test_search_table_and_json_mark_the_same_ties():
    args = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096", "--top", "6"]
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    band = doc["certainty"]["step_time_band_pct"]
    first = doc["layouts"][0]["step_time_s"]
    marks = [e["rank_mark"] for e in doc["layouts"]]
    assert marks == [("≈1" if i > 1 and abs(e["step_time_s"] - first) / first * 100 <= band else str(i))
                     for i, e in enumerate(doc["layouts"], 1)]
    assert "≈1" in marks  # llama3-8b's top layouts are within a few per cent of each other
    table = runner.invoke(app, args, env={"COLUMNS": "200"}).output
    assert f"≈1: step time within ±{band:g}% of #1's" in " ".join(table.split())
    assert sum(line.startswith("│ ≈1 │") for line in table.splitlines()) == marks.count("≈1")
