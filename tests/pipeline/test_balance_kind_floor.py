"""The per-rank time floors of one layer kind as cuts of the chunk program with several kinds
(autopar.pipeline.chunk_ilp ``floor_kind``): they must never cut off an answer, so on small
random two-kind tables the proven optimum is the same with and without them.

The tables' factors are multiples of 1/4 and the limits whole numbers, so every memory sum is exact
in binary floating point: with arbitrary floats a split could sit a few 1e-6 above the limit, inside
HiGHS's feasibility tolerance, and be "feasible" in one program and not in the other (moe_factor
2.00001 with the limit 31.0 did: 143 with the cuts, 144 without, both proven optimal)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.pipeline import chunk_ilp
from autopar.pipeline.chunk_costs import chunk_costs, kind_alone
from autopar.pipeline.layers import LayerTable
from autopar.pipeline.warm_start import all_rank_candidates, rank_time_floor_s


def _two_kinds(pp: int, num_layers: int, dense: int, moe_factor: float, act: float, limit: float) -> LayerTable:
    """``dense`` light layers then heavier ones (time and activations times ``moe_factor``),
    options none / full, a fixed part of 3 bytes with full recompute."""
    rows = lambda v: np.tile(np.asarray(v, float), (num_layers, 1))  # noqa: E731
    forward, activation = rows([1.0, 1.0]), rows([act, 1.0])
    forward[dense:] *= moe_factor
    activation[dense:] *= moe_factor
    zeros = np.zeros((pp, 2))
    return LayerTable(options=("none", "full"), forward_s=forward, backward_s=2 * forward,
                      recompute_s=forward * np.array([0.0, 1.0]), activation_bytes=activation,
                      static_bytes=np.ones(num_layers), stage_forward_s=zeros, stage_backward_s=zeros,
                      stage_recompute_s=zeros, stage_bytes=np.tile([0.0, 3.0], (pp, 1)), p2p_s=0.0,
                      memory_limit_bytes=limit)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pp=st.integers(2, 4), vpp=st.integers(1, 2), extra=st.integers(0, 6), dense=st.integers(1, 3),
       moe_factor=st.integers(5, 12).map(lambda k: k / 4), act=st.integers(8, 48).map(lambda k: k / 4),
       limit=st.integers(30, 200).map(float))
def test_kind_floors_keep_the_optimum(pp, vpp, extra, dense, moe_factor, act, limit):
    num_layers = pp + dense + extra
    table = _two_kinds(pp, num_layers, dense, moe_factor, act, limit)
    m = 2 * pp
    costs = chunk_costs(table, vpp, "interleaved" if vpp > 1 else "1f1b", m)
    options = np.arange(2)
    plain = chunk_ilp.solve(costs, options, m, None, 20.0)
    kind = int(np.argmax(costs.kind_layers))
    floor = rank_time_floor_s(all_rank_candidates(kind_alone(costs, kind), options, np.inf, False),
                              int(costs.kind_layers[kind]))
    assert floor is not None
    cut = chunk_ilp.solve(costs, options, m, None, 20.0, floor, kind)
    assert (plain.counts is None) == (cut.counts is None)
    if plain.counts is not None:
        assert plain.optimal and cut.optimal
        assert cut.objective_s == pytest.approx(plain.objective_s, rel=2 * chunk_ilp.MIP_REL_GAP)
        assert cut.bound_s <= plain.objective_s * (1 + 1e-6)
