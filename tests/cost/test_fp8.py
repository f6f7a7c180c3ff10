"""fp8 training: case C-11 (memory), fp8 only for linear GEMMs, devices without fp8."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost import fp8
from autopar.cost.stage import all_stages
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.strategy import Strategy
from conftest import make_problem

C11 = Strategy(dp=8, zero=1)


def test_c11_fp8_costs_a_weight_copy_and_its_transpose():
    bf16 = estimate(make_problem("llama2-7b", gbs=64, seq=4096), C11)
    p8 = make_problem("llama2-7b", gbs=64, seq=4096, precision="fp8")
    batch, stages = all_stages(p8, C11)
    assert fp8.linear_params(p8, batch, stages)[0] == 32 * (4 * 4096**2 + 3 * 4096 * 11008) == 6_476_005_376
    e8 = estimate(p8, C11)
    # + delayed-scaling state: 32 layers x 4 linear modules x 3 tensors x (1024 amax + 2) x fp32.
    scaling = 32 * 4 * 3 * 1026 * 4
    # Transformer Engine keeps each linear input as its 1-byte fp8 copy: per token and layer the
    # QKV input (-h), the fc1 input (-h) and the fc2 input (-ffn) lose a byte per element, the
    # output projection keeps a 1-byte copy beside the bf16 flash output (+h): -(4096 + 11008) B.
    saved = 32 * 4096 * (4096 + 11008)
    assert saved == 1_979_711_488
    assert e8.memory_per_stage[0].weights_bytes - bf16.memory_per_stage[0].weights_bytes == pytest.approx(
        2 * 6_476_005_376 + scaling)
    assert e8.peak_memory_bytes - bf16.peak_memory_bytes == pytest.approx(2 * 6_476_005_376 + scaling - saved)
    stored = estimate(make_problem("llama2-7b", gbs=64, seq=4096, precision="fp8", fp8_param_storage=True), C11)
    assert stored.peak_memory_bytes - bf16.peak_memory_bytes == pytest.approx(scaling - saved)


def test_fp8_speeds_up_linear_layers_only():
    s = Strategy(dp=8, zero=1)
    bf16 = estimate(make_problem("llama2-7b", gbs=64, seq=4096), s).time_breakdown_s["compute"]
    f8 = estimate(make_problem("llama2-7b", gbs=64, seq=4096, precision="fp8"), s).time_breakdown_s["compute"]
    # Linear GEMMs are most of the compute: faster, but not 2x (attention, output layer, casts).
    assert 0.5 * bf16 < f8 < 0.85 * bf16


def test_fp8_on_a100_is_a_clear_error():
    p = make_problem("llama2-7b", device="a100-80gb", gbs=64, seq=4096, precision="fp8")
    with pytest.raises(AutoparError, match=r"--precision=fp8: device a100-80gb has no fp8 peak"):
        estimate(p, C11)


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), zero=st.integers(0, 1),
       mbs=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "selective", "full"]),
       storage=st.booleans(), model=st.sampled_from(["llama2-7b", "qwen3-30b-a3b"]))
def test_fp8_weights_never_below_and_activations_never_above_bf16(tp, pp, zero, mbs, recompute, storage, model):
    dp = 8 // (tp * pp)
    if dp < 1:
        return
    ep = 2 if model == "qwen3-30b-a3b" and tp == 1 else 1
    if model == "qwen3-30b-a3b" and tp > 4:
        return  # 4 KV heads
    s = Strategy(dp=dp, tp=tp, pp=pp, ep=ep, mbs=mbs, zero=zero, sp=tp > 1, recompute=recompute)
    storage = storage and zero >= 1  # Megatron: --fp8-param-gather needs the distributed optimizer
    bf16 = estimate(make_problem(model, gbs=64, seq=2048), s)
    f8 = estimate(make_problem(model, gbs=64, seq=2048, precision="fp8", fp8_param_storage=storage), s)
    for a, b in zip(bf16.memory_per_stage, f8.memory_per_stage):
        assert b.weights_bytes >= a.weights_bytes  # fp8 + transpose (2 B) or the bf16 weight + both copies
        assert b.activations_bytes <= a.activations_bytes  # 1-byte linear inputs (TE)


def _one_gemm_s(p, m, n, k, linear=True):
    import numpy as np

    from autopar.cost import compute
    from autopar.cost.flops import Gemm

    return float(compute.gemm_time_s(p, Gemm(np.array([m]), np.array([n]), np.array([k]), fp8=linear))[0])


def test_fp8_gemm_runs_at_the_devices_fp8_fraction_plus_its_input_cast():
    p = make_problem("llama2-7b", precision="fp8")
    dev = p.cluster.device
    assert (dev.gemm_efficiency, dev.fp8_gemm_efficiency) == (0.64, 0.56)  # devices.json, H100 SXM
    # 8192^3 linear GEMM: 2*8192^3 FLOP at 0.56 x 1,978.9 TFLOP/s, + 4 us launch, + cast_transpose
    # of the 8192 x 8192 input (read 2 B, write 1 B + 1 B) at 0.7 x 3.35 TB/s.
    by_hand = 2 * 8192**3 / (0.56 * 1978.9e12) + 4e-6 + 4 * 8192**2 / (0.7 * 3.35e12)
    assert _one_gemm_s(p, 8192, 8192, 8192) == pytest.approx(by_hand)
    # Not a linear layer (router, output layer): bf16 peak at the bf16 fraction, no cast.
    assert _one_gemm_s(p, 8192, 8192, 8192, linear=False) == pytest.approx(2 * 8192**3 / (0.64 * 989.4e12) + 4e-6)


def test_fp8_fraction_defaults_to_the_bf16_fraction_when_a_device_file_omits_it():
    from autopar.problem import Problem
    from autopar.specs import load_device, make_cluster

    p = make_problem("llama2-7b", precision="fp8")
    bare = load_device("h100-80gb").model_copy(update={"fp8_gemm_efficiency": None})
    q = Problem(p.model, make_cluster(bare, 1, 8), p.train)
    assert fp8.gemm_efficiency(q, True) == 0.64 and fp8.gemm_efficiency(p, True) == 0.56
    assert fp8.gemm_efficiency(p, False) == 0.64
