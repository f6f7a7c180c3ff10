"""Sink attention on cuDNN at head dimension 64 (autopar.cost.sink_attention): the ratios recomputed from
the FlashAttention-3 paper's cuDNN figures, and the times they give."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import compute as C
from autopar.cost import sink_attention as S
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem


def test_ratios_are_the_published_cudnn_rates():
    fwd = [a / b for a, b in zip(S.CUDNN_FORWARD_TFLOPS[64], S.CUDNN_FORWARD_TFLOPS[128])]
    bwd = [a / b for a, b in zip(S.CUDNN_BACKWARD_TFLOPS[64], S.CUDNN_BACKWARD_TFLOPS[128])]
    assert np.mean(fwd) == pytest.approx(S.FORWARD_RATE_HD64, abs=5e-4)
    assert np.mean(bwd) == pytest.approx(S.BACKWARD_RATE_HD64, abs=5e-4)
    assert max(abs(r / np.mean(fwd) - 1) for r in fwd) < 0.021


def test_gpt_oss_attention_times_by_hand():
    """1 ms of head-dim-128 forward: 1 / 0.684 = 1.462 ms forward, 2 / 0.836 = 2.392 ms backward,
    i.e. 2.392 - 2 x 1.462 = -0.532 ms beyond twice the forward."""
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    assert S.applies(p)
    forward, extra = S.times_s(p, np.array([1e-3]))
    assert forward[0] == pytest.approx(1e-3 / 0.684)
    assert 2 * forward[0] + extra[0] == pytest.approx(2e-3 / 0.836)


@pytest.mark.parametrize("model, flash", [("qwen3-30b-a3b", True), ("gpt-oss-120b", False)])
def test_unchanged_without_sinks_or_without_fused_attention(model, flash):
    p = make_problem(model, nodes=8, gbs=512, seq=4096, flash_attention=flash)
    assert not S.applies(p)
    forward, extra = S.times_s(p, np.array([1e-3]))
    assert forward[0] == 1e-3 and extra[0] == 0.0


def test_layer_attention_slows_by_the_forward_ratio():
    """The same GPT-OSS layer with and without sinks: the core attention differs by 1 / 0.684."""
    p = make_problem("gpt-oss-120b", nodes=8, gbs=512, seq=4096)
    plain = make_problem(p.model.model_copy(update={"attention_sinks": False}), nodes=8, gbs=512, seq=4096)
    b = LayoutBatch.from_strategy(Strategy(dp=64, tp=1, pp=1, ep=8, mbs=4), 512)
    sink = C.layer_forward_times(p, b, moe=True).attention_s[0]
    assert sink == pytest.approx(C.layer_forward_times(plain, b, moe=True).attention_s[0] / 0.684)
