"""``autopar validate``: score autopar's estimates against published training measurements.

:mod:`~autopar.validate.measurements` reads and checks the CSV, :mod:`~autopar.validate.rows` maps
its rows to problems and layouts, :mod:`~autopar.validate.score`
predicts each row's metric, :mod:`~autopar.validate.report` writes the accuracy tables and plot.
"""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING

from autopar.errors import AutoparError

if TYPE_CHECKING:  # imported by run_validation: a search reads only autopar.validate.bands
    from autopar.validate.score import Result

#: The published measurements shipped with the package (sources and column meanings in the
#: README beside it); ``autopar validate`` scores them when ``--csv`` is not given.
DEFAULT_CSV = Path(__file__).resolve().parents[1] / "data" / "validation" / "measurements.csv"


def run_validation(csv_path: str | Path, out_dir: str | Path) -> tuple[list[Result], dict[str, Path]]:
    """Score every row of ``csv_path`` and write the report into ``out_dir``. Rows that cannot be
    scored are listed in ``rows.md`` with their reason.

    Raises:
        AutoparError: the CSV does not exist or is malformed (see :func:`read_rows`), or no row
            of it can be scored (the message gives the first row's reason).
    """
    from autopar.validate.measurements import read_rows, row_label
    from autopar.validate.report import write_report
    from autopar.validate.score import score_rows

    results = score_rows(read_rows(csv_path))
    if all(r.predicted is None for r in results):
        raise AutoparError(f"--csv={str(csv_path)!r}: none of the {len(results)} rows can be scored "
                           f"(first: {row_label(results[0].row.id)}: {results[0].reason})")
    return results, write_report(results, Path(out_dir))


__all__ = ["DEFAULT_CSV", "run_validation"]
