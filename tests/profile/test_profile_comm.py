"""Collective sweeps: the alpha-beta fit, a real 2-rank torchrun on gloo, and the fits in the planner."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import comm
from autopar.cost.comm import use_link_fits
from autopar.profile.comm import fit, ring_terms
from autopar.profile.linkfit import LinkFits
from autopar.profile.opdb import OpDB
from autopar.profile.provenance import MeasuredOn
from conftest import make_problem


def test_fit_recovers_alpha_and_bus_bandwidth():
    alpha, bw = 5e-6, 100e9
    samples = [(g, s, sum(x * y for x, y in zip(ring_terms("all_reduce", g, s), (alpha, 1 / bw))))
               for g in (2, 4, 8) for s in (1e4, 1e6, 1e8)]
    got_alpha, got_bw = fit(samples, "all_reduce")
    assert got_alpha == pytest.approx(alpha) and got_bw == pytest.approx(bw)
    with pytest.raises(ValueError, match="at least 2"):
        fit(samples[:1], "all_reduce")


@pytest.mark.torchrun
def test_torchrun_two_ranks_on_gloo_fits(tmp_path):
    pytest.importorskip("torch")
    db = tmp_path / "comm.db"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                          "autopar.profile", "comm", "--db", str(db), "--sizes", "65536,4194304,16777216",
                          "--repeats", "2"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = sqlite3.connect(db).execute("SELECT collective, link, alpha_s, bus_bandwidth_bytes_per_s, points "
                                       "FROM comm_fit").fetchall()
    assert {r[0] for r in rows} >= {"all_reduce", "all_gather", "send_recv"}
    assert all(r[1] == "intra" and r[2] >= 0 and r[3] > 0 and r[4] == 3 for r in rows)


def _fits_db(tmp_path):
    db = OpDB(tmp_path / "comm.db")
    db.put_measured_on(MeasuredOn("gpu", "torch=1", "NVIDIA H100 80GB HBM3", "h100-80gb", None, "1", "12.8", None,
                                  "0.1.0"))
    db.put_comm_fit("gpu", "all_reduce", "intra", 10e-6, 100e9, 9, 8, "torch=1")
    db.put_comm_fit("gpu", "all_reduce", "inter", 20e-6, 80e9, 9, 8, "torch=1")  # 8 NICs: 10 GB/s each
    db.put_comm_fit("gpu", "send_recv", "inter", 30e-6, 12e9, 9, 8, "torch=1")  # one NIC pair
    return db


def test_comm_fits_replace_link_parameters(tmp_path):
    p = make_problem("llama3-8b", nodes=2)
    fits = LinkFits(_fits_db(tmp_path).comm_fits("gpu"))
    size = 1e9
    spec_ag = comm.all_gather_s(p, size, 8, 1)
    with use_link_fits(fits):
        assert comm.all_reduce_s(p, size, 8, 1) == pytest.approx(2 * 7 / 8 * size / 100e9 + 14 * 10e-6)
        # 16 ranks over 2 nodes, 8 per node: min(intra fit, 8 x 80e9 / 8)
        assert comm.all_reduce_s(p, size, 16, 1) == pytest.approx(2 * 15 / 16 * size / 80e9 + 30 * 20e-6)
        # stride 8 (one member per node): one NIC, 10 GB/s
        assert comm.all_reduce_s(p, size, 2, 8) == pytest.approx(2 * 1 / 2 * size / 10e9 + 2 * 20e-6)
        assert comm.send_recv_s(p, size, 2, 8) == pytest.approx(size / 12e9 + 30e-6)
        assert comm.all_gather_s(p, size, 8, 1) == spec_ag  # no all-gather fit: the device spec
    assert comm.all_reduce_s(p, size, 8, 1) != pytest.approx(2 * 7 / 8 * size / 100e9 + 14 * 10e-6)


def test_estimate_with_comm_fits_only(tmp_path):
    db = _fits_db(tmp_path)
    db.close()
    args = ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096",
            "--tp", "8", "--no-sp", "--profile-db", str(tmp_path / "comm.db"), "--json"]  # all-reduce TP
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["profile"]["collectives"] == {"intra": ["all_reduce"], "inter": ["all_reduce", "send_recv"]}
    assert doc["profile"]["sources"][0] == {"dense layer": "operators (0 of 9 measured)", "output": "analytic"}
    # TP: 2 forward all-reduces per layer x 32 layers + embedding + output of the 4096 x 4096 bf16
    # activation, plus per layer the 2 backward ones less the QKV / FC1 weight-gradient GEMMs they
    # run under (autopar.cost.tp_overlap; both GEMMs are shorter), per micro-batch (64: dp = 1, mbs = 1)
    from autopar.cost import compute as C
    from autopar.cost import flops as F
    from autopar.layout_batch import LayoutBatch
    from autopar.strategy import Strategy
    act = 2 * 4096 * 4096
    ar = 2 * 7 / 8 * act / 100e9 + 14 * 10e-6
    p, batch = make_problem("llama3-8b", gbs=64, seq=4096), LayoutBatch.from_strategy(Strategy(dp=1, tp=8), 64)
    qkv = C.gemm_time_s(p, F.attention_gemms(p, batch)[0])[0]
    fc1 = C.gemm_time_s(p, F.mlp_gemms(p, batch, moe=False)[0])[0]
    assert qkv < fc1 < ar
    per_mb = 66 * ar + 32 * ((ar - qkv) + (ar - fc1))
    assert doc["time_breakdown_s"]["tp_comm"] == pytest.approx(64 * per_mb, rel=1e-9)
