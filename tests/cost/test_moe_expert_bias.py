"""The routed experts' fc2 bias added per local expert (autopar.cost.moe_expert_bias): bytes, kernels
and host ops by hand for GPT-OSS-120B, and nothing for unbiased experts or other frameworks."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import compute as C
from autopar.cost import host
from autopar.cost import moe_expert_bias as B
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem


def _batch(ep: int, mbs: int = 4, dp: int = 8) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(dp=dp, tp=1, pp=1, ep=ep, mbs=mbs), 64)


def test_gpt_oss_bytes_and_kernels_by_hand():
    """GPT-OSS-120B, seq 4096, mbs 4, top-4, ep 8: rows = 16384 x 4 = 65536 copies on a rank,
    h = 2880: 188,743,680 output elements; 12 B each forward and backward; 128 / 8 = 16 local
    experts: 2 x 16 + 1 = 33 forward kernels, 4 x 16 = 64 backward, 3 + 2 x 16 = 35 host ops."""
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    b = _batch(ep=8)
    elements = 16384 * 4 * 2880
    assert B.applies(p)
    assert B.output_elements(p, b)[0] == pytest.approx(elements)
    assert B.forward_bytes(p, b)[0] == pytest.approx(12 * elements)
    assert B.backward_bytes(p, b)[0] == pytest.approx(12 * elements)
    assert B.forward_kernels(p, b)[0] == 33
    assert B.backward_kernels(p, b)[0] == 64
    assert B.forward_host_ops(p, b)[0] == 35


def test_times_by_hand_on_h100():
    """Forward: bytes at the HBM rate plus 33 kernels; backward beyond 2x forward: the same bytes
    in 64 kernels, less twice the forward."""
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    b = _batch(ep=8)
    dev = p.cluster.device
    rate = dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency
    elements = 16384 * 4 * 2880
    fwd = 12 * elements / rate + 33 * C.KERNEL_OVERHEAD_S
    bwd = 12 * elements / rate + 64 * C.KERNEL_OVERHEAD_S
    forward, extra = B.times_s(p, b)
    assert forward[0] == pytest.approx(fwd)
    assert extra[0] == pytest.approx(bwd - 2 * fwd)


def test_more_experts_per_rank_cost_more_kernels_not_more_bytes():
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    few, many = _batch(ep=64), _batch(ep=8)
    assert B.forward_bytes(p, few)[0] == pytest.approx(B.forward_bytes(p, many)[0])
    assert B.forward_kernels(p, few)[0] == 2 * 2 + 1 < B.forward_kernels(p, many)[0]


@pytest.mark.parametrize("model, framework", [("qwen3-30b-a3b", "megatron"), ("gpt-oss-120b", "torchtitan")])
def test_nothing_without_biased_experts_or_outside_megatron(model, framework):
    """Qwen3's experts have no bias; torchtitan does not run Megatron-Core's TEGroupedMLP."""
    p = make_problem(model, nodes=8, gbs=512, seq=4096, framework=framework)
    b = _batch(ep=8)
    assert not B.applies(p)
    forward, extra = B.times_s(p, b)
    assert forward[0] == 0.0 and extra[0] == 0.0
    assert B.forward_host_ops(p, b)[0] == 0.0


def test_layer_times_and_host_ops_include_it():
    """The MoE layer's elementwise time and host ops grow by exactly the bias term."""
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    titan = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096, framework="torchtitan")
    b = _batch(ep=8)
    forward, extra = B.times_s(p, b)
    with_bias = C.layer_forward_times(p, b, moe=True)
    without = C.layer_forward_times(titan, b, moe=True)
    assert with_bias.elementwise_s[0] - without.elementwise_s[0] == pytest.approx(forward[0])
    assert np.asarray(with_bias.backward_extra_s - without.backward_extra_s) == pytest.approx(extra[0])
    assert host.moe_mlp_ops(p, b)[0] - host.moe_mlp_ops(titan, b)[0] == 35
