"""``estimate --detail`` (issue 19 item 5, Tinker's ``--detail``): each pipeline stage's forward,
backward, recompute and communication time and its memory, consistent with the step."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_problem
from json_schema_support import assert_valid
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import compute as C
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy

runner = CliRunner()


def test_one_stage_busy_time_is_the_step_without_dp_and_optimizer():
    """pp 1: the makespan is M times the stage's per-micro-batch time (1F1B with one stage), so
    step = busy + exposed DP + optimizer, and busy = M x (fwd + bwd + recompute + TP + CP + EP)."""
    p = make_problem("llama3-8b", gbs=64)
    e = estimate(p, Strategy(dp=4, tp=2, sp=True, zero=1, recompute="full"))
    (t,) = e.time_per_stage
    m = e.num_microbatches
    per_mb = t.forward_s + t.backward_s + t.recompute_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s
    assert t.p2p_s == 0.0 and t.layers == 32
    assert t.busy_s == pytest.approx(m * per_mb, rel=1e-12)
    assert t.recompute_s > 0  # full recompute re-runs the forward of every layer
    b = e.time_breakdown_s
    assert e.step_time_s == pytest.approx(t.busy_s + t.dp_comm_s + b["optimizer"], rel=1e-12)
    assert b["compute"] == pytest.approx(m * (t.forward_s + t.backward_s + t.recompute_s), rel=1e-12)


def test_pipeline_stages_and_their_bound():
    """pp 4 (8 layers each): backward is 2x forward on middle stages (no embedding/head) but for
    the element-wise kernels' own bytes (autopar.cost.elementwise_backward); the step is the
    closed-form 1F1B makespan over the stages' per-micro-batch times t_i,
    sum_i t_i + (M - 1) x max_i t_i (Narayanan et al. SC'21 sec. 2.2), plus p2p, DP and optimizer."""
    p = make_problem("llama3-8b", gbs=64)
    s = Strategy(dp=2, pp=4, zero=1)
    e = estimate(p, s)
    assert [t.layers for t in e.time_per_stage] == [8, 8, 8, 8]
    middle = e.time_per_stage[1]
    layer = C.layer_forward_times(p, LayoutBatch.from_strategy(s, 64), moe=False)
    extra = 8 * float(np.asarray(layer.backward_extra_s)[0])
    assert extra < 0  # norms, residuals, RoPE and SwiGLU move less than twice their forward bytes
    assert middle.backward_s == pytest.approx(2 * middle.forward_s + extra, rel=1e-12)
    per_mb = [t.busy_s / e.num_microbatches - t.p2p_s for t in e.time_per_stage]
    b = e.time_breakdown_s
    makespan = sum(per_mb) + (e.num_microbatches - 1) * max(per_mb)
    assert e.step_time_s == pytest.approx(makespan + b["pp_comm"] + b["dp_comm"] + b["optimizer"], rel=1e-9)


def test_cli_detail_table_and_json():
    args = ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--pp", "2", "--tp", "2"]
    plain = runner.invoke(app, args)
    detail = runner.invoke(app, [*args, "--detail"])
    assert plain.exit_code == detail.exit_code == 0
    title = "Time and memory per stage (32 micro-batches"
    assert title not in plain.output and title in detail.output
    assert "slowest stage 1" in detail.output
    doc = json.loads(runner.invoke(app, [*args, "--detail", "--json"]).stdout)
    assert [s["stage"] for s in doc["time_per_stage"]] == [0, 1]
    assert_valid("estimate", doc)  # time_per_stage is in the estimate schema
    assert "time_per_stage" not in json.loads(runner.invoke(app, [*args, "--json"]).stdout)


def test_interleaved_busy_time_leaves_out_the_overlapped_sends_and_stays_within_the_step():
    """Llama-3-70B, tp 8 pp 4 vpp 5, 512 micro-batches: --detail said "116.567 s busy of 116.524 s
    per step", busy counting 512 x 0.41 ms of p2p that the interleaved schedule overlaps with
    compute (autopar.cost.step: only the pp*vpp - 1 fill/drain hand-offs are exposed, in pp_comm).
    Busy is now M x (fwd + bwd + recompute + TP + CP + EP), and the bottleneck stage's busy time
    is the step's compute and collectives at that stage (time_breakdown_s), below the step."""
    p = make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192)
    e = estimate(p, Strategy(dp=2, tp=8, sp=True, pp=4, vpp=5, schedule="interleaved", mbs=1, zero=1))
    m = e.num_microbatches
    assert m == 512
    for t in e.time_per_stage:
        assert t.p2p_s > 0
        per_mb = t.forward_s + t.backward_s + t.recompute_s + t.tp_comm_s + t.cp_comm_s + t.ep_comm_s
        assert t.busy_s == pytest.approx(m * per_mb, rel=1e-12)
    slowest = max(e.time_per_stage, key=lambda t: t.busy_s)
    b = e.time_breakdown_s
    assert slowest.busy_s == pytest.approx(b["compute"] + b["tp_comm"] + b["cp_comm"] + b["ep_comm"], rel=1e-9)
    assert slowest.busy_s < e.step_time_s
