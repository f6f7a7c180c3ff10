"""``autopar validate``: score autopar's estimates against published training measurements.

:mod:`~autopar.validate.rows` maps CSV rows to problems and layouts, :mod:`~autopar.validate.score`
predicts each row's metric, :mod:`~autopar.validate.report` writes the accuracy tables and plot.
"""

from __future__ import annotations

from pathlib import Path

from autopar.validate.report import write_report
from autopar.validate.rows import read_rows
from autopar.validate.score import Result, score_rows

DEFAULT_CSV = Path(__file__).resolve().parents[3] / ".." / "shared" / "validation" / "measurements.csv"


def run_validation(csv_path: str | Path, out_dir: str | Path) -> tuple[list[Result], dict[str, Path]]:
    """Score every row of ``csv_path`` and write the report into ``out_dir``.

    Raises:
        AutoparError: the CSV does not exist.
    """
    results = score_rows(read_rows(csv_path))
    return results, write_report(results, Path(out_dir))


__all__ = ["DEFAULT_CSV", "Result", "run_validation"]
