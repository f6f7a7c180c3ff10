"""Backward HBM traffic of a dense layer's element-wise ops (autopar.cost.elementwise_backward) and
of its fp8 output-gradient casts (autopar.cost.fp8_backward), checked by hand."""

import numpy as np
import pytest

from autopar.cost import compute as C
from autopar.cost import elementwise_backward, fp8_backward
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem, toy_model


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=8), **over}), 64)


def test_gelu_layer_backward_bytes_by_hand():
    # LayerNorm/GeLU layer, h 1024, ffn 4096, 1000 tokens, no TP: norms 2 x 3 + residuals 2 x 3 = 12
    # passes of 1000 x 1024, GeLU 3 passes of 1000 x 4096, RoPE as in the forward.
    model = toy_model(hidden_size=1024, num_attention_heads=8, num_kv_heads=8, head_dim=128,
                      ffn_hidden_size=4096, norm="layernorm")
    p = make_problem(model, seq=1000)
    b = _batch()
    rope = F.rope_bytes(p, b)[0]
    assert elementwise_backward.dense_backward_bytes(p, b)[0] == pytest.approx(
        2 * (12 * 1000 * 1024 + 3 * 1000 * 4096) + rope)
    assert F.elementwise_bytes(p, b, False)[0] == pytest.approx(2 * (10 * 1000 * 1024 + 2 * 1000 * 4096) + rope)


def test_swiglu_backward_is_five_thirds_of_its_forward():
    p = make_problem("llama3-8b", seq=8192)
    b = _batch()
    fwd_act = F.activation_pass_bytes(p, F.tokens(p, b), p.model.ffn_hidden_size)[0]
    rest = 2 * 12 * 8192 * 4096 + F.rope_bytes(p, b)[0]
    assert elementwise_backward.dense_backward_bytes(p, b)[0] == pytest.approx(rest + fwd_act * 5 / 3)


def test_dense_backward_is_shorter_than_twice_the_forward_by_the_saved_bytes():
    p = make_problem("llama3-8b", seq=8192)
    b = _batch()
    t = C.layer_forward_times(p, b, moe=False)
    saved = 2 * F.elementwise_bytes(p, b, False) - elementwise_backward.dense_backward_bytes(p, b)
    assert 2 * t.forward_s[0] - t.backward()[0] == pytest.approx(C.memory_time_s(p, saved)[0])


def test_fp8_grad_output_casts_by_hand():
    # Llama-3-8B, 8192 tokens, tp 1, delayed scaling (4 B per element): QKV 6144, fc1 2 x 14336,
    # and the two 4096-wide row-parallel outputs.
    p = make_problem("llama3-8b", seq=8192, precision="fp8")
    b = _batch()
    assert fp8_backward.dense_backward_cast_bytes(p, b)[0] == pytest.approx(4 * 8192 * (6144 + 28672 + 2 * 4096))
    # tp 8 with SP: column outputs / 8; row outputs cast on the 1/8 shard, then an fp8 transpose (2 B).
    b8 = _batch(dp=1, tp=8, sp=True)
    row = 2 * 8192 * 4096
    assert fp8_backward.dense_backward_cast_bytes(p, b8)[0] == pytest.approx(
        4 * 8192 * (6144 + 28672) / 8 + row * (4 / 8 + 2))


def test_fp8_backward_casts_replace_twice_the_forward_casts():
    p = make_problem("llama3-8b", seq=8192, precision="fp8")
    b = _batch()
    gemms = F.attention_gemms(p, b) + F.mlp_gemms(p, b, False)
    fwd = fp8_backward.forward_cast_bytes(p, b, gemms)[0]
    # delayed scaling: QKV and fc1 inputs come cast from the norm; proj (4096) and fc2 (14336) inputs: 4 B
    assert fwd == pytest.approx(4 * 8192 * (4096 + 14336))
    bf16 = make_problem("llama3-8b", seq=8192)
    diff = C.layer_forward_times(p, b, False).backward_extra_s - C.layer_forward_times(bf16, b, False).backward_extra_s
    assert np.asarray(diff)[0] == pytest.approx(C.memory_time_s(p, np.array([
        fp8_backward.dense_backward_cast_bytes(p, b)[0] - 2 * fwd]))[0])


def test_torchtitan_and_bf16_keep_the_default_cast_backward():
    b = _batch()
    for p in (make_problem("llama3-8b", seq=8192), make_problem("llama3-8b", seq=8192, precision="fp8",
                                                                 framework="torchtitan")):
        assert fp8_backward.dense_backward_cast_bytes(p, b)[0] == 0
        assert fp8_backward.forward_cast_bytes(p, b, F.mlp_gemms(p, b, False))[0] == 0
