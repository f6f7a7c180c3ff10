"""Which part of a simulated step the timeline draws (fill, one period, drain) and the p2p
transfers read off the timeline; numbers derived by hand for uniform 1F1B."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.pipeline.steady import simulate_bounded
from autopar.pipeline.window import WHOLE_FORWARDS_PER_RANK, timeline_window
from autopar.report.timeline import inferred_p2p_s, p2p_transfers


def _forwards_in(sim, start_s, end_s):
    return sum(1 for op in sim.timeline if op.stage == 0 and op.kind == "forward" and op.chunk == 0
               and start_s <= op.start_s < end_s)


def test_short_step_is_drawn_whole():
    sim = simulate(PipelineTimes.uniform(4, 1, 1.0, 2.0), WHOLE_FORWARDS_PER_RANK, "1f1b")
    window = timeline_window(sim)
    assert not window.elided and [s.name for s in window.segments] == ["whole step"]
    assert window.segments[0].end_s == pytest.approx(sim.makespan_s)


def test_uniform_1f1b_fill_period_drain_by_hand():
    """pp 4, m 64, t_f 1, t_b 2, no p2p. Rank 0 runs F0..F3 in [0, 4]; micro-batch 0's gradient
    comes back through ranks 3, 2, 1 (2 s each, from t = 4), so rank 0's B0 ends at 12: the fill.
    Then rank 0 alternates F(k) at 3k, B(k - 3): period 1 micro-batch, 3 s. Its last forward F63
    starts at 189; the step ends at (m + pp - 1) * 3 = 201. The period drawn is the middle of the
    steady state's forwards k = 4..62: k = 33, [99, 102]; the gaps hold k = 4..32 and 34..62."""
    sim = simulate(PipelineTimes.uniform(4, 1, 1.0, 2.0), 64, "1f1b")
    assert sim.makespan_s == pytest.approx(201.0)
    window = timeline_window(sim)
    assert [(s.name, s.start_s, s.end_s) for s in window.segments] == [
        ("fill", 0.0, 12.0), ("steady state", 99.0, 102.0), ("drain", 189.0, 201.0)]
    assert (window.period_microbatches, window.period_s) == (1, pytest.approx(3.0))
    assert [(g.microbatches, g.seconds) for g in window.gaps] == [(29, pytest.approx(87.0)), (29, pytest.approx(87.0))]


def test_extrapolated_step_counts_what_it_did_not_simulate():
    """pp 4, m 512 is extrapolated from a shorter simulated step: the drain is shifted to the
    step's end and the second gap holds the micro-batches never simulated; drawn + left out =
    the whole step, in micro-batches and in seconds ((512 + 3) * 3 = 1545 s)."""
    sim = simulate_bounded(PipelineTimes.uniform(4, 1, 1.0, 2.0), 512, "1f1b")
    assert sim.timeline_microbatches is not None and sim.makespan_s == pytest.approx(1545.0)
    window = timeline_window(sim)
    fill, period, drain = window.segments
    assert drain.end_s + drain.shift_s == pytest.approx(1545.0)
    drawn = sum(_forwards_in(sim, s.start_s, s.end_s if s is not drain else s.end_s + 1) for s in window.segments)
    assert drawn + sum(g.microbatches for g in window.gaps) == 512
    spans = sum(s.end_s - s.start_s for s in window.segments)
    assert spans + sum(g.seconds for g in window.gaps) == pytest.approx(1545.0)


@settings(max_examples=25, deadline=None)
@given(pp=st.integers(2, 6), vpp=st.sampled_from([1, 2]), groups=st.integers(1, 40),
       forward_s=st.floats(0.5, 2.0), backward_s=st.floats(0.5, 4.0), p2p_s=st.sampled_from([0.0, 0.1]))
def test_window_accounts_for_every_microbatch(pp, vpp, groups, forward_s, backward_s, p2p_s):
    """Whatever the sizes: the segments are in order inside the step, and the micro-batches drawn
    plus those in the gaps are all of them (each rank-0 first-chunk forward counted once)."""
    m = groups * pp if vpp > 1 else groups
    schedule = "interleaved" if vpp > 1 else "1f1b"
    sim = simulate(PipelineTimes.uniform(pp, vpp, forward_s, backward_s, p2p_s=p2p_s), m, schedule)
    window = timeline_window(sim)
    segments = window.segments
    assert len(window.gaps) == len(segments) - 1
    assert all(a.end_s <= b.start_s for a, b in zip(segments, segments[1:]))
    assert segments[0].start_s == 0 and segments[-1].end_s == pytest.approx(sim.makespan_s)
    bounds = [(s.start_s, s.end_s) for s in segments[:-1]] + [(segments[-1].start_s, float("inf"))]
    drawn = sum(_forwards_in(sim, a, b) for a, b in bounds)
    assert drawn + sum(g.microbatches for g in window.gaps) == m


