"""``autopar validate``: the report's arithmetic (not the accuracy level)."""

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.validate import run_validation
from autopar.validate.report import groups, mape, rank, spearman
from autopar.validate.score import error_pct

SOURCE = Path(__file__).resolve().parents[2] / "shared" / "validation" / "measurements.csv"
IDS = ("KOR22-T5-1a", "KOR22-T5-1b", "BLOOMPQ-0225-15-oom", "MLM2020-V100-1", "OPT-175B")


def test_error_and_mape_by_hand():
    assert error_pct(110.0, 100.0) == pytest.approx(10.0)
    assert error_pct(0.9, 1.2) == pytest.approx(-25.0)
    assert mape([10.0, -20.0]) == pytest.approx(15.0)


def test_spearman_by_hand():
    # ranks of y: 1 2 4 3, d = 0 0 -1 1, rho = 1 - 6*2/(4*(16-1)) = 0.8
    assert spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert list(rank([5.0, 1.0, 5.0])) == [2.5, 1.0, 2.5]  # ties share their mean rank


@pytest.fixture
def few_rows(tmp_path):
    with SOURCE.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = [r for r in reader if r["id"] in IDS]
        fields = reader.fieldnames
    path = tmp_path / "few.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_validate_few_rows(few_rows, tmp_path):
    results, paths = run_validation(few_rows, tmp_path / "out")
    by_id = {r.row.id: r for r in results}
    assert set(by_id) == set(IDS)  # nothing silently dropped
    assert by_id["MLM2020-V100-1"].predicted is None and "V100" in by_id["MLM2020-V100-1"].reason
    assert by_id["OPT-175B"].predicted is None and "tflops_per_gpu" in by_id["OPT-175B"].reason
    a, b = by_id["KOR22-T5-1a"], by_id["KOR22-T5-1b"]
    assert a.error_pct == pytest.approx(100 * (a.predicted - 1.42) / 1.42)
    assert b.case.strategy.recompute == "selective" and b.case.strategy.sp
    assert by_id["BLOOMPQ-0225-15-oom"].error_pct is None  # boolean row: no error %
    (step,) = [g for g in groups(results, lambda r: "all") if g.metric == "step_time"]
    assert step.count == 2
    assert step.mape == pytest.approx((abs(a.error_pct) + abs(b.error_pct)) / 2)
    assert step.max_abs == pytest.approx(max(abs(a.error_pct), abs(b.error_pct)))
    text = paths["rows"].read_text()
    assert "| MLM2020-V100-1 |" in text and paths["scatter"].stat().st_size > 0


def test_cli_missing_csv_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["validate", "--csv", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2
