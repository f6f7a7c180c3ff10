"""The routed experts' grouped GEMM (autopar.cost.grouped_gemm): tile padding and the short-reduction
curve fitted to DeepGEMM's published H800 table, and its effect on narrow experts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autopar.cost import flops as F
from autopar.cost import grouped_gemm as G
from autopar.cost.compute import gemm_time_s
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem

# DeepGEMM README, "Normal GEMMs for dense models", M = 4096, FP8 on H800 (peak 1979 TFLOP/s): k -> TFLOP/s.
DEEPGEMM_M4096 = {512: 590, 1536: 990, 2048: 1025, 7168: 1304, 16384: 1358}


def test_padded_rows_round_up_to_the_m_tile():
    assert list(G.padded_rows(np.array([0, 1, 128, 129, 512]))) == [0, 128, 128, 256, 512]


@pytest.mark.parametrize("k, tflops", sorted(DEEPGEMM_M4096.items()))
def test_reduction_curve_reproduces_deepgemm_within_3_percent(k, tflops):
    """0.72 * 1979 * k / (k + K0) with K0 = 717 (the module's fit) against each published point."""
    model = 0.72 * 1979 * k / (k + G.K_OVERHEAD)
    assert model == pytest.approx(tflops, rel=0.03)


def test_slowdown_by_hand_for_the_narrow_experts_of_the_issue():
    """(k + 717) / k * 8192 / 8909 = 1.778 at Qwen3-30B-A3B's fc2 (k = 768), 1.241 at its fc1
    (k = 2048), 1.148 for GPT-OSS (k = 2880); 1 from the reference length up."""
    ratio = G.K_REFERENCE / (G.K_REFERENCE + G.K_OVERHEAD)
    assert G.reduction_slowdown(768) == pytest.approx(1485 / 768 * ratio)
    assert G.reduction_slowdown(768) == pytest.approx(1.778, abs=1e-3)
    assert G.reduction_slowdown(2048) == pytest.approx(1.241, abs=1e-3)
    assert G.reduction_slowdown(2880) == pytest.approx(1.148, abs=1e-3)
    assert G.reduction_slowdown(8192) == pytest.approx(1.0)
    assert G.reduction_slowdown(65536) == 1.0


@given(st.integers(1, 1 << 20), st.integers(1, 1 << 20))
def test_slowdown_never_grows_with_the_reduction(k1, k2):
    lo, hi = sorted((k1, k2))
    assert G.reduction_slowdown(lo) >= G.reduction_slowdown(hi) >= 1.0


def test_expert_gemm_time_by_hand():
    """16 experts of 1000 rows (padded to 1024), n = 1536, k = 768 on H100 bf16: tiled FLOPs over the
    achievable rate, times the k = 768 slowdown; the operands' HBM read and write is below it."""
    p = make_problem("qwen3-30b-a3b")
    dev = p.cluster.device
    rate = dev.peak("bf16") * dev.gemm_efficiency
    expected = 2.0 * 1024 * 1536 * 768 * 16 / rate * G.reduction_slowdown(768)
    memory = 2 * (1000 * 768 + 768 * 1536 + 1000 * 1536) * 16 / (dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency)
    assert memory < expected
    g = F.Gemm(np.array([1000.0]), np.array([1536.0]), np.array([768.0]), 16, grouped=True, expert=True)
    assert gemm_time_s(p, g)[0] == pytest.approx(expected + 4e-6)


def test_narrow_experts_run_below_dense_speed():
    """Qwen3-30B-A3B's experts (2048 x 768) take longer per FLOP than a dense GEMM of the same FLOPs."""
    p = make_problem("qwen3-30b-a3b")
    batch = LayoutBatch.from_strategy(Strategy(dp=8, ep=8), 64)
    experts = [g for g in F.mlp_gemms(p, batch, True) if g.expert]
    dense = [F.Gemm(g.m * g.count, g.n, g.k) for g in experts]  # the same FLOPs as one tall GEMM
    assert sum(gemm_time_s(p, g) for g in experts)[0] > 1.2 * sum(gemm_time_s(p, g) for g in dense)[0]
