"""Overlapped TP collectives hide only under their own block's GEMMs; torchtitan's async TP leaves
the backward input-gradient reduce-scatters unfused; torchtitan's per-op SAC re-gathers the
layer inputs in backward (:mod:`autopar.cost.tp_overlap`, :mod:`autopar.cost.recompute`)."""

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost import comm, recompute, tp_overlap
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.specs.userbuffers import UbGemm, Userbuffers
from autopar.strategy import Strategy


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=2, tp=4, sp=True), **over}), 64)


def test_each_block_hides_only_under_its_own_gemms():
    b = _batch()
    one = np.array([5e-3])
    # 5 ms under 5 ms and 5 ms under 35 ms: only the first chunks, 10 / 4 ms.
    assert tp_overlap.comm_overlap_tp_s(b, [one, one], [np.array([5e-3]), np.array([35e-3])])[0] == pytest.approx(2.5e-3)
    # 5 ms under 2 ms: 3 ms excess, although the 40 ms of GEMMs outlast the 10 ms of collectives.
    assert tp_overlap.comm_overlap_tp_s(b, [one, one], [np.array([2e-3]), np.array([38e-3])])[0] == pytest.approx(5.5e-3)
    # 2 ms left unfused are exposed in full.
    assert tp_overlap.comm_overlap_tp_s(b, np.array([10e-3]), np.array([40e-3]), 2e-3)[0] == pytest.approx(4.5e-3)


def test_torchtitan_leaves_one_reduce_scatter_per_block_unfused():
    one = np.array([1e-3])
    titan = make_problem("llama3-8b", framework="torchtitan")
    assert tp_overlap.unfused_backward_s(titan, np.array([2.0]), one)[0] == pytest.approx(1e-3)  # 2 halves of 1 ms
    assert tp_overlap.unfused_backward_s(make_problem("llama3-8b"), np.array([2.0]), one)[0] == 0


def test_llama3_8b_at_tp8_exposes_part_of_the_attention_gather():
    # Per rank the QKV GEMM makes 768 of the 6144 columns: 2 * 8192 * 4096 * 768 FLOP at 64% of
    # 989.4 TFLOP/s is about 81 us (+4 us per kernel), shorter than its all-gather of the 8192 x
    # 4096 bf16 input over 8 NVLink ranks, so the attention block leaves an excess the MLP's
    # long GEMMs cannot hide, while one pooled budget would hide everything.
    p = make_problem("llama3-8b", seq=8192)
    b = _batch(tp=8, dp=1, tp_comm_overlap=True)
    assert C.gemm_time_s(p, F.attention_gemms(p, b)[0])[0] == pytest.approx(
        2 * 8192 * 4096 * 768 / (989.4e12 * 0.64) + 4e-6)
    one = comm.all_reduce_s(p, 2.0 * 8192 * 4096, b.tp, 1)
    layers = np.array([1.0])
    fused = 4 * one  # one layer: 2 forward and 2 backward all-reduce equivalents
    blocks, gemms = tp_overlap.overlap_blocks(p, b, fused, layers, np.zeros(1), np.zeros(1), np.zeros(1))
    assert blocks[0] == pytest.approx(2 * one) and blocks[1] == pytest.approx(2 * one)
    assert gemms[0] < blocks[0] < gemms[1]
    blocked = tp_overlap.comm_overlap_tp_s(b, blocks, gemms)[0]
    pooled = tp_overlap.comm_overlap_tp_s(b, fused, gemms[0] + gemms[1])[0]
    assert blocked == pytest.approx(pooled + (blocks[0] - gemms[0])[0])


def test_torchtitan_async_tp_gains_less_than_megatron_userbuffers():
    # torchtitan 2025-06 benchmark layout: Llama-3.1-8B, FSDP 8 x TP 8, local batch 12, per-op SAC.
    # Megatron with userbuffers kernels that take no SM (the SMs TE's take: autopar.cost.userbuffers_sm),
    # so the comparison is of the unfused scatters and symmetric-memory copies alone.
    no_sms = Userbuffers(**{name: UbGemm(method="ring_exchange", num_sm=0, set_sm_margin=False)
                            for name in Userbuffers.model_fields})

    def gain(framework):
        extra = dict(userbuffers=no_sms) if framework == "megatron" else {}
        p = make_problem("llama3-8b", nodes=8, gbs=96, seq=8192, framework=framework, **extra)
        s = dict(dp=8, tp=8, mbs=12, sp=True, zero=3, recompute="selective")
        return estimate(p, Strategy(**s)).step_time_s / estimate(p, Strategy(**s, tp_comm_overlap=True)).step_time_s
    assert 1.0 < gain("torchtitan") < gain("megatron")


def test_torchtitan_op_sac_repeats_the_forward_all_gathers():
    titan = make_problem("llama3-8b", framework="torchtitan")
    layers = np.array([32.0])
    assert recompute.extra_tp_collectives(titan, _batch(), layers, np.zeros(1))[0] == 32  # 2 gathers = 1 pair
    assert recompute.extra_tp_collectives(titan, _batch(tp=1, sp=False, dp=8), layers, np.zeros(1))[0] == 0
