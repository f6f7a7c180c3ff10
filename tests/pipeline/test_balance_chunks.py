"""The chunk balancer (autopar.pipeline.chunk_ilp): layers per chunk and recompute layer counts,
on instances whose optimum is derived by hand, SAPP-PPB's documented example shape, and
invariants over random tables (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.pipeline.balance import balance
from autopar.pipeline.balance_json import megatron_layout, sapp_arrays
from autopar.pipeline.chunk_costs import kind_counts
from autopar.pipeline.layout import PipelineLayout, chunk_in_flight
from autopar.pipeline.layers import LayerTable
from autopar.pipeline.schedules import in_flight_chunks


def _table(pp: int, options: tuple[str, ...], forward_s, backward_s, recompute_s, activation_bytes, limit: float,
           num_layers: int, static_bytes=0.0, stage_bytes=None) -> LayerTable:
    per_layer = lambda v: np.tile(np.asarray(v, dtype=float), (num_layers, 1))  # noqa: E731
    zeros = np.zeros((pp, len(options)))
    return LayerTable(options=options, forward_s=per_layer(forward_s), backward_s=per_layer(backward_s),
                      recompute_s=per_layer(recompute_s), activation_bytes=per_layer(activation_bytes),
                      static_bytes=np.broadcast_to(np.asarray(static_bytes, float), (num_layers,)).copy(),
                      stage_forward_s=zeros, stage_backward_s=zeros, stage_recompute_s=zeros,
                      stage_bytes=zeros if stage_bytes is None else stage_bytes, p2p_s=0.0, memory_limit_bytes=limit)


def test_four_stages_memory_forces_one_full_layer_on_the_first_two():
    """8 layers of forward 1 s + backward 2 s; full recompute adds 1 s and keeps 1 byte instead of
    10; limit 50 bytes; 1F1B holds 4, 3, 2, 1 micro-batches. By hand: a bottleneck of 6 s lets
    ranks 0 and 1 hold one layer (two need a full one: 7 s) and ranks 2, 3 two: 6 < 8 layers, so
    T = 7 s; then no rank can hold three (rank 2: 3 + 3 + 4 = 10 s), so the split is 2, 2, 2, 2
    with exactly one full layer on ranks 0 and 1 (memory 4 * 11 and 3 * 11 bytes). Objective
    (m - 1) * T + sum t = 99 * 7 + 26 = 719 s."""
    table = _table(4, ("none", "full"), [1, 1], [2, 2], [0, 1], [10, 1], 50.0, 8)
    plan = balance(table, 1, 100, "1f1b", time_limit_s=30)
    assert plan.optimal and plan.gap <= 1e-3
    assert plan.best.layers_per_stage == (2, 2, 2, 2)
    assert plan.best.recompute == ("1 none + 1 full", "1 none + 1 full", "none", "none")
    assert plan.best.objective_s == pytest.approx(719)
    assert list(plan.best.stage_memory_bytes) == [44, 33, 40, 20]
    assert sapp_arrays(plan) == {"pipeline_stage": 4, "pp_interleave_num": 1, "offset": [0, 0, 0, 0],
                                 "recompute": [1, 1, 0, 0], "select_recompute": [0, 0, 0, 0]}
    assert not plan.even_fits and plan.gain is None  # the even split without recompute: 4 * 20 = 80 > 50 bytes


def test_six_layers_on_two_ranks_of_two_chunks_take_unequal_chunks():
    """6 equal layers (3 s each) on pp 2 x vpp 2: 4 equal chunks would hold 1.5 layers, so each
    rank takes 3 as 2 + 1 (its slowest chunk 6 s; 3 + 0 would be 9 s): objective
    (8 - 1) * 9 + 6 + 6 = 75 s. The Megatron layout string writes it and passes Megatron's rules."""
    table = _table(2, ("none",), [1], [2], [0], [1], 1e9, 6)
    plan = balance(table, 2, 8, "interleaved", time_limit_s=30)
    assert plan.optimal
    assert plan.best.layers_per_stage == (3, 3)
    assert sorted(map(sorted, plan.best.layers_per_chunk.tolist())) == [[1, 2], [1, 2]]
    assert plan.best.objective_s == pytest.approx(75)
    offsets = sapp_arrays(plan)["offset"]
    assert len(offsets) == 2 and all(len(row) == 2 for row in offsets) and sum(map(sum, offsets)) == 6 - 4
    layout = PipelineLayout.parse(megatron_layout(plan), 2)
    layout.validate(6, 0)
    assert layout.decoder.tolist() == plan.best.layers_per_chunk.tolist()


