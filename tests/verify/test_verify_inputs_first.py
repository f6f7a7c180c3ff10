"""``autopar verify``: every input is checked before a job is written or launched (a ``--record``
file that is no profile database was refused only after the runs it was to store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from conftest import SCRIPTS

runner = CliRunner()
VERIFY = ["verify", "--model", "llama2-7b", "--device", "h100-80gb", "--script", str(SCRIPTS / "pretrain_llama2_7b.sh"),
          "--top", "1"]


@pytest.mark.parametrize("content, needle", [
    (b"{}\n", "not an autopar profile database (not an SQLite file: it starts with b'{}\\n'"),
    (b"x", "not an autopar profile database (not an SQLite file: it starts with b'x'"),
])
def test_a_record_file_that_is_no_database_is_refused_before_any_job(tmp_path, content, needle):
    record = tmp_path / "res.json"
    record.write_bytes(content)
    out = tmp_path / "jobs"
    for launcher in ("none", "local"):
        res = runner.invoke(app, [*VERIFY, "--launcher", launcher, "--record", str(record), "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert res.stderr.strip() == f"error: --record={str(record)!r}: {needle}, not b'SQLite format 3\\x00')"
        assert not out.exists() and record.read_bytes() == content  # nothing written, the file as it was


def test_a_record_whose_folder_cannot_be_made_is_refused_before_any_job(tmp_path):
    (tmp_path / "f").write_text("a file")
    out = tmp_path / "jobs"
    res = runner.invoke(app, [*VERIFY, "--launcher", "none", "--record", str(tmp_path / "f" / "runs.db"),
                              "--out", str(out)])
    assert res.exit_code == 2 and "cannot create its folder" in res.stderr and not out.exists()


def test_a_new_or_empty_record_file_is_accepted_and_left_alone(tmp_path):
    """A missing file is created only when runs are stored (``--launcher none`` stores none); an
    empty (0-byte) file is an empty SQLite database."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for record in (empty, tmp_path / "new" / "runs.db"):
        res = runner.invoke(app, [*VERIFY, "--launcher", "none", "--record", str(record),
                                  "--out", str(tmp_path / f"jobs-{record.name}")])
        assert res.exit_code == 0, res.output
    assert empty.read_bytes() == b"" and not Path(tmp_path / "new").exists()
