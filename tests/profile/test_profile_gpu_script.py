"""benchmarks/gpu_profile.py in --tiny mode (CPU): it fills a database and writes the table."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_profile.py"


def test_gpu_profile_script_tiny_mode(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path)], capture_output=True,
                         text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-2000:]
    (db,) = tmp_path.glob("*.db")
    ops = dict(sqlite3.connect(db).execute("SELECT op, count(*) FROM op GROUP BY op").fetchall())
    assert ops["layer"] == 3 and ops["attention"] == 1 and ops["gemm"] >= 3
    rows = (tmp_path / "gpu_profile_results.md").read_text().splitlines()[4:]
    assert [r.split("|")[1:4] for r in rows] == [[" 1 ", " 64 ", " none "], [" 2 ", " 64 ", " full "]]
    assert all(float(r.split("|")[4]) > 0 and float(r.split("|")[5]) > 0 for r in rows)
