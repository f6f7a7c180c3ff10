"""The pipeline simulation in bounded time (autopar.pipeline.steady): the steady state extrapolated
to many micro-batches equals the full event simulation, the closed forms hold at m = 1,000, and
work above the bound is refused with one line before it allocates."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.errors import AutoparError
from autopar.pipeline import makespan, steady
from autopar.pipeline.makespan import static_makespan_s
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.pipeline.steady import simulate_bounded


@pytest.mark.parametrize("schedule, pp, vpp, backward_s, expected_s", [
    # 1F1B: (m + pp - 1) * (t_f + t_b) (Narayanan et al., SC'21, sec. 2.2.1)
    ("1f1b", 4, 1, 2.0, (1000 + 3) * 3.0),
    # interleaved, per-chunk times t/vpp: (m + (pp - 1) / vpp) * (t_f + t_b) (sec. 2.2.2)
    ("interleaved", 4, 2, 2.0, (1000 + 3 / 2) * 3.0),
])
def test_closed_forms_at_1000_microbatches_from_the_steady_state(schedule, pp, vpp, backward_s, expected_s):
    times = PipelineTimes.uniform(pp, vpp, 1.0 / vpp, backward_s / vpp)
    result = simulate_bounded(times, 1000, schedule)
    assert result.timeline_microbatches is not None and result.timeline_microbatches < 100  # extrapolated
    assert result.makespan_s == pytest.approx(expected_s, rel=1e-12)
    busy = 1000 * pp * 3.0  # every rank does m * (t_f + t_b) of work
    assert result.bubble_fraction == pytest.approx(1 - busy / (pp * expected_s), rel=1e-9)


def test_a_cycle_of_two_microbatches_with_p2p():
    """Two slow stages and a p2p delay: the steady state repeats every 2 micro-batches, not 1, so
    an odd and an even count take different remainders; both equal the full simulation."""
    forward = np.array([[1.0]] * 5 + [[2.0]] * 2 + [[1.0]])
    times = PipelineTimes(forward, 2 * forward, np.zeros((8, 1)), 0.1)
    for m in (300, 301):
        full, fast = simulate(times, m, "1f1b"), simulate_bounded(times, m, "1f1b")
        assert fast.timeline_microbatches is not None
        assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-12)
        assert np.array_equal(fast.peak_in_flight, full.peak_in_flight)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["1f1b", "interleaved", "zb-h1", "gpipe", "zbv", "dualpipev"]), st.integers(1, 5), st.integers(2, 3),
       st.integers(11, 30), st.integers(0, 4), st.data())
def test_extrapolation_equals_the_full_simulation(schedule, pp, vpp, groups, extra, data):
    """Random per-(rank, chunk) times, recompute, p2p and activation bytes; m beyond the
    simulated window (10 pp), so the steady state is extrapolated where one is found."""
    vpp = vpp if schedule == "interleaved" else 2 if schedule in ("zbv", "dualpipev") else 1
    m = pp * groups + (0 if schedule == "interleaved" else extra)
    draw = lambda low, high: np.array(data.draw(st.lists(st.floats(low, high), min_size=pp * vpp,  # noqa: E731
                                                         max_size=pp * vpp))).reshape(pp, vpp)
    times = PipelineTimes(draw(0.1, 1.0), draw(0.1, 2.0), draw(0.0, 0.5) * data.draw(st.booleans()),
                          data.draw(st.sampled_from([0.0, 0.05, 0.3])), data.draw(st.sampled_from([0.5, 0.3])))
    act = draw(1e6, 1e9)
    full, fast = simulate(times, m, schedule, act), simulate_bounded(times, m, schedule, act)
    assert fast.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
    assert fast.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-9, abs=1e-12)
    assert np.array_equal(fast.peak_in_flight, full.peak_in_flight)
    assert np.allclose(fast.peak_activation_bytes, full.peak_activation_bytes, rtol=1e-9)
    if schedule in ("1f1b", "interleaved", "gpipe"):  # the vectorised static simulation (autopar estimate) extrapolates alike
        assert static_makespan_s(times, m, schedule) == pytest.approx(full.makespan_s, rel=1e-9)


def test_gpipe_and_zb_h1_beyond_the_bound_are_refused_before_allocating():
    """GPipe has no bounded steady state (its backwards wait for all forwards) and ZB-H1's W
    placement is not extrapolated: above MAX_SIMULATED_OPS they are refused from the sizes alone
    (the full simulation of 10^8 ops would take ~20 GB)."""
    times = PipelineTimes.uniform(8, 1, 1.0, 2.0)
    tracemalloc.start()
    with pytest.raises(AutoparError, match=r"num_microbatches=10000000: the gpipe pipeline \(pp=8, vpp=1\) is "
                                           r"simulated op by op \(GPipe's backwards wait for every forward\) up to "
                                           r"pp \* vpp \* num_microbatches = 166,666"):
        simulate_bounded(times, 10_000_000, "gpipe")
    with pytest.raises(AutoparError, match=r"\(ZB-H1 places its W passes by comparing times\)"):
        simulate_bounded(times, 10_000_000, "zb-h1")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1e6


def test_no_steady_state_within_the_bound_is_refused(monkeypatch):
    """With a bound too small for the window, a step it cannot simulate is refused (one line)."""
    monkeypatch.setattr(steady, "MAX_SIMULATED_OPS", 3 * 4 * 30)
    times = PipelineTimes.uniform(4, 1, 1.0, 2.0)
    with pytest.raises(AutoparError, match=r"\(no periodic steady state found\) up to .* = 120; lower --gbs"):
        simulate_bounded(times, 1000, "1f1b")
    assert simulate_bounded(times, 30, "1f1b").makespan_s == (30 + 3) * 3.0  # within the bound: in full


def test_static_simulation_beyond_its_bound_is_refused_before_allocating(monkeypatch):
    """autopar estimate's vectorised simulation: 12.6 million ops took 1.9 GB; GPipe (no steady
    state) above MAX_STATIC_OPS is refused from the sizes, and so is a step whose steady state
    the bound leaves no room to find."""
    times = PipelineTimes.uniform(8, 1, 1.0, 2.0)
    tracemalloc.start()
    with pytest.raises(AutoparError, match=r"num_microbatches=10000000: the gpipe pipeline \(pp=8, vpp=1\) is simulated "
                                           r"op by op \(GPipe's backwards wait for every forward\) up to .* = 1,000,000"):
        static_makespan_s(times, 10_000_000, "gpipe")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1e6
    assert static_makespan_s(times, 10_000_000, "1f1b") == pytest.approx((10_000_000 + 7) * 3.0, rel=1e-12)
    monkeypatch.setattr(makespan, "MAX_STATIC_OPS", 2 * 8 * 50)
    with pytest.raises(AutoparError, match="= 400; lower --gbs"):
        static_makespan_s(times, 1000, "1f1b")
