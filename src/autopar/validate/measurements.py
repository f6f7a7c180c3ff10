"""The measurements CSV (``autopar/data/validation/measurements.csv``) read and checked cell by cell.

:func:`read_rows` returns raw :class:`Row` objects; :mod:`autopar.validate.rows` maps them onto
autopar problems and layouts.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError
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
            missing, there are no rows, a row is short or long, or a number cell is malformed.
    """
    file = Path(path)
    if not file.is_file():
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
        _check_numbers(Row(cells), f"--csv={str(path)!r} line {line} ({cells['id'] or 'no id'})")
    return [Row(cells) for _, cells in rows]


# Columns every row needs (the rest may be missing from the header: empty, the family default).
REQUIRED_COLUMNS = ("id", "model", "layers", "hidden", "heads", "ffn", "seq_len", "gpu", "num_gpus", "gbs",
                    "measured_metric", "measured_value")
_COUNT_COLUMNS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "num_gpus", "gpus_per_node",
                  "tp", "pp", "vpp", "cp", "ep", "dp", "mbs", "gbs")


def _check_numbers(row: Row, where: str) -> None:
    """Counts are whole numbers >= 1 (``num_experts``/``topk`` may be 0), the measured value a
    finite number > 0 (``oom_observed``: 0 or 1); empty cells are left to the family defaults.

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
    allowed = (0.0, 1.0) if row["measured_metric"] == "oom_observed" else None
    if allowed and value not in allowed or not allowed and not (math.isfinite(value) and value > 0):
        raise AutoparError(f"{where}: measured_value={text!r}: expected "
                           f"{'0 or 1' if allowed else 'a finite number > 0'}")