def test_kinds_keep_their_layer_order():
    """Two dense layers (1 + 2 s) then six MoE layers (2 + 4 s) on pp 2: by hand the best split
    is 4 + 4 (2 dense + 2 MoE = 18 s against 4 MoE = 24 s; 5 + 3 gives 24 + 18), so T = 24 s,
    and the dense layers stay on rank 0 (layer order)."""
    num_layers = 8
    forward = np.array([[1.0]] * 2 + [[2.0]] * 6)
    zeros = np.zeros((2, 1))
    table = LayerTable(options=("none",), forward_s=forward, backward_s=2 * forward, recompute_s=0 * forward,
                       activation_bytes=np.ones((num_layers, 1)), static_bytes=np.zeros(num_layers),
                       stage_forward_s=zeros, stage_backward_s=zeros, stage_recompute_s=zeros, stage_bytes=zeros,
                       p2p_s=0.0, memory_limit_bytes=1e9)
    plan = balance(table, 1, 10, "1f1b", time_limit_s=30)
    assert plan.best.layers_per_stage in ((4, 4), (5, 3))  # both make the slowest stage 24 s
    assert plan.best.stage_time_s.max() == pytest.approx(24)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pp=st.integers(2, 4), vpp=st.integers(1, 3), extra=st.integers(0, 9), m_groups=st.integers(1, 4),
       act_none=st.floats(1, 20), limit=st.floats(20, 400), static=st.floats(0, 5), split_kinds=st.booleans())
def test_solution_places_every_layer_and_fits(pp, vpp, extra, m_groups, act_none, limit, static, split_kinds):
    """Every answer holds the model's layers, at least one per rank, in layer order, and fits the
    limit by the memory recomputed here (layers' states + in-flight micro-batches of each chunk's
    activations + the rank's fixed part); or the balancer says nothing fits."""
    num_layers = pp + extra
    schedule = "interleaved" if vpp > 1 else "1f1b"
    m = pp * m_groups
    options = ("none", "selective", "full")
    table = _table(pp, options, [1, 1, 1], [2, 2, 2], [0, 0.2, 1], [act_none, act_none / 2, 1], limit, num_layers,
                   static_bytes=static, stage_bytes=np.tile([0.0, 0.0, 3.0], (pp, 1)))
    if split_kinds:  # two kinds of layers: the first ones heavier
        table.forward_s[: num_layers // 2] *= 2
    try:
        plan = balance(table, vpp, m, schedule, time_limit_s=5)
    except AutoparError as err:
        assert "no split" in str(err)
        return
    best = plan.best
    assert int(best.layers_per_chunk.sum()) == num_layers and min(best.layers_per_stage) >= 1
    assert np.array_equal(best.recompute_counts.sum(axis=2), best.layers_per_chunk)
    if vpp > 1:
        in_flight = np.stack([chunk_in_flight(pp, vpp, r, m) for r in range(pp)])
    else:
        in_flight = in_flight_chunks(schedule, pp, 1, m)[:, None].astype(float)
    act = table.activation_bytes[0]
    for r in range(pp):
        counts = best.recompute_counts[r]  # (vpp, R)
        fixed = 3.0 if counts[:, 2].sum() else 0.0
        memory = static * counts.sum() + float((in_flight[r][:, None] * counts * act[None]).sum()) + fixed
        assert memory == pytest.approx(best.stage_memory_bytes[r])
        assert memory <= limit * (1 + 1e-9)
    # layer order: the kinds of each chunk follow from its count (virtual stage order)
    per_kind = kind_counts(np.array([0, num_layers // 2, num_layers]), best.layers_per_chunk)
    assert per_kind.sum() == num_layers


def test_sapp_ppb_example_shapes(tmp_path):
    """SAPP-PPB's documented run (Llama-2-70B, 16 stages, 32 micro-batches, 2 interleaved chunks;
    MindSpore hyper_parallel auto_parallel/sapp_ppb/README.md) prints ``offset`` and
    ``recompute`` as two lists of 16; autopar's answer has that shape: 80 layers, offsets over the
    base 80 // 32 = 2 summing to 16, recompute counts at most each chunk's layers."""
    import json

    from typer.testing import CliRunner

    from autopar.cli import app

    out = CliRunner().invoke(app, ["balance", "--model", "llama2-70b", "--tp", "8", "--pp", "16", "--vpp", "2",
                                   "--device", "ascend-910b", "--nodes", "16", "--devices-per-node", "8",
                                   "--gbs", "32", "--seq-len", "4096", "--memory-limit-gib", "24", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    sapp = doc["sapp"]
    assert (sapp["pipeline_stage"], sapp["pp_interleave_num"]) == (16, 2)
    for key in ("offset", "recompute", "select_recompute"):
        assert len(sapp[key]) == 2 and all(len(row) == 16 for row in sapp[key])
    assert sum(map(sum, sapp["offset"])) == 80 - 32 * 2
    layers = np.array(doc["balanced"]["layers_per_chunk"]).T  # [chunk][stage]
    assert np.array_equal(np.array(sapp["offset"]) + 2, layers)
    assert np.all(np.array(sapp["recompute"]) <= layers) and sum(map(sum, sapp["recompute"])) > 0


def test_scipy_fallback_finds_the_same_optimum(monkeypatch):
    """Without highspy the program goes to scipy.optimize.milp (HiGHS inside scipy): the same
    hand-derived answer as above."""
    import sys

    monkeypatch.setitem(sys.modules, "highspy", None)  # import highspy raises ImportError
    table = _table(4, ("none", "full"), [1, 1], [2, 2], [0, 1], [10, 1], 50.0, 8)
    plan = balance(table, 1, 100, "1f1b", time_limit_s=30)
    assert plan.solver == "scipy" and plan.optimal
    assert plan.best.layers_per_stage == (2, 2, 2, 2) and plan.best.objective_s == pytest.approx(719)
