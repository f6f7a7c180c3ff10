"""Operator knowledge base, interpolation, the provider hook and the profile CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.compute import use_op_times
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.profile.opdb import SCHEMA_VERSION, OpDB
from autopar.profile.provider import ProfileTimes, coverage
from autopar.profile.shapes import strategy_ops
from autopar.strategy import Strategy
from conftest import make_problem

TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False}


def test_opdb_exact_and_loglog_interpolation(tmp_path):
    db = OpDB(tmp_path / "p.db")
    for m, t in [(1024, 1e-3), (4096, 16e-3)]:
        db.put("gpu", "gemm", {"m": m, "n": 512, "k": 512}, "bf16", "torch=1", (t, 0.0), (2 * t, 0.0), 1.0, 3)
    assert db.lookup("gpu", "gemm", {"m": 1024, "n": 512, "k": 512}, "bf16").fwd_s == 1e-3
    mid = db.lookup("gpu", "gemm", {"m": 2048, "n": 512, "k": 512}, "bf16")
    assert not mid.exact and mid.fwd_s == pytest.approx(4e-3) and mid.bwd_s == pytest.approx(8e-3)
    assert db.lookup("gpu", "gemm", {"m": 8192, "n": 512, "k": 512}, "bf16") is None  # not bracketed
    assert db.lookup("gpu", "gemm", {"m": 2048, "n": 4096, "k": 512}, "bf16") is None  # n too far
    db.conn.execute("PRAGMA user_version = 99")
    db.conn.commit()
    with pytest.raises(AutoparError, match=f"reads {SCHEMA_VERSION}"):
        OpDB(tmp_path / "p.db")


def test_provider_overrides_measured_shapes_and_reports_coverage(tmp_path):
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    s = Strategy(dp=4, tp=2, pp=1, mbs=1)
    base = estimate(p, s)
    db = OpDB(tmp_path / "p.db")
    times = ProfileTimes(db, "gpu", "bf16")
    share, missing = coverage(p, s, times)
    assert share == 0.0 and len(missing) == len(strategy_ops(p, s)) - 2  # norm/act are not looked up
    for op, dims in strategy_ops(p, s):
        db.put("gpu", op, dims, "bf16", "torch=1", (1e-3, 0.0), (2e-3, 0.0), 1.0, 3)
    share, missing = coverage(p, s, ProfileTimes(db, "gpu", "bf16"))
    assert missing == [] and 0.9 < share < 1.0  # only element-wise work stays analytic
    with use_op_times(ProfileTimes(db, "gpu", "bf16")):
        measured = estimate(p, s)
    # 16 micro-batches x (32 layers x (4 GEMMs + attention) x (1 + 2) ms + output GEMM and loss x 3 ms);
    # element-wise work (analytic) adds under 5% on an H100
    assert measured.time_breakdown_s["compute"] == pytest.approx(16 * (32 * 5 * 3e-3 + 2 * 3e-3), rel=0.05)
    assert measured.step_time_s != base.step_time_s
    assert estimate(p, s).step_time_s == base.step_time_s  # the hook is gone after the block


def test_plain_cli_never_imports_torch():
    code = "import sys, autopar.cli; from autopar.profile import cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_profile_ops_then_estimate_with_db(tmp_path):
    pytest.importorskip("torch")
    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    db = tmp_path / "ops.db"
    common = ["--model", str(model), "--device", "h100-80gb", "--devices-per-node", "2", "--gbs", "4",
              "--seq-len", "64"]
    runner = CliRunner()
    out = runner.invoke(app, ["profile", "ops", "--db", str(db), *common, "--tp", "2", "--repeats", "1"])
    assert out.exit_code == 0, out.output
    assert "7 to go" in out.output
    again = runner.invoke(app, ["profile", "ops", "--db", str(db), *common, "--tp", "2", "--repeats", "1"])
    assert "7 already measured, 0 to go" in again.output  # resumable: nothing measured twice
    res = runner.invoke(app, ["estimate", *common, "--tp", "1", "--mbs", "2", "--profile-db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    prof = json.loads(res.output)["profile"]
    assert prof["coverage"][0] < 0.5 and len(prof["missing"]) == 6
    result = tmp_path / "r.json"
    result.write_text(res.output)
    fill = runner.invoke(app, ["profile", "ops", "--db", str(db), "--missing-from", str(result), "--repeats", "1"])
    assert "6 shapes, 0 already measured, 6 to go" in fill.output, fill.output
    res = runner.invoke(app, ["estimate", *common, "--tp", "1", "--mbs", "2", "--profile-db", str(db), "--json"])
    assert json.loads(res.output)["profile"]["missing"] == []
    bad = runner.invoke(app, ["estimate", *common, "--profile-db", str(tmp_path / "none.db")])
    assert bad.exit_code == 2 and "no such file" in bad.output
