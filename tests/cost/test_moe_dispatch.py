"""MoE token dispatchers and what hides their communication (autopar.cost.moe_dispatch), by hand."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import comm, moe
from autopar.cost import moe_dispatch as D
from autopar.layout_batch import LayoutBatch
from autopar.specs.moe_runtime import MoeRuntime
from autopar.strategy import Strategy
from conftest import make_problem


def _batch(gbs=64, **layout):
    return LayoutBatch.from_strategy(Strategy(**layout), gbs)


def _dsv3(nodes=8, **train):
    return make_problem("deepseek-v3", nodes=nodes, gbs=512, seq=4096, **train)


def test_alltoall_pass_is_dispatch_plus_combine_of_the_alltoall():
    p = make_problem("qwen3-30b-a3b", nodes=2)
    b = _batch(dp=16, ep=16)
    assert D.pass_comm_s(p, b)[0] == pytest.approx(2 * moe.all_to_all_s(p, b)[0])
    assert moe.layer_comm_s(p, b)[0] == pytest.approx(2 * D.pass_comm_s(p, b)[0])


def test_allgather_moves_the_whole_group_whatever_k():
    """ep 8 in one node, n = 4096 tokens of h = 2048: an all-gather of 8 x 4096 x 2048 x 2 bytes
    (and the reduce-scatter back), not the k = 8 copies of the alltoall."""
    p = make_problem("qwen3-30b-a3b")
    b = _batch(dp=8, ep=8, moe_dispatcher="allgather")
    full = 2 * 4096 * 2048 * 8
    assert D.pass_comm_s(p, b)[0] == pytest.approx(2 * comm.all_gather_s(p, full, 8, 1))


def test_deepep_sends_a_token_once_per_remote_node():
    """DeepSeek-V3 on 8 nodes, ep 64 (8 per node): group-limited routing (4 groups) sends each token
    to at most 3 other nodes over RDMA; the alltoall sends each of its k = 8 copies, 7/8 off-node."""
    p = _dsv3()
    dev = p.cluster.device
    b = _batch(dp=64, ep=64, moe_dispatcher="deepep")
    n, h, k = 4096, 7168, 8
    expected_remote = min(7 * (1 - (7 / 8) ** 8), 3)
    assert D.remote_nodes_per_token(p, np.array([8.0]))[0] == pytest.approx(expected_remote)
    rdma = expected_remote * n * h * 2 / (dev.inter_node_bandwidth_bytes_per_s * D.DEEPEP_RDMA_FRACTION)
    nvlink = 7 / 64 * n * k * h * 2 / (dev.intra_node_bandwidth_bytes_per_s * D.DEEPEP_NVLINK_FRACTION)
    assert D.flex_a2a_s(p, b, np.array([8]))[0] == pytest.approx(max(rdma, nvlink) + dev.inter_node_latency_s)
    alltoall = _batch(dp=64, ep=64)
    assert D.pass_comm_s(p, b)[0] < 0.5 * D.pass_comm_s(p, alltoall)[0]


def test_hybridep_forwards_over_the_whole_nvl72_rack():
    """On GB200 NVL72 ep 64 stays in one NVLink domain for HybridEP; DeepEP forwards within 8 GPUs only."""
    p = make_problem("deepseek-v3", device="gb200", nodes=16, per_node=4, gbs=512)
    hybrid, deep = _batch(dp=64, ep=64, moe_dispatcher="hybridep"), _batch(dp=64, ep=64, moe_dispatcher="deepep")
    assert D.pass_comm_s(p, hybrid)[0] < D.pass_comm_s(p, deep)[0]


def test_remote_nodes_for_one_node_is_zero_and_bounded_by_k():
    p = make_problem("qwen3-30b-a3b")
    nodes = np.array([1.0, 2.0, 100.0])
    remote = D.remote_nodes_per_token(p, nodes)
    assert remote[0] == 0 and remote[1] == pytest.approx(1 - 0.5 ** 8) and remote[2] <= 8


def test_ep_overlap_hides_the_alltoall_under_the_other_micro_batch():
    """Paired micro-batches: max(C - 2F, 0) + max(C - F, 0) per layer for a pass of C seconds and a
    layer forward of F; pp / m of them run unpaired with all 2C exposed."""
    p = make_problem("qwen3-30b-a3b", nodes=2)
    b = _batch(gbs=256, dp=16, ep=16, moe_ep_overlap=True)
    c = D.pass_comm_s(p, b)[0]
    forward = np.array([0.6 * c])
    u = 1 / b.num_microbatches[0]
    expected = u * 2 * c + (1 - u) * (0 + 0.4 * c)
    assert D.exposed_layer_comm_s(p, b, forward, np.zeros(1), np.zeros(1))[0] == pytest.approx(expected)


def test_delay_wgrad_hides_the_backward_pass_under_the_expert_weight_gradients():
    p = make_problem("qwen3-30b-a3b", nodes=2, moe=MoeRuntime(delay_wgrad=True))
    b = _batch(gbs=256, dp=16, ep=16, moe_ep_overlap=True)
    c = D.pass_comm_s(p, b)[0]
    forward, wgrad = np.array([0.6 * c]), np.array([0.4 * c])
    u = 1 / b.num_microbatches[0]
    assert D.exposed_layer_comm_s(p, b, forward, np.zeros(1), wgrad)[0] == pytest.approx(u * 2 * c)


def test_shared_expert_overlap_hides_up_to_the_shared_experts():
    p = _dsv3(moe=MoeRuntime(shared_expert_overlap=True))
    b = _batch(dp=64, ep=64)
    c = D.pass_comm_s(p, b)[0]
    shared = np.array([0.3 * c])
    assert D.exposed_layer_comm_s(p, b, np.ones(1), shared, np.zeros(1))[0] == pytest.approx(0.7 * c + 0.4 * c)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.sampled_from(["alltoall", "deepep", "hybridep"]),
       st.floats(0, 1), st.floats(0, 1), st.booleans())
def test_overlaps_never_expose_more_than_the_plain_passes(ep, dispatcher, fwd_frac, shared_frac, delay):
    p = _dsv3(moe=MoeRuntime(delay_wgrad=delay))
    b = _batch(dp=64, ep=ep, moe_dispatcher=dispatcher, moe_ep_overlap=ep > 1)
    plain = 2 * D.pass_comm_s(p, b)[0]
    exposed = D.exposed_layer_comm_s(p, b, np.array([fwd_frac]), np.array([shared_frac]), np.array([0.1]))[0]
    assert 0.0 <= exposed <= plain + 1e-15


def test_token_factor_forced_balance_capacity_and_padding():
    """skew 2 -> 2; forced balance -> 1; dropping at C = 1.5 -> min(1.5, skew); padded -> C."""
    p = make_problem("qwen3-30b-a3b", moe_token_imbalance=2.0)
    assert moe.token_factor(p.train) == 2.0
    forced = p.train.model_copy(update={"moe": MoeRuntime(force_balance=True)})
    assert moe.token_factor(forced) == 1.0
    drop = p.train.model_copy(update={"moe": MoeRuntime(capacity_factor=1.5)})
    assert moe.token_factor(drop) == 1.5
    drop_forced = p.train.model_copy(update={"moe": MoeRuntime(capacity_factor=1.5, force_balance=True)})
    assert moe.token_factor(drop_forced) == 1.0
    pad = p.train.model_copy(update={"moe": MoeRuntime(capacity_factor=1.25, pad_to_capacity=True,
                                                       force_balance=True)})
    assert moe.token_factor(pad) == 1.25
    with pytest.raises(ValueError, match="pad_to_capacity needs capacity_factor"):
        MoeRuntime(pad_to_capacity=True)


def test_fusions_cut_kernels_and_permute_traffic():
    fused, unfused = make_problem("qwen3-30b-a3b"), make_problem(
        "qwen3-30b-a3b", moe=MoeRuntime(permute_fusion=False, router_fusion=False))
    both = make_problem("qwen3-30b-a3b", moe=MoeRuntime(router_fusion=True))
    b = _batch(dp=8, ep=8)
    assert D.extra_kernels(unfused) == 16 > D.extra_kernels(fused) == 12 > D.extra_kernels(both) == 6
    assert D.permute_passes(unfused, b)[0] == 2 and D.permute_passes(fused, b)[0] == 1
    assert D.permute_passes(unfused, _batch(dp=8, ep=8, moe_dispatcher="deepep"))[0] == 1


def test_alltoall_sorts_the_copies_by_local_expert():
    """token_dispatcher.py "Permutation 2": Qwen3-30B-A3B, seq 4096, mbs 2, top-8, ep 8 (16 local
    experts): rows = 8192 x 8 = 65536, h = 2048: 2 x 2 x 2 B x 65536 x 2048 = 1,073,741,824 B with
    the alltoall dispatcher; nothing with DeepEP or with one local expert (ep = 128)."""
    from autopar.cost.moe_dispatch import sort_chunks_bytes
    from autopar.layout_batch import LayoutBatch
    from autopar.strategy import Strategy
    from conftest import make_problem

    p = make_problem("qwen3-30b-a3b", nodes=16, gbs=512, seq=4096)

    def bytes_of(ep, dispatcher):
        s = Strategy(dp=128, tp=1, pp=1, ep=ep, mbs=2, moe_dispatcher=dispatcher)
        return sort_chunks_bytes(p, LayoutBatch.from_strategy(s, 512))[0]

    assert bytes_of(8, "alltoall") == 2 * 2 * 2 * 65536 * 2048
    assert bytes_of(8, "deepep") == 0.0
    assert bytes_of(128, "alltoall") == 0.0
