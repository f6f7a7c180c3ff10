"""Profile databases: no empty file left by a failed ``profile ops``; an empty one is refused with what to run."""

from __future__ import annotations


def test_profile_ops_without_torch_leaves_no_empty_database(tmp_path, monkeypatch):
    """The README's first profiling command on the plain install: one error line naming the extra,
    and no empty ``--db`` file behind (which the README's next command, ``search --profile-db``,
    then read as a database of no devices)."""
    import importlib.util

    from typer.testing import CliRunner

    from autopar.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    db = tmp_path / "ops.db"
    res = CliRunner().invoke(app, ["profile", "ops", "--db", str(db), "--model", "llama3-8b", "--device", "h100-80gb"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: profile: needs torch; install autopar's 'profile' extra (pip install torch transformers)"]
    assert not db.exists()


def test_search_on_an_empty_profile_db_says_to_fill_it(tmp_path):
    from typer.testing import CliRunner

    from autopar.cli import app
    from autopar.profile.opdb import OpDB

    db = tmp_path / "ops.db"
    OpDB(db)  # created, nothing measured
    res = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "8",
                                   "--profile-db", str(db)])
    assert res.exit_code == 2
    assert res.output.strip() == (f"error: --profile-db={str(db)!r}: holds no measurements yet "
                                  "(fill it with 'autopar profile ops'; runs stored by 'autopar verify --record' "
                                  "count once 'autopar calibrate' has fitted factors from successful ones)")


def test_a_short_file_that_is_not_sqlite_is_refused_by_every_reader(tmp_path):
    """SQLite takes a file shorter than its 100-byte header as an empty database: ``calibrate
    --db`` said "holds no measurements yet" for a 1-byte file and a writer replaced it by a new
    database. Both readers and writers now say it is no profile database and leave it as it was."""
    from typer.testing import CliRunner

    from autopar.cli import app
    from autopar.errors import AutoparError
    from autopar.profile.opdb import OpDB

    db = tmp_path / "one.db"
    db.write_bytes(b"x")
    why = "not an autopar profile database (not an SQLite file: it starts with b'x', not b'SQLite format 3\\x00')"
    for args, option in [(["calibrate", "--db", str(db)], "--db"),
                         (["search", "--model", "llama3-8b", "--device", "h100-80gb", "--profile-db", str(db)],
                          "--profile-db")]:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and res.stderr.strip() == f"error: {option}={str(db)!r}: {why}", res.output
    try:
        OpDB(db, "--record")
        raise AssertionError("a 1-byte file was opened for writing")
    except AutoparError as err:
        assert str(err) == f"--record={str(db)!r}: {why}"
    assert db.read_bytes() == b"x"
