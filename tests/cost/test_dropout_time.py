"""Attention dropout inside fused attention (autopar.cost.dropout): the kernel rates of the
flash-attention dropout measurements, checked by hand, and what it changes in a layer."""

import numpy as np
import pytest

from autopar.cost import compute as C
from autopar.cost import dropout
from autopar.layout_batch import LayoutBatch
from autopar.specs import load_model
from autopar.strategy import Strategy
from conftest import make_problem


def _problem(with_dropout: bool, **train):
    model = load_model("llama3-8b").model_copy(update={"dropout": with_dropout})
    return make_problem(model, seq=8192, **train)


def test_dropout_rates_from_the_flash_attention_measurements():
    # 1 ms dropout-free forward: forward at 0.80 of the rate -> 1.25 ms; backward (2 ms without
    # dropout) at 0.65 -> 3.0769 ms, i.e. 0.5769 ms beyond twice the 1.25 ms forward.
    fwd, extra = dropout.fused_attention_times_s(_problem(True), np.array([1e-3]))
    assert fwd[0] == pytest.approx(1.25e-3)
    assert extra[0] == pytest.approx(2e-3 / 0.65 - 2.5e-3)
    assert 2 * fwd[0] + extra[0] == pytest.approx(3.0769e-3, rel=1e-4)


def test_no_dropout_leaves_the_kernel_alone():
    fwd, extra = dropout.fused_attention_times_s(_problem(False), np.array([1e-3]))
    assert fwd[0] == 1e-3 and extra == 0.0


def test_a_layer_with_dropout_pays_only_its_attention():
    batch = LayoutBatch.from_strategy(Strategy(dp=8), 64)
    on = C.layer_forward_times(_problem(True), batch, moe=False)
    off = C.layer_forward_times(_problem(False), batch, moe=False)
    assert on.gemm_s[0] == off.gemm_s[0] and on.elementwise_s[0] == off.elementwise_s[0]
    assert on.attention_s[0] == pytest.approx(off.attention_s[0] / 0.8)
    assert on.backward()[0] - off.backward()[0] == pytest.approx(2 * off.attention_s[0] * (1 / 0.65 - 1))


def test_unfused_attention_keeps_its_own_dropout_pass():
    # Unfused attention costs dropout as a memory pass (flops.unfused_softmax_bytes), not by the rates.
    batch = LayoutBatch.from_strategy(Strategy(dp=8), 64)
    p = _problem(True, flash_attention=False)
    fwd, _ = C.core_attention_times_s(p, batch)
    fwd_off, _ = C.core_attention_times_s(_problem(False, flash_attention=False), batch)
    assert fwd[0] > fwd_off[0]
    assert fwd[0] != pytest.approx(fwd_off[0] / 0.8)


def test_dropout_scales_a_kernel_whose_backward_is_not_twice_its_forward():
    # A kernel with 1 ms forward and 2 + 0.5 ms backward (e.g. sink attention's rates): with dropout
    # 1.25 ms forward and 2.5 / 0.65 = 3.846 ms backward, 3.846 - 2.5 beyond twice the forward.
    fwd, extra = dropout.fused_attention_times_s(_problem(True), np.array([1e-3]), np.array([0.5e-3]))
    assert fwd[0] == pytest.approx(1.25e-3)
    assert 2 * fwd[0] + extra[0] == pytest.approx(2.5e-3 / 0.65)
    assert dropout.fused_attention_times_s(_problem(False), np.array([1e-3]), 0.5e-3)[1] == 0.5e-3
