"""torchtitan's separate projection GEMMs (``wq``/``wk``/``wv``, ``w1``/``w3``; autopar.cost.flops
``separate_projections``), the quantised-operand bytes of fp8 GEMMs on the roofline, and async TP's
symmetric-memory copies (autopar.cost.tp_overlap ``symmetric_memory_copies_s``); checked by hand."""

import numpy as np
import pytest

from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import fp8, tp_overlap
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem

H100_BF16 = 989.4e12 * 0.64  # h100-80gb peak x gemm_efficiency
H100_HBM = 3.35e12 * 0.7  # hbm bandwidth x memory_efficiency
T0 = 4e-6  # KERNEL_OVERHEAD_S


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=1, tp=8, sp=True), **over}), 64)


def test_torchtitan_runs_wq_wk_wv_and_w1_w3_as_separate_gemms():
    b = _batch()
    titan = make_problem("llama3-8b", seq=8192, framework="torchtitan")
    megatron = make_problem("llama3-8b", seq=8192)
    att_t, att_m = F.attention_gemms(titan, b), F.attention_gemms(megatron, b)
    # Megatron: one QKV GEMM of (4096 + 2 x 1024) / 8 = 768 columns; torchtitan: wq 512, wk and wv 128 each.
    assert [float(np.asarray(g.n).ravel()[0]) for g in att_m] == [768, 4096]
    assert [float(np.asarray(g.n).ravel()[0]) for g in att_t] == [512, 128, 4096]
    assert att_t[1].count == 2.0
    mlp_t, mlp_m = F.mlp_gemms(titan, b, False), F.mlp_gemms(megatron, b, False)
    assert float(np.asarray(mlp_m[0].n).ravel()[0]) == 2 * 14336 / 8 and mlp_m[0].count == 1.0
    assert float(np.asarray(mlp_t[0].n).ravel()[0]) == 14336 / 8 and mlp_t[0].count == 2.0
    # Same FLOPs either way (model FLOPs and MFU do not change).
    for split, fused in ((att_t, att_m), (mlp_t, mlp_m)):
        assert sum(float(g.flops[0]) for g in split) == pytest.approx(sum(float(g.flops[0]) for g in fused))


def test_narrow_wk_at_tp8_is_bound_by_hbm():
    # Llama-3-8B, seq 8192, mbs 1, tp 8: wk reads the 8192 x 4096 input and writes 8192 x 128.
    p = make_problem("llama3-8b", seq=8192, framework="torchtitan")
    wk = F.attention_gemms(p, _batch())[1]
    m, n, k = 8192, 128, 4096
    compute_s = 2 * m * n * k / H100_BF16
    memory_s = 2 * (m * k + k * n + m * n) / H100_HBM
    assert memory_s > compute_s
    assert C.gemm_time_s(p, wk)[0] == pytest.approx(2 * (memory_s + T0))  # wk and wv
    # The separate projections take longer than Megatron's fused QKV GEMM.
    fused = C.gemm_time_s(make_problem("llama3-8b", seq=8192), F.attention_gemms(make_problem("llama3-8b", seq=8192),
                                                                               _batch())[0])
    split = sum(C.gemm_time_s(p, g) for g in F.attention_gemms(p, _batch())[:2])
    assert split[0] > fused[0]


def test_shared_input_is_quantised_once():
    # torchtitan float8: wq, wk, wv read one input, w1 and w3 another; the cast bytes stay those of
    # one input each (the same as the fused GEMMs').
    b = _batch(tp=1, sp=False, dp=8)
    p = make_problem("llama3-8b", seq=8192, framework="torchtitan", precision="fp8", fp8_recipe="tensorwise")
    def cast(g):
        return float(np.asarray(fp8.cast_bytes(p, g.m, g.k, g.count if g.cast_inputs is None else g.cast_inputs,
                                               g.fp8, g.norm_input)).ravel()[0])

    qkv_group, mlp_group = F.attention_gemms(p, b)[:2], F.mlp_gemms(p, b, False)[:1]
    per_element = cast(F.Gemm(8192, 1, 4096)) / (8192 * 4096)
    assert sum(cast(g) for g in qkv_group) == pytest.approx(per_element * 8192 * 4096)
    assert sum(cast(g) for g in mlp_group) == pytest.approx(per_element * 8192 * 4096)


def test_fp8_gemm_reads_one_byte_operands():
    # A memory-bound fp8 GEMM (8192 x 4096 input, 128 output columns) on an H100: inputs and
    # weights at 1 B, the bf16 output at 2 B; no cast (cast_inputs 0).
    p = make_problem("llama3-8b", seq=8192, precision="fp8")
    m, n, k = 8192, 128, 4096
    g = F.Gemm(np.array([m]), np.array([n]), k, cast_inputs=0.0)
    expected = max(2 * m * n * k / (1978.9e12 * 0.56), (1 * (m * k + k * n) + 2 * m * n) / H100_HBM) + T0
    assert C.gemm_time_s(p, g)[0] == pytest.approx(expected)


def test_symmetric_memory_copies_by_hand():
    # tp 8, S = 1 GB bf16, 6 gathers and 2 scatters: 6 x 2 x 1/8 GB + 2 x (1 + 1/8) GB = 3.75 GB.
    b = _batch(tp_comm_overlap=True)
    titan = make_problem("llama3-8b", seq=8192, framework="torchtitan")
    s = tp_overlap.symmetric_memory_copies_s(titan, b, np.array([6.0]), np.array([2.0]), np.array([1e9]))
    assert s[0] == pytest.approx(3.75e9 / H100_HBM)
    # float8 TP gathers fp8 (half the bytes): 6 x 2 x 1/16 + 2.25 = 3.0 GB.
    fp8 = make_problem("llama3-8b", seq=8192, framework="torchtitan", precision="fp8", fp8_recipe="tensorwise",
                       float8_tp_gather=True)
    s8 = tp_overlap.symmetric_memory_copies_s(fp8, b, np.array([6.0]), np.array([2.0]), np.array([1e9]))
    assert s8[0] == pytest.approx(3.0e9 / H100_HBM)
    # Megatron's userbuffers and layouts without the overlap: none.
    assert tp_overlap.symmetric_memory_copies_s(make_problem("llama3-8b", seq=8192), b, np.array([6.0]),
                                                np.array([2.0]), np.array([1e9]))[0] == 0
    off = _batch(tp_comm_overlap=False)
    assert tp_overlap.symmetric_memory_copies_s(titan, off, np.array([6.0]), np.array([2.0]), np.array([1e9]))[0] == 0
