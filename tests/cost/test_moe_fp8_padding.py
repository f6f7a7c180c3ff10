"""FP8 row padding of the routed experts (autopar.cost.moe_fp8_padding): the copies by hand, and nothing
outside fp8 Megatron-Core MoE training."""

from __future__ import annotations

import pytest

from autopar.cost import compute as C
from autopar.cost import moe_fp8_padding as P
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem


def _batch(tp: int = 2, ep: int = 32) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(dp=16, tp=tp, pp=8, ep=ep, etp=1, mbs=1, sp=tp > 1), 2048)


def test_qwen3_235b_h100_copies_by_hand():
    """Qwen3-235B-A22B, seq 4096, mbs 1, top-8, tp 2 (SP), etp 1: rows = 4096 x 8 / 2 = 16384 on the
    busiest rank, h = 4096: 67,108,864 elements; 8 B each way at the H100's memory rate, plus 3
    kernels per pass."""
    p = make_problem("qwen3-235b-a22b", nodes=32, gbs=2048, seq=4096, precision="fp8")
    dev = p.cluster.device
    rate = dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency
    elements = 4096 * 8 / 2 * 4096
    one_way = 8 * elements / rate + 3 * C.KERNEL_OVERHEAD_S
    forward, extra = P.times_s(p, _batch())
    assert P.applies(p)
    assert forward[0] == pytest.approx(one_way)
    assert extra[0] == pytest.approx(-one_way)  # backward = 2 x forward + extra = one more copy pair


@pytest.mark.parametrize("precision, framework", [("bf16", "megatron"), ("fp8", "torchtitan")])
def test_no_copies_in_bf16_or_outside_megatron(precision, framework):
    p = make_problem("qwen3-235b-a22b", nodes=32, gbs=2048, seq=4096, precision=precision, framework=framework)
    forward, extra = P.times_s(p, _batch())
    assert not P.applies(p)
    assert forward[0] == 0.0 and extra[0] == 0.0


def test_dense_models_have_no_padding():
    p = make_problem("llama3-8b", gbs=64, seq=4096, precision="fp8")
    assert not P.applies(p)


def test_moe_layer_elementwise_time_includes_it():
    fp8 = make_problem("qwen3-235b-a22b", nodes=32, gbs=2048, seq=4096, precision="fp8")
    titan = make_problem("qwen3-235b-a22b", nodes=32, gbs=2048, seq=4096, precision="fp8", framework="torchtitan")
    b = _batch()
    forward, _ = P.times_s(fp8, b)
    gap = C.layer_forward_times(fp8, b, moe=True).elementwise_s - C.layer_forward_times(titan, b, moe=True).elementwise_s
    assert gap[0] == pytest.approx(forward[0])
