"""Framework-specific memory (autopar.cost.framework_memory): every number derived by hand in
the comments from the framework sources cited in the module docstring."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import framework_memory as fw
from autopar.cost.memory import model_state_bytes, stage_memory
from autopar.cost.stage import Stages
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem

# torchtitan Table 1 layout: Llama-3-8B, FSDP over 8 ranks, local batch 2, seq 8192.
TT_SAC = Strategy(dp=8, tp=1, pp=1, mbs=2, zero=3, recompute="selective")
TOKENS = 2 * 8192  # 16384 tokens per micro-batch
LLAMA8B_LAYER = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000


def _titan(seq: int = 8192, gbs: int = 16, **train):
    return make_problem("llama3-8b", device="h100-96gb-500w", gbs=gbs, seq=seq, framework="torchtitan", **train)


def _batch(p, s: Strategy) -> LayoutBatch:
    return LayoutBatch.from_strategy(s, p.train.global_batch_size)


def test_op_sac_saves_odd_matmuls_sdpa_and_layer_input():
    p = _titan()
    # layer input 4096, wq 4096, wv 1024, SDPA out 4096, w1 14336, w2 (7th mm) 4096 bf16 elements
    # per token, plus SDPA's fp32 log-sum-exp over 32 heads: 2 * 31744 + 4 * 32 = 63616 B/token.
    got = fw.op_sac_layer_bytes(p, _batch(p, TT_SAC))[0]
    assert got == pytest.approx(63616 * TOKENS)  # 1.042e9 B, vs 139392 B/token for Megatron selective


def test_op_sac_with_tp2_and_sequence_parallel():
    p = _titan()
    s = Strategy(dp=4, tp=2, pp=1, mbs=2, zero=3, sp=True, recompute="selective")
    # input 4096/2, wq 4096/2, wv 1024/2, w1 14336/2, SDPA 4096/2, w2 partial sum 4096 (not split),
    # two reduce-scatter outputs 2 * 4096/2: 22016 elements; log-sum-exp 4 * 32/2 = 64 B.
    assert fw.op_sac_layer_bytes(p, _batch(p, s))[0] == pytest.approx((2 * 22016 + 64) * TOKENS)


def test_torchtitan_loss_holds_twelve_bytes_per_fp32_logit():
    p = _titan()
    # final-norm + output-layer inputs 2 * 2 * n * h, then 12 * n * V (V = 128256, unpadded).
    expected = 4 * TOKENS * 4096 + 12 * TOKENS * 128256  # 0.27e9 + 25.2e9
    assert fw.output_bytes(p, _batch(p, TT_SAC))[0] == pytest.approx(expected)
    # loss parallel (tp 8) splits the logits over the vocabulary; SP splits the two inputs
    s = Strategy(dp=1, tp=8, pp=1, mbs=2, zero=3, sp=True, recompute="full")
    assert fw.output_bytes(p, _batch(p, s))[0] == pytest.approx(expected / 8)


def test_megatron_output_and_selective_unchanged():
    p = make_problem("llama3-8b", gbs=16, seq=8192)
    s = Strategy(dp=8, tp=1, pp=1, mbs=2, zero=1, recompute="selective")
    # Megatron theoretical_memory_usage.py: fp32 logits 4 * n * V_padded (128256 pads to itself)
    assert fw.output_bytes(p, _batch(p, s))[0] == pytest.approx(4 * TOKENS * 4096 + 4 * TOKENS * 128256)
    assert not fw.op_sac(p) and fw.op_sac(_titan())


@pytest.mark.parametrize("framework, precision, zero, expected", [
    ("megatron", "bf16", 1, 2 + 4 + 12 / 8),  # Megatron distributed optimizer, 7.5 B/param
    ("deepspeed", "bf16", 1, 2 + 2 + 4 + 12 / 8),  # BF16_Optimizer: bf16 grads + full fp32 buffer
    ("deepspeed", "fp16", 1, 2 + 2 + 12 / 8),  # DeepSpeedZeroOptimizer, 16-bit grads
    ("deepspeed", "bf16", 2, 2 + (2 + 12) / 8),  # ZeRO-2: no BF16_Optimizer, grads sharded
    ("torchtitan", "bf16", 3, (4 + 4 + 8) / 8),  # FSDP2: fp32 param, fp32 grad, Adam m+v
])
def test_state_bytes_per_parameter(framework, precision, zero, expected):
    p = make_problem("llama3-8b", gbs=16, seq=8192, framework=framework, precision=precision)
    w, g, full, o = fw.state_bytes_per_param(p, zero)
    assert sum(model_state_bytes(1.0, 8, zero, w, g, o, full)) == pytest.approx(expected)


def test_torchtitan_gathers_two_blocks_and_the_root_module():
    p = _titan()
    batch = _batch(p, TT_SAC)
    first = last = np.array([True])
    # two bf16 blocks 2 * 2 * 218.1e6 plus the untied embedding and output, 2 * 2 * 128256 * 4096
    expected = 4 * LLAMA8B_LAYER + 4 * 128256 * 4096
    assert fw.unsharded_param_bytes(p, batch, LLAMA8B_LAYER, first, last)[0] == pytest.approx(expected)
    megatron = make_problem("llama3-8b", gbs=16, seq=8192)
    assert fw.unsharded_param_bytes(megatron, batch, LLAMA8B_LAYER, first, last)[0] == pytest.approx(
        4 * LLAMA8B_LAYER)


def test_torchtitan_stage_activations_by_hand():
    p = _titan()
    est = estimate(p, TT_SAC)
    stage = est.memory_per_stage[0]
    # 32 SAC layers x 1 micro-batch in flight + the loss + the int64 token ids (8 B/token)
    expected = 32 * 63616 * TOKENS + 4 * TOKENS * 4096 + 12 * TOKENS * 128256 + 8 * TOKENS
    assert stage.activations_bytes == pytest.approx(expected)
    # fp32 params + grads + Adam over 8 ranks: 16 B / 8 = 2 B per parameter
    states = stage.weights_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert states == pytest.approx(2 * stage.params)


def test_deepspeed_allocator_reserve_is_a_fraction_of_live_tensors():
    s = Strategy(dp=8, tp=1, pp=1, mbs=1, zero=1, recompute="full")
    for framework, fraction in (("deepspeed", fw.DEEPSPEED_ALLOCATOR_RESERVE_FRACTION), ("megatron", 0.0),
                                ("torchtitan", 0.0)):
        p = make_problem("llama3-8b", gbs=16, seq=2048, framework=framework)
        batch = _batch(p, s)
        mem = stage_memory(p, batch, Stages(np.array([0]), np.array([0]), np.array([32])))
        tensors = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.activations_bytes
        reserve = mem.other_bytes - p.cluster.device.framework_overhead_bytes
        assert reserve[0] == pytest.approx(fraction * tensors[0])
    assert fw.allocator_reserve_bytes(p, 40.0) == 0.0
    assert fw.DEEPSPEED_ALLOCATOR_RESERVE_FRACTION == pytest.approx(0.30)


def test_torchtitan_loss_peak_and_recompute_do_not_overlap():
    titan, megatron = _titan(), make_problem("llama3-8b", gbs=16, seq=8192)
    working, output = np.array([4.0, 9.0]), np.array([6.0, 2.0])
    assert fw.backward_transient_bytes(titan, working, output).tolist() == [6.0, 9.0]
    assert fw.backward_transient_bytes(megatron, working, output).tolist() == [10.0, 11.0]
