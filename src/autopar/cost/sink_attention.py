"""Attention with learned sinks runs in cuDNN, whose rate falls with the head dimension.

GPT-OSS adds a learned per-head logit to the softmax denominator (``ModelSpec.attention_sinks``;
Megatron-Core ``softmax_type="learnable"``, Megatron-Bridge ``GPTOSSProvider``). Transformer
Engine v2.9 (``pytorch/attention/dot_product_attention/utils.py``, "Filter: Softmax type")
disables FlashAttention for any ``softmax_type`` but ``vanilla``; FusedAttention (cuDNN's
arbitrary-sequence-length kernels, cuDNN >= 9.13.1 for the sink softmax, ``fused_attn.cpp``)
runs it. So the kernel is cuDNN at the model's head dimension, GPT-OSS's 64.

The device's ``attention_efficiency`` and the block curve of :mod:`autopar.cost.attention` were
derived at head dimension 128. cuDNN's own rates at both head dimensions, from the BF16 figures of
the FlashAttention-3 paper (Shah et al. 2024, arXiv 2407.08608, "Attention forward speed" and
"Attention backward speed", H100 80GB SXM5, cuDNN series) at sequence lengths 4k / 8k / 16k:

* forward: head dim 64: 408 / 412 / 413 TFLOP/s; head dim 128: 609 / 600 / 595;
* backward: head dim 64: 417 / 432 / 433 TFLOP/s; head dim 128: 499 / 518 / 516.

The ratios (64 over 128) average :data:`FORWARD_RATE_HD64` = 0.684 and
:data:`BACKWARD_RATE_HD64` = 0.836 (each within 2.1% of every length's). With sinks at head
dimension 64 the forward time is divided by the first and the backward by the second; other head
dimensions are left as they are (no published cuDNN pair for them). The ratios are H100
measurements; autopar applies them on every device (on Blackwell the tensor cores grow more than
the exponential units, so head dimension 64 is unlikely to fare better there).
"""

from __future__ import annotations

import numpy as np

from autopar.problem import Problem

# FlashAttention-3 paper, cuDNN BF16 TFLOP/s on H100 at 4k, 8k, 16k tokens (module docstring).
CUDNN_FORWARD_TFLOPS = {64: (408.0, 412.0, 413.0), 128: (609.0, 600.0, 595.0)}
CUDNN_BACKWARD_TFLOPS = {64: (417.0, 432.0, 433.0), 128: (499.0, 518.0, 516.0)}
FORWARD_RATE_HD64 = 0.684  # mean of 408/609, 412/600, 413/595
BACKWARD_RATE_HD64 = 0.836  # mean of 417/499, 432/518, 433/516


def applies(p: Problem) -> bool:
    """True for fused attention with sinks at head dimension 64 (module docstring)."""
    m = p.model
    return p.train.flash_attention and m.attention_sinks and m.attention_head_dim == 64


def times_s(p: Problem, forward_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward seconds, backward seconds beyond twice the forward) of fused core attention whose
    head-dimension-128 forward time is ``forward_s`` (backward twice that): unchanged, ``(forward_s,
    0)``, unless :func:`applies`; then ``forward_s / FORWARD_RATE_HD64`` and a backward of
    ``2 forward_s / BACKWARD_RATE_HD64``, returned as its excess over twice the new forward, the
    form :class:`autopar.cost.compute.LayerTimes` takes."""
    forward_s = np.asarray(forward_s, dtype=np.float64)
    if not applies(p):
        return forward_s, np.zeros_like(forward_s)
    forward = forward_s / FORWARD_RATE_HD64
    backward = 2.0 * forward_s / BACKWARD_RATE_HD64
    return forward, backward - 2.0 * forward
