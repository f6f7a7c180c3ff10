"""The measurements CSV (``autopar/data/validation/measurements.csv``) read and checked cell by cell.

:func:`read_rows` returns raw :class:`Row` objects; :mod:`autopar.validate.rows` maps them onto
autopar problems and layouts.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError, regular_file
from autopar.specs.model import MAX_SIZE


@dataclass(frozen=True)
class Row:
    """One CSV row, raw strings keyed by column name."""

    cells: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.cells.get(key, "").strip()

    def int(self, key: str) -> int | None:
        value = self[key]
        return int(float(value)) if value else None

    @property
    def id(self) -> str:
        return self["id"]


def read_rows(path: str | Path) -> list[Row]:
    """Rows of the measurements CSV.

    Raises:
        AutoparError: the file does not exist or is not a readable CSV, a required column is
            missing, there are no rows, a row is short or long, a number cell is malformed, or
            two rows have one id.
    """
    file = Path(path)
    if not os.path.isfile(file):  # False for a name the file system cannot hold (Path.is_file raised)
        try:
            regular_file(file, "--csv")  # a directory, a FIFO, a name too long ...: named by what it is
        except AutoparError as err:
            if not str(err).endswith("does not exist"):
                raise
        raise AutoparError(f"--csv={str(path)!r}: file not found; pass the measurements CSV "
                           "(omit --csv to score the measurements shipped with autopar)")
    try:
        with file.open(newline="") as handle:
            reader = csv.DictReader(handle)
            rows = [(reader.line_num, r) for r in reader]
            header = reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise AutoparError(f"--csv={str(path)!r}: not a readable CSV ({err})") from None
    if not header:
        raise AutoparError(f"--csv={str(path)!r}: empty file (no header row)")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise AutoparError(f"--csv={str(path)!r}: missing column(s) {', '.join(missing)}; the header needs "
                           f"{', '.join(REQUIRED_COLUMNS)}")
    if not rows:
        raise AutoparError(f"--csv={str(path)!r}: no measurement rows below the header")
    for line, cells in rows:
        if None in cells or None in cells.values():
            raise AutoparError(f"--csv={str(path)!r} line {line}: {'more' if None in cells else 'fewer'} cells "
                               f"than the {len(header)} columns of the header")
        _check_numbers(Row(cells), f"--csv={str(path)!r} line {line} ({row_label(cells['id']) if cells['id'] else 'no id'})")
    first_line: dict[str, int] = {}
    for line, cells in rows:  # a repeated id was scored twice and counted twice in every error
        if cells["id"] and first_line.setdefault(cells["id"], line) != line:
            raise AutoparError(f"--csv={str(path)!r} line {line}: id {row_label(cells['id'])} is already the id of "
                               f"line {first_line[cells['id']]}; each row needs its own id")
    return [Row(cells) for _, cells in rows]


# Columns every row needs (the rest may be missing from the header: empty, the family default).
REQUIRED_COLUMNS = ("id", "model", "layers", "hidden", "heads", "ffn", "seq_len", "gpu", "num_gpus", "gbs",
                    "measured_metric", "measured_value")
_COUNT_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "num_gpus", "gpus_per_node",
                  "tp", "pp", "vpp", "cp", "ep", "dp", "mbs", "gbs")


def row_label(row_id: str) -> str:
    """The row id as error lines show it: bare when it is plain printable text, else Python's
    ``repr`` (an id with a newline or tab must not split or blur the one error line)."""
    return row_id if row_id and row_id.isprintable() and row_id == row_id.strip() else repr(row_id)


def _check_numbers(row: Row, where: str) -> None:
    """Counts are whole numbers >= 1 (``num_experts``/``topk`` may be 0), the measured value a
    finite number > 0 (``oom_observed``: 0 or 1; ``mfu``: a percentage, at most 100); empty
    cells are left to the family defaults.

    Raises:
        AutoparError: names the line, the column, the value and what is allowed.
    """
    for col in (*_COUNT_COLUMNS, "num_experts", "topk"):
        text = row[col]
        try:
            value = float(text) if text else None
        except ValueError:
            value = math.nan
        low = 0 if col in ("num_experts", "topk") else 1
        # above 2^31 the layout and model sizes overflow the int64 rule arithmetic (ModelSpec/Strategy bound)
        if value is not None and not (math.isfinite(value) and value == int(value) and low <= value <= MAX_SIZE):
            raise AutoparError(f"{where}: {col}={text!r}: expected a whole number in {low}..{MAX_SIZE} (or empty)")
    text = row["measured_value"]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    metric = row["measured_metric"]
    if metric == "oom_observed":
        ok, expected = value in (0.0, 1.0), "0 or 1 (oom_observed)"
    elif metric == "mfu":
        ok, expected = 0 < value <= 100, "a percentage in (0, 100] (mfu)"
    else:
        ok, expected = math.isfinite(value) and value > 0, "a finite number > 0"
    if not ok:
        raise AutoparError(f"{where}: measured_value={text!r}: expected {expected}")
