"""Profile database files: schema versions (2 read and migrated, 1 refused), read-only use by
search/estimate, and the one-line messages for paths that are no database file. No torch."""

from __future__ import annotations

import os
import sqlite3

import pytest
from typer.testing import CliRunner

from autopar.profile.opdb import SCHEMA_VERSION, OpDB, shape_key
from autopar.profile.provenance import SCHEMA2_RECORD
from autopar.profile.shapes import strategy_ops
from autopar.strategy import Strategy
from conftest import make_problem
from test_profile_provenance import LAYOUT, PLAN, measured_compute_s, one_line_error, run_json

runner = CliRunner()
# The tables as schema version 2 wrote them (autopar before the measured_on record).
SCHEMA_2 = """
CREATE TABLE op (
  device TEXT NOT NULL, op TEXT NOT NULL, shape TEXT NOT NULL, dtype TEXT NOT NULL, versions TEXT NOT NULL,
  fwd_s REAL NOT NULL, fwd_spread_s REAL NOT NULL, bwd_s REAL NOT NULL, bwd_spread_s REAL NOT NULL,
  bytes REAL NOT NULL, repeats INTEGER NOT NULL, saved_bytes REAL, peak_bytes REAL, created REAL NOT NULL,
  PRIMARY KEY (device, op, shape, dtype, versions));
CREATE TABLE comm (
  device TEXT NOT NULL, collective TEXT NOT NULL, link TEXT NOT NULL, group_size INTEGER NOT NULL,
  bytes REAL NOT NULL, time_s REAL NOT NULL, versions TEXT NOT NULL, created REAL NOT NULL,
  PRIMARY KEY (device, collective, link, group_size, bytes, versions));
CREATE TABLE comm_fit (
  device TEXT NOT NULL, collective TEXT NOT NULL, link TEXT NOT NULL, alpha_s REAL NOT NULL,
  bus_bandwidth_bytes_per_s REAL NOT NULL, points INTEGER NOT NULL, ranks_per_node INTEGER NOT NULL,
  versions TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (device, collective, link, versions));
PRAGMA user_version = 2;
"""
VERSIONS = "torch=2.5.1 cuda=12.4 cudnn=90100"


def schema2_db(path, device: str) -> str:
    """A version-2 file as 'autopar profile ops' wrote it on ``device``: every operator of LAYOUT at 1 ms."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_2)
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    for op, dims in strategy_ops(p, Strategy(dp=4, tp=2, sp=True)):
        conn.execute("INSERT INTO op VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     (device, op, shape_key(dims), "bf16", VERSIONS, 1e-3, 0.0, 2e-3, 0.0, 1.0, 3, None, None, 0.0))
    conn.commit()
    conn.close()
    return str(path)


def test_schema_2_is_read_as_it_is_with_records_from_its_rows(tmp_path):
    path = schema2_db(tmp_path / "old.db", "NVIDIA H100 80GB HBM3")
    before = os.stat(path).st_mtime_ns, open(path, "rb").read()
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", path])
    assert doc["time_breakdown_s"]["compute"] == pytest.approx(measured_compute_s(), rel=1e-9)
    (rec,) = doc["profile"]["measured_on"]
    assert doc["profile"]["accepted"] == "same device" and rec["preset"] == "h100-80gb"
    assert (rec["torch_version"], rec["cuda_version"], rec["autopar_version"]) == ("2.5.1", "12.4", None)
    assert rec["record"] == SCHEMA2_RECORD and rec["given_device"] is None
    assert (os.stat(path).st_mtime_ns, open(path, "rb").read()) == before  # search never writes the file


def test_schema_2_cpu_rows_are_refused_for_a_gpu_plan(tmp_path):
    path = schema2_db(tmp_path / "cpu.db", "cpu:x86_64:16t")
    err = one_line_error(["search", *PLAN, "--top", "1", "--profile-db", path])
    assert "measured on 'cpu:x86_64:16t' (no autopar preset), not on the planned 'h100-80gb'" in err


def test_a_profile_command_migrates_schema_2_in_place(tmp_path):
    path = schema2_db(tmp_path / "old.db", "NVIDIA H100 80GB HBM3")
    OpDB(path).close()  # what 'profile ops/layer/comm --db old.db' opens
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
    assert conn.execute("SELECT device, versions, preset, torch_version, record FROM measured_on").fetchall() == [
        ("NVIDIA H100 80GB HBM3", VERSIONS, "h100-80gb", "2.5.1", SCHEMA2_RECORD)]
    conn.close()
    assert run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", path])["profile"]["accepted"] == "same device"


def test_schema_1_and_newer_files_are_refused_with_how_to_profile_again(tmp_path):
    for version in (1, 5):
        path = tmp_path / f"v{version}.db"
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE op (x)")
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
        conn.close()
        err = one_line_error(["search", *PLAN, "--top", "1", "--profile-db", str(path)])
        assert f"schema version {version}, this autopar reads 4 (and migrates 2, 3); profile again into a new file " \
               "(autopar profile ops --db NEW.db ...)" in err


def test_paths_that_are_no_database_file(tmp_path):
    err = one_line_error(["search", *PLAN, "--top", "1", "--profile-db", str(tmp_path)])
    assert err.endswith(f"--profile-db={str(tmp_path)!r}: is a directory, not a profile database file")
    assert "no such file" in one_line_error(["search", *PLAN, "--profile-db", str(tmp_path / "none.db")])
    assert "not a regular file" in one_line_error(["search", *PLAN, "--profile-db", "/dev/null"])
    loop = tmp_path / "loop.db"
    loop.symlink_to(loop)
    assert "a symbolic link to nothing (or a loop)" in one_line_error(["search", *PLAN, "--profile-db", str(loop)])
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert "holds no measurements yet" in one_line_error(["search", *PLAN, "--profile-db", str(empty)])
    assert empty.read_bytes() == b""  # not turned into an empty database


def test_profile_commands_name_their_own_db_option(tmp_path):
    parent = tmp_path / "t.db"
    parent.write_bytes(b"")
    args = ["profile", "ops", *PLAN, "--top", "1", "--db"]
    err = one_line_error([*args, str(parent / "x.db")])
    assert err.endswith(f"--db={str(parent / 'x.db')!r}: cannot create its folder ({str(parent)!r} is not a folder)")
    err = one_line_error([*args, str(tmp_path)])
    assert err.endswith(f"--db={str(tmp_path)!r}: is a directory, not a profile database file")
