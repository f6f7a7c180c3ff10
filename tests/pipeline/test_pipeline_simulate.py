"""Pipeline schedule simulator: closed forms (Narayanan et al. SC'21 sec. 2.2; Qi et al. ICLR'24
sec. 3.1), in-flight counts, and the fast static makespan against the event simulation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.pipeline.makespan import static_makespan_s
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes, simulate


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (2, 3), (4, 4)])
def test_uniform_makespan_is_m_plus_pp_minus_1_times_tf_plus_tb(schedule, pp, m):
    r = simulate(PipelineTimes.uniform(pp, 1, 1.0, 2.0), m, schedule)
    assert r.makespan_s == pytest.approx((m + pp - 1) * 3.0)
    assert r.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))


@pytest.mark.parametrize("pp,vpp,m", [(4, 2, 8), (4, 3, 8), (8, 4, 16)])
def test_interleaved_bubble_shrinks_by_vpp(pp, vpp, m):
    r = simulate(PipelineTimes.uniform(pp, vpp, 1.0 / vpp, 2.0 / vpp), m, "interleaved")
    assert r.makespan_s == pytest.approx((m + (pp - 1) / vpp) * 3.0)
    assert r.peak_in_flight[0] == 2 * (pp - 1) + (vpp - 1) * pp + 1  # e.g. 11 for pp=4, vpp=2


@pytest.mark.parametrize("pp,m", [(4, 8), (8, 16), (8, 64)])
def test_zb_h1_matches_the_paper_and_beats_1f1b(pp, m):
    times = PipelineTimes.uniform(pp, 1, 1.0, 2.0)  # T_F = T_B = T_W = 1
    zb = simulate(times, m, "zb-h1")
    assert zb.makespan_s == pytest.approx(3 * m + (pp - 1))  # (p-1)(T_F + T_B - T_W) bubble
    assert zb.makespan_s < simulate(times, m, "1f1b").makespan_s
    assert list(zb.peak_in_flight) == [pp] * pp  # never above 1F1B's rank-0 peak


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 2), (8, 8)])
def test_1f1b_stage_i_holds_min_pp_minus_i_and_m(pp, m):
    r = simulate(PipelineTimes.uniform(pp, 1, 1.0, 2.0), m, "1f1b", activation_bytes=np.full((pp, 1), 5.0))
    expected = [min(pp - i, m) for i in range(pp)]
    assert list(r.peak_in_flight) == expected
    assert list(r.peak_activation_bytes) == [5.0 * e for e in expected]
    assert list(in_flight_chunks("1f1b", pp, 1, m)) == expected


def test_recompute_runs_before_each_backward_and_lengthens_the_step():
    r = simulate(PipelineTimes.uniform(2, 1, 1.0, 2.0, recompute_s=1.0), 2, "1f1b")
    assert r.makespan_s == pytest.approx((2 + 2 - 1) * 4.0)
    kinds = [op.kind for op in sorted((o for o in r.timeline if o.stage == 1), key=lambda o: o.start_s)]
    assert kinds == ["forward", "recompute", "backward", "forward", "recompute", "backward"]


def test_bad_inputs_areuser_errors():
    with pytest.raises(AutoparError, match="num_microbatches=6"):
        simulate(PipelineTimes.uniform(4, 2, 1.0, 2.0), 6, "interleaved")
    with pytest.raises(AutoparError, match="schedule='pipedream'"):
        simulate(PipelineTimes.uniform(2, 1, 1.0, 2.0), 4, "pipedream")


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(1, 3), st.integers(1, 4), st.data())
def test_static_makespan_equals_the_event_simulation(pp, vpp, groups, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    times = PipelineTimes(rng.random((pp, vpp)) + 0.1, 2 * rng.random((pp, vpp)) + 0.1,
                          rng.random((pp, vpp)) * data.draw(st.booleans()), float(rng.random() * 0.1))
    schedule = "interleaved" if vpp > 1 else data.draw(st.sampled_from(["1f1b", "gpipe"]))
    m = groups * pp
    sim = simulate(times, m, schedule)
    assert static_makespan_s(times, m, schedule) == pytest.approx(sim.makespan_s, rel=1e-9)
    busy = (times.forward_s + times.backward_s + times.recompute_s).sum(axis=1) * m
    assert sim.makespan_s >= busy.max() - 1e-9  # no rank works faster than its own ops
