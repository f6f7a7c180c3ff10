"""Fuzz ``autopar validate --csv FILE``: two rows of the shipped measurements CSV with cells
emptied or garbled (negative, zero, huge, fractional, words, unicode, quotes, newlines), a column
dropped, or the header changed. The run must write the report (``accuracy.md``, ``rows.md``,
``errors.png``) or give one ``error:`` line naming the column changed (see :mod:`fuzz_support`).
A row ``validate`` cannot score is listed with its reason, not a reason to fail the report."""

from __future__ import annotations

import csv
import functools
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import MEASUREMENTS
from fuzz_support import HUGE_DIGITS, check_outcome, fuzz_settings, key_needles, module_workdir, run_cli

pytestmark = pytest.mark.fuzz

TABLE = list(csv.reader(io.StringIO(MEASUREMENTS.read_text())))
HEADER, ROWS = TABLE[0], TABLE[1:]
COUNTS = ["layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "num_experts", "topk", "seq_len", "num_gpus",
          "gpus_per_node", "tp", "pp", "vpp", "cp", "ep", "dp", "mbs", "gbs"]
CELLS = st.one_of(
    st.sampled_from(["", " ", "0", "-1", "1", "3", "7", "2.5", "1e3", "nan", "inf", "-inf", HUGE_DIGITS, "2147483649",
                     "abc", "ß∂", '"', "'", "a,b", "line\nbreak", "\u202e", "yes", "true", "none", "full", "ZeRO-4",
                     "H100-SXM5-80GB", "GPT-4B", "Llama-3-8B", "DeepSeek-V3", "step_time", "mfu", "ETP=0", "prec=fp4"]),
    st.integers(min_value=-10, max_value=100_000).map(str),
    st.text(max_size=6),
)


