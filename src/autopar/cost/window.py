"""Sliding-window attention (GPT-OSS: every other layer sees the last 128 keys) in FLOPs and time.

A causal window layer of ``w`` keys over a sequence of ``s`` tokens: query ``i`` attends to
``min(i + 1, w)`` keys, so the score and value products cost ``s*w - w*(w-1)/2`` key rows per
head instead of the full causal ``s*(s+1)/2``; autopar's causal count is ``s^2/2``
(:func:`autopar.cost.flops.attention_core_flops`), so a window layer costs the fraction
:func:`window_key_fraction` of a full layer (``(2 s w - w^2) / s^2`` for ``s >= w``; 1 for
``s <= w``). The model's layers mix both kinds; every stage is costed with the model's mean
(:func:`mean_key_fraction`; GPT-OSS alternates them, so a stage differs from the mean by at
most one layer). The flash kernel's rate follows its keys per query row
(:func:`autopar.cost.attention.kernel_efficiency` at ``w - w^2/(2 s)`` mean keys for a window
layer): :func:`mixed_block_efficiency`. FlashAttention and Transformer Engine skip the tiles
outside the window (``window_size=(w, 0)``), so this is what runs; the attention sinks
(GPT-OSS's learned per-head logit added to the softmax denominator) add one element per row
and are not counted. Activations are unchanged: flash attention keeps no score matrix.

Units: fractions (dimensionless). Shapes: arrays broadcast with the ``LayoutBatch`` columns.
"""

from __future__ import annotations

import numpy as np

from autopar.specs.model import ModelSpec


def window_key_fraction(window: int, seq_len) -> np.ndarray:
    """Score/value FLOPs of one causal window layer over those of a full causal layer (module
    docstring). Example: w = 128, s = 4096: (2 x 4096 x 128 - 128^2) / 4096^2 = 0.0615."""
    s = np.asarray(seq_len, dtype=np.float64)
    return np.where(s > window, (2.0 * s * window - float(window) ** 2) / s**2, 1.0)


def mean_key_fraction(m: ModelSpec, seq_len) -> np.ndarray:
    """Mean over the model's layers of the attention FLOPs relative to full causal attention:
    ``1 - share + share * window_key_fraction``. GPT-OSS at 4096 tokens: 0.5 + 0.5 x 0.0615 = 0.531."""
    share = m.window_layer_share
    if not share:
        return np.ones(np.shape(seq_len))
    return 1.0 - share + share * window_key_fraction(m.sliding_window, seq_len)


def mixed_block_efficiency(m: ModelSpec, seq_len, full_efficiency) -> np.ndarray:
    """Kernel efficiency of the mean layer: the FLOP-weighted harmonic mean of the full layers'
    ``full_efficiency`` and the window layers' (at ``w - w^2/(2 s)`` keys per row, causal), so
    that ``flops_mean / efficiency`` is the mean of each kind's ``flops / efficiency``."""
    from autopar.cost.attention import kernel_efficiency

    share = m.window_layer_share
    if not share:
        return np.asarray(full_efficiency, dtype=np.float64)
    s = np.asarray(seq_len, dtype=np.float64)
    w = float(m.sliding_window)
    window_keys = np.where(s > w, w - w * w / (2.0 * s), s / 2.0)
    window_eff = kernel_efficiency(window_keys, True)
    full_flops, window_flops = 1.0 - share, share * window_key_fraction(m.sliding_window, s)
    return (full_flops + window_flops) / (full_flops / full_efficiency + window_flops / window_eff)
