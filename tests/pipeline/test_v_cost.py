"""The V schedules' makespan and in-flight counts for many layouts (autopar.pipeline.v_cost)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.pipeline.v_cost import SHARE_STEP, v_in_flight_microbatches, v_makespans_s


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("forward,backward,weight", [(1.0, 2.3, 0.3), (1.0, 1.2, 0.45), (1.0, 4.0, 0.2)])
def test_the_bubble_does_not_depend_on_m(schedule, pp, forward, backward, weight):
    """The fixed op orders reach their steady state after 2 pp micro-batches: the step is m times
    a rank's work plus one bubble, whatever m (what v_makespans_s relies on)."""
    times = PipelineTimes.uniform(pp, 2, forward, backward)
    times = PipelineTimes(times.forward_s, times.backward_s, times.recompute_s, 0.0, weight)
    bubbles = {round(simulate(times, m, schedule).makespan_s - 2 * m * (forward + backward), 9)
               for m in (2 * pp, 2 * pp + 1, 4 * pp + 3, 10 * pp)}
    assert len(bubbles) == 1


def test_makespans_equal_the_simulation_of_the_same_chunks():
    """pp 4, m 32, rank time 6 s (forward 2, backward 4 with half of it W): the vectorised makespan
    is the event simulation of chunks of 1 s and 2 s, within the share's rounding to 0.01 (1/3 ->
    0.33: at most pp * 0.005 * 6 s = 0.12 s); rows without a V schedule get nan."""
    bound = 4 * SHARE_STEP / 2 * 6.0
    v = np.array([1, 2, 0])
    got = v_makespans_s(v, np.full(3, 4), np.full(3, 32), np.full(3, 6.0), np.full(3, 1 / 3), np.full(3, 0.5))
    for i, schedule in enumerate(("zbv", "dualpipev")):
        sim = simulate(PipelineTimes.uniform(4, 2, 1.0, 2.0), 32, schedule)
        assert got[i] == pytest.approx(sim.makespan_s, abs=bound)
    assert got[0] == pytest.approx(32 * 6 + 3 * 1.0, abs=bound)  # ZB-V at the design point: only the fill skew
    assert got[1] == pytest.approx(32 * 6 + 3 * 2.0, abs=bound)  # DualPipeV: (PP/2-1)(F&B+B-3W) = 3 * 2
    exact = v_makespans_s(v[:1], np.full(1, 4), np.full(1, 32), np.full(1, 8.0), np.full(1, 0.25), np.full(1, 0.5))
    sim = simulate(PipelineTimes.uniform(4, 2, 1.0, 3.0), 32, "zbv")  # share 0.25 needs no rounding
    assert exact[0] == pytest.approx(sim.makespan_s, rel=1e-12)
    assert np.isnan(got[2])


def test_in_flight_is_half_the_chunks_the_order_holds():
    got = v_in_flight_microbatches(np.array([1, 2, 0]), np.full(3, 4), np.full(3, 16), np.zeros(3, dtype=int))
    assert got[0] == 4.0 and got[1] == 4.5 and np.isnan(got[2])  # 2pp and 2pp+1 chunks of half a rank
