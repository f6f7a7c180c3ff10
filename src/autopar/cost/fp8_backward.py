"""fp8 quantisation in the backward pass of a dense layer: the output gradients (Transformer Engine).

The forward pass quantises each linear layer's *input* (:func:`autopar.cost.fp8.cast_bytes`); the
backward pass quantises each linear layer's *output gradient* ``dY``, which both its data-gradient
GEMM (``dY W``) and its weight-gradient GEMM (``dY^T X``) read in fp8 (E5M2 under the hybrid
format). Transformer Engine ``module/base.py`` ``grad_output_preprocess``: a column-parallel
linear (QKV, fc1) casts its local ``dY`` with ``cast_transpose`` (the recipe's
:func:`autopar.cost.fp8_recipe.cast_bytes_per_element` per element: delayed scaling reads bf16 and
writes fp8 and its transpose, 4 B); a row-parallel linear (attention output projection, fc2) with
sequence parallelism casts the ``dY`` shard it receives, gathers it in fp8 and transposes the
gathered tensor (``fp8_transpose``: :data:`FP8_TRANSPOSE_BYTES`), without sequence parallelism it
casts the full ``dY``. So the backward casts scale with the GEMMs' *output* widths, not with twice
the forward casts (which a norm-fused input cast even makes zero): :func:`dense_backward_cast_bytes`
replaces them. Megatron-LM only: torchtitan's float8 casts follow torchao's own path
(:mod:`autopar.cost.float8_tp`) and keep the default backward.

Units: bytes per layer and micro-batch, arrays over layouts. Dense layers only (MoE layers keep
the default backward).
"""

from __future__ import annotations

import numpy as np

from autopar.cost import flops as F
from autopar.cost import fp8, fp8_recipe
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

FP8_TRANSPOSE_BYTES = 2  # read and write one fp8 byte per element


def applies(p: Problem) -> bool:
    """fp8 training under Megatron-LM (Transformer Engine)."""
    return p.train.precision == "fp8" and p.train.framework == "megatron"


def dense_backward_cast_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """HBM bytes of a dense layer's backward ``dY`` quantisation (module docstring), per rank; 0
    where :func:`applies` is false. With ``c`` the recipe's bytes per quantised element and ``n``
    the micro-batch's tokens on the rank: ``c * n * ((q + 2 kv) + up * ffn) / tp`` for QKV and fc1,
    and for the two row-parallel outputs of ``n * h`` elements each ``c / tp + 2`` bytes per element
    with sequence parallelism (cast on the shard, fp8 transpose after the gather), ``c`` without.

    Example (test): Llama-3-8B, 8192 tokens, tp 1, delayed scaling (c = 4): 4 B x 8192 x (6144 +
    28672 + 2 x 4096) = 1.409 GB."""
    if not applies(p):
        return np.zeros(len(batch))
    fp8.gemm_precision(p, True)  # refuses a recipe the device cannot run
    c = fp8_recipe.cast_bytes_per_element(p.train.effective_fp8_recipe)
    m, n, t = p.model, F.tokens(p, batch), batch.tp
    up = 2 if m.gated_mlp else 1
    column = n * ((m.q_width + 2 * m.kv_width) + up * m.ffn_hidden_size) / t
    row_full = 2 * n * m.hidden_size
    sharded = np.asarray(batch.sp, dtype=bool) & (t > 1)
    row = np.where(sharded, c * row_full / t + FP8_TRANSPOSE_BYTES * row_full, c * row_full)
    return c * column + row


def forward_cast_bytes(p: Problem, batch: LayoutBatch, gemms: list[F.Gemm]) -> np.ndarray:
    """HBM bytes of the forward input casts of ``gemms`` (:func:`autopar.cost.fp8.cast_bytes`), the
    part of :func:`autopar.cost.compute.gemm_time_s` the default 2x-forward backward doubles; 0
    where :func:`applies` is false (the default backward stays)."""
    if not applies(p):
        return np.zeros(len(batch))
    return sum(np.broadcast_to(fp8.cast_bytes(p, g.m, g.k, g.count if g.cast_inputs is None else g.cast_inputs, g.fp8,
                                                  g.norm_input), (len(batch),))
               for g in gemms)
