"""torchtitan's float8 tensor parallelism (autopar.cost.float8_tp): the layer all-gathers move
fp8, the reduce-scatters bf16; checked by hand on the ring formulas of autopar.cost.comm."""

import numpy as np
import pytest

from autopar.cost import comm, float8_tp
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import link_bandwidths, make_problem

GB = 1e9


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=1, tp=8, sp=True), **over}), 64)


def _titan(**train):
    """torchtitan as its 2024-12 / 2025-06 releases ran float8 TP (TrainSpec.float8_tp_gather)."""
    return make_problem("llama3-8b", seq=8192, framework="torchtitan", **{"float8_tp_gather": True, **train})


def test_torchtitan_0_2_2_gathers_bf16():
    """0.2.2's apply_tp takes the float8 styles only for '"float8" in model.converters', and its float8
    converter is 'quantize.linear.float8': the exported config runs bf16 TP collectives, so the
    torchtitan target's default costs them so."""
    p = make_problem("llama3-8b", seq=8192, framework="torchtitan", precision="fp8", fp8_recipe="tensorwise")
    assert not p.train.float8_tp_gather and not float8_tp.applies(p, _batch())[0]
    assert float8_tp.applies(_titan(precision="fp8", fp8_recipe="tensorwise"), _batch())[0]


def test_fp8_gather_pair_is_three_quarters_of_the_bf16_pair_without_latency():
    # tp 8 in one node, 1 GB activation: bf16 pair = 2 x 7/8 GB over the bus; fp8 gather + bf16
    # reduce-scatter = 7/16 + 7/8 GB; latencies 7 steps each either way.
    p = _titan(precision="fp8", fp8_recipe="tensorwise")
    b = _batch()
    bus, _ = link_bandwidths(p)
    alpha = p.cluster.device.intra_node_latency_s
    bf16 = comm.all_reduce_s(p, np.array([GB]), b.tp, 1)
    pair = float8_tp.layer_pair_s(p, b, np.array([GB]), bf16)
    assert bf16[0] == pytest.approx(2 * 7 / 8 * GB / bus + 14 * alpha)
    assert pair[0] == pytest.approx((7 / 16 + 7 / 8) * GB / bus + 14 * alpha)
    gathers = float8_tp.recompute_gathers_s(p, b, np.array([GB]), bf16)
    assert gathers[0] == pytest.approx(2 * (7 / 16 * GB / bus + 7 * alpha))


@pytest.mark.parametrize("train, over", [
    (dict(precision="bf16"), {}),                                               # bf16 training
    (dict(precision="fp8", fp8_recipe="delayed"), {}),                          # not tensorwise
    (dict(precision="fp8", fp8_recipe="tensorwise"), dict(tp=1, dp=8, sp=False)),  # no TP
])
def test_other_runs_keep_bf16_collectives(train, over):
    p, b = _titan(**train), _batch(**over)
    assert not float8_tp.applies(p, b)[0]
    one = np.array([3.0])
    assert float8_tp.layer_pair_s(p, b, np.array([GB]), one)[0] == 3.0


def test_megatron_gathers_bf16():
    p = make_problem("llama3-8b", seq=8192, precision="fp8", fp8_recipe="tensorwise")
    assert not float8_tp.applies(p, _batch())[0]


def test_float8_tp_shortens_the_tp_time():
    s = Strategy(dp=1, tp=8, sp=True, recompute="selective")
    fp8_tw = estimate(_titan(precision="fp8", fp8_recipe="tensorwise"), s)
    fp8_delayed = estimate(_titan(precision="fp8", fp8_recipe="delayed"), s)
    on, off = fp8_tw.time_breakdown_s, fp8_delayed.time_breakdown_s
    assert on["tp_comm"] < off["tp_comm"]
    # every layer collective: 7/10 of its bf16 bytes (6 gathers at half, 4 reduce-scatters) at most
    assert on["tp_comm"] > 0.6 * off["tp_comm"]