def _csv_text(table: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(table)  # "\r\n" rows: a cell holding \r or \n is quoted
    return out.getvalue()


@functools.cache
def scorable(i: int) -> bool:
    """Whether autopar scores shipped row ``i`` as it is (some rows are listed as unscorable)."""
    from autopar.validate.measurements import Row
    from autopar.validate.score import score_rows

    return score_rows([Row(dict(zip(HEADER, ROWS[i])))])[0].predicted is not None


METRIC = HEADER.index("measured_metric")
#: Observed out-of-memory rows (``oom_observed``): a CSV whose scored rows are all such crashed the
#: report (the former scatter plot of validate/report.py: ``min()`` of no timed rows), see
#: :func:`test_measurement_rows_all_memory_checks`; the other properties leave them out.
TIMED = [i for i, r in enumerate(ROWS) if r[METRIC] != "oom_observed"]
OOM_ROWS = [r for r in ROWS if r[METRIC] == "oom_observed"]
#: A shipped timed row that scores as it is: a mutation is then what makes it unscorable.
SCORABLE_ROW = st.sampled_from(TIMED).filter(scorable).map(lambda i: ROWS[i])
OTHER_ROWS = st.lists(st.sampled_from([ROWS[i] for i in TIMED]), max_size=1)


@st.composite
def mutated_csv(draw, columns: list[str]) -> tuple[str, list[str]]:
    """(CSV text, columns changed): one or two shipped rows (the first scorable as shipped), one to
    three cells of ``columns`` replaced."""
    rows = [list(draw(SCORABLE_ROW)), *(list(r) for r in draw(OTHER_ROWS))]
    changed = draw(st.lists(st.sampled_from(columns), min_size=1, max_size=3, unique=True))
    for name in changed:
        row = draw(st.sampled_from(rows))
        row[HEADER.index(name)] = draw(CELLS)
    return _csv_text([HEADER, *rows]), changed


@st.composite
def mutated_header(draw, duplicates: bool) -> tuple[str, list[str]]:
    """(CSV text, columns changed): a column duplicated (``duplicates``), else one dropped or
    renamed, or a row cut short or made long."""
    rows = [list(draw(SCORABLE_ROW)), *(list(r) for r in draw(OTHER_ROWS))]
    header = list(HEADER)
    i = draw(st.sampled_from(range(len(header))))
    name = header[i]
    kind = "duplicate" if duplicates else draw(st.sampled_from(["drop", "rename", "short row", "long row"]))
    if kind == "drop":
        header.pop(i)
        rows = [r[:i] + r[i + 1:] for r in rows]
    elif kind == "rename":
        header[i] = draw(CELLS)
    elif kind == "duplicate":  # a size column named again over a mostly empty one: DictReader keeps the last
        name = draw(st.sampled_from(["layers", "hidden", "heads", "ffn", "seq_len"]))
        header[header.index(draw(st.sampled_from(["vpp", "cp", "ep", "num_experts", "topk"])))] = name
    elif kind == "short row":
        rows[0] = rows[0][:i]
    else:
        rows[0] = rows[0] + ["x"]
    return _csv_text([header, *rows]), [name]


workdir = module_workdir("fuzz_csv")


def _run(workdir, text: str, changed: list[str], shape: bool = False) -> None:
    """Validate ``text``; an error must name a column ``changed`` (or, ``shape``: the line, the
    header or the cell count)."""
    path, out_dir = workdir / "m.csv", workdir / "report"
    path.write_text(text)
    out = run_cli(["validate", "--csv", path, "--out", out_dir])
    needles = [n for name in changed for n in key_needles(name)] + (["line ", "column", "header"] if shape else [])
    check_outcome(out, needles, files=[out_dir / "accuracy.md", out_dir / "rows.md"])


#: Columns validate reads a row's source family, FLOP definition, ZeRO stage and notes from.
SOURCE_COLUMNS = ["id", "source", "measured_metric", "sp", "zero_or_distopt", "notes"]
TEXT_COLUMNS = [c for c in HEADER if c not in COUNTS and c not in SOURCE_COLUMNS]


@fuzz_settings(12)
@given(case=mutated_csv(TEXT_COLUMNS))
def test_measurement_text_cells(workdir, case):
    """Garbled model and device names, measured values, units, recompute cells."""
    _run(workdir, *case)


@fuzz_settings(12)
@given(case=mutated_csv(SOURCE_COLUMNS))
def test_measurement_source_cells(workdir, case):
    """Garbled ids, sources, metrics, sp, ZeRO and notes cells (e.g. ``ZeRO-4``, ``ETP=0``, an id
    of no known source)."""
    _run(workdir, *case)


@fuzz_settings(12)
@given(case=mutated_csv(COUNTS))
def test_measurement_count_cells(workdir, case):
    """Emptied or garbled sizes and layout cells (layers, hidden, heads, tp, pp, dp, mbs, ...):
    the T1-T13 crashes of issue 13 (``KeyError``, ``TypeError``, ``ValidationError``)."""
    _run(workdir, *case)


@fuzz_settings(10)
@given(case=mutated_header(duplicates=False))
def test_measurement_header_and_row_shape(workdir, case):
    """A column dropped or renamed, a row short or long."""
    _run(workdir, *case, shape=True)


@fuzz_settings(5)
@given(case=mutated_header(duplicates=True))
def test_measurement_duplicate_header_column(workdir, case):
    """A header naming a column twice: csv.DictReader keeps the last one's cells, so 'hidden' in
    place of 'cp' gave ``TypeError`` (validate/measurements.py should refuse the header)."""
    _run(workdir, *case, shape=True)


@fuzz_settings(3)
@given(rows=st.lists(st.sampled_from(OOM_ROWS), min_size=1, max_size=2))
def test_measurement_rows_all_memory_checks(workdir, rows):
    """Only ``oom_observed`` rows (e.g. BLOOMPQ-0225-07-oom alone): ``ValueError: min() arg is an
    empty sequence`` in the former scatter plot of validate/report.py (no timed row to plot)."""
    _run(workdir, _csv_text([HEADER, *rows]), [])
