"""Operator knowledge base, interpolation, the provider hook and the profile CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.cost.compute import embedding_forward_time_s, layer_forward_times, output_forward_time_s, use_op_times
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.profile.coverage import coverage
from autopar.profile.opdb import SCHEMA_VERSION, OpDB
from autopar.profile.provider import ProfileTimes
from autopar.profile.shapes import layer_dims, strategy_ops
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
    cov = coverage(p, s, ProfileTimes(db, "gpu", "bf16"))
    # 4 GEMMs, attention, rmsnorm, residual add, RoPE, SwiGLU, output GEMM, cross entropy
    assert cov.share == 0.0 and len(cov.missing) == len(strategy_ops(p, s)) == 11
    for op, dims in strategy_ops(p, s):
        db.put("gpu", op, dims, "bf16", "torch=1", (1e-3, 0.0), (2e-3, 0.0), 1.0, 3)
    cov = coverage(p, s, ProfileTimes(db, "gpu", "bf16"))
    assert cov.missing == [] and cov.share == 1.0  # element-wise ops measured too: nothing analytic
    assert cov.sources == {"dense layer": "operators (9 of 9 measured)", "output": "operators"}
    with use_op_times(ProfileTimes(db, "gpu", "bf16")):
        measured = estimate(p, s)
    # per layer (1 + 2) ms x (4 GEMMs + attention + 2 rmsnorm + 2 adds + RoPE + SwiGLU) = 33 ms;
    # 16 micro-batches x (32 layers + output GEMM and loss (2 ms fwd, 4 ms bwd) + analytic embedding)
    embedding = 3 * float(embedding_forward_time_s(p, LayoutBatch.from_strategy(s, 64))[0])
    assert measured.time_breakdown_s["compute"] == pytest.approx(16 * (32 * 33e-3 + 6e-3 + embedding), rel=1e-9)
    assert measured.step_time_s != base.step_time_s
    assert estimate(p, s).step_time_s == base.step_time_s  # the hook is gone after the block


def test_coverage_of_partly_measured_layout_by_hand(tmp_path):
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    s = Strategy(dp=4, tp=2, pp=1, mbs=1)
    batch = LayoutBatch.from_strategy(s, 64)
    db = OpDB(tmp_path / "p.db")
    gemms = [op for op in strategy_ops(p, s) if op[0] == "gemm"]
    for op, dims in gemms[:4]:  # the layer's 4 GEMMs, not the output layer's
        db.put("gpu", op, dims, "bf16", "torch=1", (1e-3, 0.0), (2e-3, 0.0), 1.0, 3)
    cov = coverage(p, s, ProfileTimes(db, "gpu", "bf16"))
    layer = layer_forward_times(p, batch, moe=False)  # analytic: no provider installed
    unmeasured = 3 * (layer.attention_s + layer.elementwise_s)[0]  # forward + 2x backward
    total = 32 * (4 * 3e-3 + unmeasured) + 3 * output_forward_time_s(p, batch)[0]
    assert cov.share == pytest.approx(32 * 12e-3 / total, rel=1e-9)
    assert [op for op, _ in cov.missing] == ["attention", "rmsnorm", "add", "rope", "swiglu", "gemm", "cross_entropy"]
    assert cov.sources["dense layer"] == "operators (4 of 9 measured)" and cov.sources["output"] == "analytic"


def _fill_ops(db: OpDB, p, s: Strategy) -> None:
    for op, dims in strategy_ops(p, s):
        db.put("gpu", op, dims, "bf16", "torch=1", (1e-3, 0.0), (2e-3, 0.0), 1.0, 3)


def _put_layer(db: OpDB, p, s: Strategy, recompute: str, fwd_s: float, bwd_s: float, fused: bool = False) -> None:
    dims = layer_dims(p.model, s.tp, s.cp, s.ep, s.expert_tp, s.mbs, p.train.seq_len, False, recompute, fused)
    db.put("gpu", "layer", dims, "bf16", "torch=1", (fwd_s, 0.0), (bwd_s, 0.0), 0.0, 3)


@pytest.mark.parametrize(("layout", "rows", "per_layer_s", "source"), [
    # none row: fwd 20 + bwd 40 ms
    (dict(tp=2), [("none", 20e-3, 40e-3)], 60e-3, "none"),
    # the HF layer runs 2 rmsnorm + 2 adds on all tokens, SP on half: minus 1 x (4 ops x (1 + 2) ms)
    (dict(tp=2, sp=True), [("none", 20e-3, 40e-3)], 60e-3 - 12e-3, "none"),
    # ring CP=2 runs 2 attention blocks, the profile one: + 1 x (1 + 2) ms
    (dict(tp=2, cp=2), [("none", 20e-3, 40e-3)], 60e-3 + 3e-3, "none"),
    # full recompute: the full row (its backward holds the recomputed forward, the stage adds it back)
    (dict(tp=2, recompute="full"), [("none", 20e-3, 40e-3), ("full", 21e-3, 61e-3)], 82e-3, "full"),
    # full recompute without a full row: the none row, plus the recomputed forward
    (dict(tp=2, recompute="full"), [("none", 20e-3, 40e-3)], 80e-3, "none"),
    # selective: the none row plus the recomputed attention (1 ms measured)
    (dict(tp=2, recompute="selective"), [("none", 20e-3, 40e-3)], 61e-3, "none"),
])
def test_layer_profile_replaces_the_sum_of_operators(tmp_path, layout, rows, per_layer_s, source):
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    s = Strategy(dp=8 // (layout["tp"] * layout.get("cp", 1)), pp=1, mbs=1, **layout)
    db = OpDB(tmp_path / "p.db")
    _fill_ops(db, p, s)
    _put_layer(db, p, s, "none", 1.0, 1.0, fused=True)  # --fused rows are never used for time
    for recompute, fwd, bwd in rows:
        _put_layer(db, p, s, recompute, fwd, bwd)
    times = ProfileTimes(db, "gpu", "bf16")
    with use_op_times(times):
        got = estimate(p, s)
    m = 64 // (s.dp * s.mbs)
    embedding = 3 * float(embedding_forward_time_s(p, LayoutBatch.from_strategy(s, 64))[0])
    assert got.time_breakdown_s["compute"] == pytest.approx(m * (32 * per_layer_s + 6e-3 + embedding), rel=1e-9)
    cov = coverage(p, s, times)
    assert cov.sources["dense layer"] == f"layer profile (recompute={source})" and cov.share == 1.0


def test_layer_profile_only_on_exact_shape(tmp_path):
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    s = Strategy(dp=4, tp=2, pp=1, mbs=1)
    db = OpDB(tmp_path / "p.db")
    _fill_ops(db, p, s)
    _put_layer(db, p, Strategy(dp=4, tp=2, pp=1, mbs=2), "none", 20e-3, 40e-3)  # another mbs
    other = make_problem("llama3-70b", gbs=64, seq=4096)
    _put_layer(db, other, s, "none", 20e-3, 40e-3)  # another model's layer at this shard
    cov = coverage(p, s, ProfileTimes(db, "gpu", "bf16"))
    assert cov.sources["dense layer"] == "operators (9 of 9 measured)"


def test_plain_cli_never_imports_torch():
    code = "import sys, autopar.cli; import autopar.cli.profile; assert 'torch' not in sys.modules"
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
    assert "9 to go" in out.output  # 3 distinct GEMMs (down = qkv, logits = gate-up) + 6 others
    again = runner.invoke(app, ["profile", "ops", "--db", str(db), *common, "--tp", "2", "--repeats", "1"])
    assert "9 already measured, 0 to go" in again.output  # resumable: nothing measured twice
    assert "not on a h100-80gb" in out.output  # measured on this CPU for an H100 plan
    est = ["estimate", *common, "--tp", "1", "--mbs", "2", "--profile-db", str(db), "--json"]
    refused = runner.invoke(app, est)
    assert refused.exit_code == 2 and "(no autopar preset), not on the planned 'h100-80gb'" in refused.output
    res = runner.invoke(app, [*est, "--profile-stands-for", "h100-80gb"])
    assert res.exit_code == 0, res.output
    prof = json.loads(res.output)["profile"]
    assert prof["coverage"][0] < 0.5 and len(prof["missing"]) == 10  # 4 GEMMs, 5 others, cross entropy
    import torch

    (record,) = prof["measured_on"]
    assert prof["accepted"] == "--profile-stands-for h100-80gb" and record["given_device"] == "h100-80gb"
    assert record["torch_version"] == torch.__version__ and record["device"] == prof["device"]
    assert record["preset"] is None and record["autopar_version"] == autopar.__version__
    result = tmp_path / "r.json"
    result.write_text(res.output)
    fill = runner.invoke(app, ["profile", "ops", "--db", str(db), "--missing-from", str(result), "--repeats", "1"])
    assert "10 shapes, 0 already measured, 10 to go" in fill.output, fill.output
    res = runner.invoke(app, [*est, "--profile-stands-for", "h100-80gb"])
    prof = json.loads(res.output)["profile"]
    assert prof["missing"] == [] and prof["coverage"] == [1.0]  # dense, flash: every operator measured
    assert prof["collectives"] == {"intra": [], "inter": []}  # no 'profile comm' fits: device spec
    bad = runner.invoke(app, ["estimate", *common, "--profile-db", str(tmp_path / "none.db")])
    assert bad.exit_code == 2 and "no such file" in bad.output
