"""``autopar calibrate``'s errors about its database say how such a database is made (runs stored
by ``autopar verify --record FILE``) and name ``--db``; they do not send the user to ``profile ops``,
whose operator measurements calibrate does not read."""

from __future__ import annotations

import pytest
from test_bad_input import one_line_error

HOW = "store runs in it with 'autopar verify ... --record FILE'"


def test_calibrate_without_db_names_the_option_and_how_to_fill_it():
    assert one_line_error(["calibrate"]) == (
        "error: --db: required: the profile database (SQLite file) of the runs to fit; 'autopar verify ... "
        "--record FILE' stores runs in FILE, then give --db FILE")


@pytest.mark.parametrize("create, problem", [(False, "no such file"), (True, "holds no measurements yet")])
def test_calibrate_db_missing_or_empty_says_verify_record_fills_it(tmp_path, create, problem):
    db = tmp_path / "runs.db"
    if create:
        db.touch()
    assert one_line_error(["calibrate", "--db", str(db)]) == f"error: --db={str(db)!r}: {problem} ({HOW})"
