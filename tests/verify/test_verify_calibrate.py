"""autopar calibrate: runs stored by verify, the NNLS fit of the efficiency factors, and search using them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.estimate import estimate
from autopar.problem import Problem
from autopar.profile.opdb import OpDB
from autopar.specs import load_device
from autopar.strategy import Strategy
from autopar.verify.calibrate import fit, record_runs, stored_rows
from autopar.verify.jobs import Job
from autopar.verify.logs import RunResult
from json_schema_support import assert_valid
from conftest import make_problem

LAYOUTS = [Strategy(dp=8, tp=1, mbs=1, zero=1), Strategy(dp=4, tp=2, sp=True, mbs=1, zero=1),
           Strategy(dp=2, tp=4, sp=True, mbs=1, zero=1), Strategy(dp=1, tp=8, sp=True, mbs=2, zero=1),
           Strategy(dp=2, tp=2, pp=2, sp=True, mbs=1, zero=1)]


def _slower(p: Problem, compute: float, intra: float) -> Problem:
    """``p`` on a device whose GEMM/attention efficiencies are x ``compute`` and NVLink x ``intra``."""
    d = p.cluster.device
    dev = d.model_copy(update={"gemm_efficiency": d.gemm_efficiency * compute,
                               "attention_efficiency": d.attention_efficiency * compute,
                               "intra_node_comm_efficiency": d.intra_node_comm_efficiency * intra})
    return Problem(p.model, p.cluster.model_copy(update={"device": dev}), p.train)


def _store(path, layouts, failed=()):
    """Runs 'measured' on a device 20% slower in compute and 30% slower on NVLink than the preset."""
    p = make_problem("llama3-8b", gbs=32, seq=4096)
    truth = _slower(p, 0.8, 0.7)
    jobs, results = [], []
    for i, s in enumerate(layouts):
        jobs.append(Job(name=f"{i:02d}", rank=i + 1, folder="", framework="megatron", argv=[], env={}, workdir="",
                        num_nodes=1, devices_per_node=8, seq_len=4096, global_batch_size=32, iters=10,
                        layout=estimate(p, s).to_dict(32)["strategy"], predicted={}))
        results.append(RunResult(steps=10, step_time_s=estimate(truth, s).step_time_s))
    for name in failed:
        jobs.append(Job(name=name, rank=9, folder="", framework="megatron", argv=[], env={}, workdir="", num_nodes=1,
                        devices_per_node=8, seq_len=4096, global_batch_size=32, iters=10,
                        layout=estimate(p, LAYOUTS[0]).to_dict(32)["strategy"], predicted={}))
        results.append(RunResult(failure="out_of_memory", cause="CUDA out of memory"))
    assert record_runs(str(path), p, jobs, results) == len(jobs)
    return p


def test_fit_recovers_the_slower_device_and_lowers_the_error(tmp_path):
    p = _store(tmp_path / "db.sqlite", LAYOUTS, failed=["oom"])
    db = OpDB(tmp_path / "db.sqlite", write=False)
    assert len(db.runs()) == 6 and db.runs()[-1]["failure"] == "out_of_memory"
    rows = stored_rows(db, p.cluster.device.name, "megatron")
    assert len(rows) == 5  # the failed run is kept but not fitted
    f = fit(p.cluster.device.name, "megatron", rows)
    assert f.applied["compute"] and f.runs["compute"] == 5
    assert f.multipliers["compute"] == pytest.approx(0.8, rel=0.05)  # element-wise kernels are not scaled
    assert f.error_after < f.error_before / 3 and f.error_before > 0.1
    assert not f.applied["inter_comm"] and f.multipliers["inter_comm"] == 1.0  # one node: no inter-node time


def test_too_few_runs_move_no_factor(tmp_path):
    p = _store(tmp_path / "db.sqlite", LAYOUTS[:2])
    f = fit(p.cluster.device.name, "megatron", stored_rows(OpDB(tmp_path / "db.sqlite", write=False),
                                                            p.cluster.device.name, "megatron"))
    assert not any(f.applied.values()) and f.multipliers["compute"] == 1.0 and f.error_after == f.error_before


def test_calibrate_then_search_says_which_factors_came_from_runs(tmp_path):
    db = tmp_path / "db.sqlite"
    _store(db, LAYOUTS)
    res = CliRunner().invoke(app, ["calibrate", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    calibration = json.loads(res.output)
    assert_valid("calibrate", calibration)
    [doc] = calibration["fits"]
    assert doc["applied"]["compute"] and doc["error_after"] < doc["error_before"]
    args = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "32", "--seq-len", "4096", "--top", "1",
            "--profile-db", str(db)]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    cal = json.loads(res.output)["calibration"]
    assert cal["factors"]["compute"]["runs"] == 5 and cal["factors"]["compute"]["applied"]
    preset = load_device("h100-80gb").gemm_efficiency
    assert cal["efficiencies"]["gemm_efficiency"] == pytest.approx(preset * doc["multipliers"]["compute"])
    res = CliRunner().invoke(app, args)
    assert "calibrated from runs: compute x0.8" in res.output
    res = CliRunner().invoke(app, ["calibrate", "--db", str(db), "--framework", "torchtitan"])
    assert res.exit_code == 2 and "holds no verify runs" in res.output