@settings(max_examples=25, deadline=None)
@given(pp=st.integers(2, 4), extra=st.integers(1, 200), forward_s=st.floats(0.5, 2.0),
       backward_s=st.floats(0.5, 4.0), stage_scale=st.lists(st.floats(0.5, 2.0), min_size=4, max_size=4))
def test_extrapolated_window_ends_at_the_step_and_counts_every_microbatch(pp, extra, forward_s, backward_s,
                                                                         stage_scale):
    """Steps long enough to be extrapolated (more than 10 pp micro-batches), unequal stages: the
    drain drawn ends at the step's makespan, and drawn + left out = all micro-batches."""
    m = 10 * pp + extra
    scale = np.array(stage_scale[:pp])[:, None]
    times = PipelineTimes(forward_s * scale, backward_s * scale, np.zeros((pp, 1)), 0.05)
    sim = simulate_bounded(times, m, "1f1b")
    window = timeline_window(sim)
    last = window.segments[-1]
    assert last.end_s + last.shift_s == pytest.approx(sim.makespan_s)
    bounds = [(s.start_s, s.end_s) for s in window.segments[:-1]] + [(last.start_s, float("inf"))]
    drawn = sum(_forwards_in(sim, a, b) for a, b in bounds)
    assert drawn + sum(g.microbatches for g in window.gaps) == m


def test_p2p_is_read_off_the_timeline_and_every_transfer_drawn():
    """Rank 1 waits idle for rank 0's first forward plus one transfer, so the difference is the
    p2p time; each of the m micro-batches crosses pp * vpp - 1 boundaries forward and backward."""
    pp, vpp, m = 4, 2, 8
    sim = simulate(PipelineTimes.uniform(pp, vpp, 1.0, 2.0, p2p_s=0.25), m, "interleaved")
    assert inferred_p2p_s(sim.timeline) == pytest.approx(0.25)
    transfers = p2p_transfers(sim.timeline, 0.25)
    assert len(transfers) == 2 * m * (pp * vpp - 1)
    assert all(b - a == pytest.approx(0.25) for _, a, b in transfers)
    assert p2p_transfers(sim.timeline, 0.0) == []


def test_the_drain_of_an_extrapolated_step_is_numbered_as_the_steps_last_microbatches():
    """pp 4, m 512, extrapolated from a shorter simulated step of n micro-batches: the drain drawn
    is that step's, so its ops carry micro-batches up to n - 1, while the step's drain runs its last
    ones, up to 511. The drain segment shifts them by 512 - n; the bars drawn in it read 511, 510,
    ... (the labels used to be the short step's own numbers: 19, 18 for a 128-micro-batch step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autopar.report.timeline import draw_timeline

    sim = simulate_bounded(PipelineTimes.uniform(4, 1, 1.0, 2.0), 512, "1f1b")
    n = sim.timeline_microbatches
    assert n is not None and n < 512 and sim.step_microbatches == 512
    window = timeline_window(sim)
    fill, period, drain = window.segments
    assert (fill.shift_microbatches, period.shift_microbatches, drain.shift_microbatches) == (0, 0, 512 - n)
    last = max(op.microbatch for op in sim.timeline if op.stage == 0 and op.kind == "forward")
    assert last + drain.shift_microbatches == 511
    fig = plt.figure(figsize=(12, 3))
    axes, _ = draw_timeline(fig, fig.add_gridspec(1, 1)[0], sim, window, [f"stage {i}" for i in range(4)])
    labels = [int(t.get_text()) for t in axes[-1].texts if t.get_text().isdigit()]
    plt.close(fig)
    assert max(labels) == 511 and min(labels) >= 512 - 4 - 3  # the last pp + pp - 1 micro-batches, no short-step ones
    assert all(int(t.get_text()) < n for t in axes[0].texts if t.get_text().isdigit())  # the fill is not shifted
