"""Collective sweeps: the alpha-beta fit, and a real 2-rank torchrun on gloo."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from autopar.profile.comm import fit, ring_terms


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
