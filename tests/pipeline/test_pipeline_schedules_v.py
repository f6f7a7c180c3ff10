"""V-shape and bidirectional zero-bubble schedules (ZB-V, DualPipeV, DualPipe): placements, and
each schedule's bubble and peak in-flight count against the formulas of its source, by hand.

Units below: one chunk's forward F = 1, its full backward B = 2 with the weight-gradient part
W = 1 (input gradient 1), i.e. the papers' T_F = T_B = T_W per chunk."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.errors import AutoparError
from autopar.pipeline.placement import chunk_order_in_model, placement
from autopar.pipeline.schedules import in_flight_chunks, order_peak_in_flight, parameter_copies, rank_order
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.pipeline.steady import simulate_bounded


def _idle_per_rank_s(sim) -> np.ndarray:
    busy = np.zeros(len(sim.peak_in_flight))
    for op in sim.timeline:
        busy[op.stage] += op.end_s - op.start_s
    return sim.makespan_s - busy


def test_v_placement_is_torch_style_v():
    # torchtitan _get_stage_indices(style="v"): zip(range(pp), range(2pp-1, pp-1, -1))
    assert placement("zbv", 4, 2).stage.tolist() == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert placement("interleaved", 4, 2).stage.tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # DualPipe: rank r holds stage r of the forward pipeline (stages 0-3) and stage pp-1-r of
    # the reverse one (4 + s); the second half of the ranks lists the reverse one as chunk 0
    bidir = placement("dualpipe", 4, 2)
    assert bidir.stage.tolist() == [[0, 7], [1, 6], [5, 2], [4, 3]] and bidir.chains == 2
    assert chunk_order_in_model("dualpipe", 4, 2).tolist() == [[0, 3], [1, 2], [1, 2], [0, 3]]


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 16)])
def test_one_f_one_b_and_zb1p_rows_of_the_dualpipe_table(pp, m):
    """DualPipe README table: 1F1B bubble (PP-1)(F+B), ZB1P (PP-1)(F+B-2W), activations PP."""
    times = PipelineTimes.uniform(pp, 1, 1.0, 2.0)
    assert list(_idle_per_rank_s(simulate(times, m, "1f1b"))) == [(pp - 1) * 3.0] * pp
    zb = simulate(times, m, "zb-h1")
    assert list(_idle_per_rank_s(zb)) == [(pp - 1) * 1.0] * pp
    assert list(zb.peak_in_flight) == [pp] * pp


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 16)])
def test_zbv_has_no_gap_on_any_rank_and_holds_1f1b_memory(pp, m):
    """Qi et al. sec. 6 (and Sea AI Lab's table): with T_F = T_B = T_W, ZB-V has zero bubble and
    1F1B's activation memory. Each rank works without a gap from its first op to its last; the
    step still spans the fill skew of pp-1 chunk forwards (rank r starts r forwards late)."""
    sim = simulate(PipelineTimes.uniform(pp, 2, 1.0, 2.0), m, "zbv")
    for r in range(pp):
        ops = [op for op in sim.timeline if op.stage == r]
        span = max(op.end_s for op in ops) - min(op.start_s for op in ops)
        assert span == pytest.approx(sum(op.end_s - op.start_s for op in ops))
    assert sim.makespan_s == pytest.approx(m * 2 * 3.0 + (pp - 1) * 1.0)
    # 2 pp chunks of half a stage each = pp micro-batches of the rank's layers, 1F1B's rank-0 peak
    assert list(sim.peak_in_flight) == [2 * pp] * pp == list(in_flight_chunks("zbv", pp, 2, m))


@pytest.mark.parametrize("ranks,m", [(4, 8), (4, 16), (2, 4)])
def test_dualpipev_bubble_and_activations_match_the_readme(ranks, m):
    """DualPipeV on ``ranks`` devices runs PP = 2 * ranks stages: bubble (PP/2-1)(F&B+B-3W) with
    F&B = F + B (no overlap modelled) = (ranks-1)(3 + 2 - 3), activations PP + 1 chunks."""
    sim = simulate(PipelineTimes.uniform(ranks, 2, 1.0, 2.0), m, "dualpipev")
    assert list(_idle_per_rank_s(sim)) == pytest.approx([(ranks - 1) * 2.0] * ranks)
    assert list(sim.peak_in_flight) == [2 * ranks + 1] * ranks == list(in_flight_chunks("dualpipev", ranks, 2, m))


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 16), (8, 20)])
def test_dualpipe_bubble_activations_and_parameters_match_the_report(pp, m):
    """DeepSeek-V3 report sec. 3.2.1 / README: bubble (PP/2-1)(F&B+B-3W) = (pp/2-1) * 2, activations
    PP + 1 stages, parameters 2x."""
    sim = simulate(PipelineTimes.uniform(pp, 2, 1.0, 2.0), m, "dualpipe")
    assert list(_idle_per_rank_s(sim)) == pytest.approx([(pp // 2 - 1) * 2.0] * pp)
    assert list(sim.peak_in_flight) == [pp + 1] * pp
    assert parameter_copies("dualpipe") == 2 and parameter_copies("dualpipev") == 1


def test_every_op_runs_once_in_each_order():
    for schedule, pp, m in (("zbv", 4, 5), ("zbv", 3, 12), ("dualpipev", 3, 7), ("dualpipe", 4, 10)):
        for r in range(pp):
            order = rank_order(schedule, r, pp, 2, m)
            per_chunk = m // 2 if schedule == "dualpipe" else m
            for c in range(2):
                forwards = sorted(mb for k, mb, cc in order if cc == c and k in ("F", "O"))
                grads = sorted(mb for k, mb, cc in order if cc == c and k in ("B", "I"))
                weights = [mb for k, mb, cc in order if cc == c and k in ("B", "W")]
                assert forwards == grads == list(range(per_chunk)) == sorted(weights)
            assert order_peak_in_flight(order) > 0


def test_unequal_chunks_and_p2p_on_the_v_placement():
    """The V's turn (stages pp-1 and pp on the last rank) pays no p2p; a slower chunk lengthens
    the step; extrapolation agrees with the full simulation."""
    fwd = np.ones((4, 2))
    fwd[1, 1] = 2.0
    times = PipelineTimes(fwd, 2 * fwd, np.zeros((4, 2)), 0.1)
    base = simulate(PipelineTimes.uniform(4, 2, 1.0, 2.0, p2p_s=0.1), 64, "zbv")
    slow = simulate(times, 64, "zbv")
    assert slow.makespan_s > base.makespan_s
    last = [op for op in base.timeline if op.stage == 3 and op.kind == "forward" and op.microbatch == 0]
    assert last[1].start_s == pytest.approx(last[0].end_s)  # chunk 1 starts right after chunk 0
    for schedule in ("zbv", "dualpipev"):
        full, fast = simulate(times, 200, schedule), simulate_bounded(times, 200, schedule)
        assert fast.timeline_microbatches is not None
        assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
        assert np.array_equal(fast.peak_in_flight, full.peak_in_flight)


@pytest.mark.parametrize("schedule,pp,vpp,m,match", [
    ("zbv", 4, 3, 8, "exactly 2 model chunks"),
    ("dualpipev", 4, 2, 7, "at least 2 \\* pp = 8"),
    ("dualpipe", 3, 2, 12, "even pp"),
    ("dualpipe", 4, 2, 9, "even num_microbatches"),
])
def test_sizes_the_schedules_refuse(schedule, pp, vpp, m, match):
    with pytest.raises(AutoparError, match=match):
        simulate(PipelineTimes.uniform(pp, vpp, 1.0, 2.0), m, schedule)
