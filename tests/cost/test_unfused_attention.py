"""Unfused (non-flash) attention: full s x s FLOPs, softmax/dropout HBM passes, recompute."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import attention as attn
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import elementwise_backward
from autopar.cost.recompute import layer_recompute_s
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem, toy_model


def _tiny(flash: bool, dropout: bool):
    """toy model (4 heads of width 4), s = 8, tp = 2, mbs = 2: 2 heads per rank, 2 sequences."""
    p = make_problem(toy_model(dropout=dropout), gbs=2, seq=8, flash_attention=flash)
    return p, LayoutBatch.from_strategy(Strategy(dp=1, tp=2, mbs=2), 2)


def test_unfused_gemms_cover_the_full_score_matrix():
    p, b = _tiny(flash=False, dropout=False)
    qk, pv = F.unfused_attention_gemms(p, b)
    # mbs * heads/tp = 4 batched GEMMs each: (8 x 4) @ (4 x 8) and (8 x 8) @ (8 x 4).
    assert (qk.m, qk.n, qk.k, float(qk.count[0])) == (8, 8, 4, 4.0)
    assert (pv.m, pv.n, pv.k, float(pv.count[0])) == (8, 4, 8, 4.0)
    # By hand: 2 * 8*8*4 * 4 heads-and-sequences per GEMM = 2048; full matrix 4096 FLOPs.
    full = float((qk.flops + pv.flops)[0])
    assert full == 4096.0
    # Flash attention (causal) does half: 2 * 16 tokens * 8 keys * 2 heads * (4 + 4) / 2.
    assert float(F.attention_core_flops(p, b)[0]) == 2048.0 == full / 2
    assert not qk.fp8 and qk.grouped  # bf16 bmm, one kernel for the batch


@pytest.mark.parametrize("dropout, fwd, bwd", [(False, 4 * 256, 6 * 256), (True, 9 * 256, 11 * 256)])
def test_unfused_softmax_and_dropout_bytes(dropout, fwd, bwd):
    # 2 sequences * 2 heads * 8 * 8 = 256 scores. Softmax: read + write bf16 (4 B) forward, read probs
    # and grad + write grad (6 B) backward; dropout: read, write, 1-byte mask (5 B) each way.
    p, b = _tiny(flash=False, dropout=dropout)
    f, bw = F.unfused_softmax_bytes(p, b)
    assert (float(f[0]), float(bw[0])) == (fwd, bwd)


def test_flash_attention_has_no_score_passes_and_elementwise_is_the_same():
    p_flash, b = _tiny(flash=True, dropout=True)
    p_local, _ = _tiny(flash=False, dropout=True)
    f, bw = F.unfused_softmax_bytes(p_flash, b)
    assert float(f[0]) == 0.0 and float(bw[0]) == 0.0
    # The softmax is costed inside core attention now, not among the element-wise ops.
    assert np.array_equal(F.elementwise_bytes(p_flash, b, False), F.elementwise_bytes(p_local, b, False))


def test_flash_attention_times_unchanged():
    p = make_problem("llama3-8b", gbs=8, seq=8192)
    b = LayoutBatch.from_strategy(Strategy(dp=1, tp=2, cp=2), 8)
    t = C.layer_forward_times(p, b, moe=False)
    expected = C.attention_time_s(p, F.attention_core_flops(p, b), attn.block_efficiency(p, b))
    assert np.array_equal(t.attention_s, expected)
    # backward: twice the forward but for the element-wise kernels' own bytes (autopar.cost.elementwise_backward)
    elementwise = C.memory_time_s(p, elementwise_backward.dense_backward_bytes(p, b) - 2 * F.elementwise_bytes(p, b, False))
    assert np.allclose(t.backward_extra_s, elementwise, rtol=1e-12)
    assert np.allclose(t.backward(), 2 * t.forward_s + elementwise, rtol=1e-12)


def _gpt22b():
    """Korthikanti et al. 2022 (arXiv:2205.05198) Table 4: GPT-22B layer, A100, tp = 8, mbs = 4,
    s = 2048, Megatron core attention (unfused, fused softmax, attention dropout)."""
    m = toy_model(num_layers=48, hidden_size=6144, num_attention_heads=64, num_kv_heads=64, head_dim=96,
                  ffn_hidden_size=24576, vocab_size=51200, norm="layernorm", dropout=True)
    p = make_problem(m, device="a100-80gb", gbs=4, seq=2048, flash_attention=False)
    return p, LayoutBatch.from_strategy(Strategy(dp=1, tp=8, mbs=4, recompute="selective"), 4)


def test_unfused_attention_time_by_hand():
    p, b = _gpt22b()
    dev = p.cluster.device
    peak = dev.peak("bf16") * dev.gemm_efficiency
    bw = dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency
    count, s, d = 4 * 64 / 8, 2048, 96
    # Each bmm: 2*s*s*d FLOPs and bf16 (s*d + d*s + s*s) or (s*s + s*d + s*d) elements, per head.
    bmm = count * max(2 * s * s * d / peak, 2 * (2 * s * d + s * s) / bw) + C.KERNEL_OVERHEAD_S
    scores = count * s * s
    t = C.layer_forward_times(p, b, moe=False)
    assert float(t.attention_s[0]) == pytest.approx(2 * bmm + 9 * scores / bw + 2 * C.KERNEL_OVERHEAD_S, rel=1e-12)
    elementwise = C.memory_time_s(p, elementwise_backward.dense_backward_bytes(p, b) - 2 * F.elementwise_bytes(p, b, False))
    assert float(t.backward_extra_s[0]) == pytest.approx((11 - 2 * 9) * scores / bw + float(elementwise[0]), rel=1e-12)
    # Megatron's selective recompute reruns the whole core attention forward (bmm, softmax, dropout).
    assert np.array_equal(layer_recompute_s(p, b, t, moe=False), t.attention_s)


def test_unfused_core_attention_matches_the_measured_selective_recompute_cost():
    # Korthikanti Table 4: selective recompute adds 13.2 - 11.9 = 1.3 ms (and 13.1 - 11.8 with SP) of
    # backward to one GPT-22B layer: the rerun core attention forward.
    p, b = _gpt22b()
    assert float(C.layer_forward_times(p, b, moe=False).attention_s[0]) == pytest.approx(1.3e-3, rel=0.1)
