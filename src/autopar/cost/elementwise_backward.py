"""HBM traffic of the backward pass of a dense layer's element-wise ops.

autopar costs a layer's backward as twice its forward (:class:`autopar.cost.compute.LayerTimes`),
which holds for GEMMs (data- and weight-gradient GEMM per forward GEMM) but not for the
memory-bound element-wise ops of :func:`autopar.cost.flops.elementwise_bytes`, whose backward
kernels move a fixed number of tensors each (PyTorch autograd formulas,
``tools/autograd/derivatives.yaml``; Apex / Transformer Engine fused norm kernels):

* norm (LayerNorm / RMSNorm): forward reads ``x`` and writes ``y`` (2 passes); backward reads
  ``x`` and ``dy`` and writes ``dx`` (3 passes; the weight-gradient partial sums are per block,
  negligible): 1.5x;
* residual add: forward reads two tensors and writes one (3 passes); backward has no kernel of
  its own (the gradient of a sum is passed to both inputs), but the two gradients meeting at the
  branch point are summed once (read 2, write 1): 1x;
* rotary embedding on q and k: backward applies the inverse rotation to ``dq``/``dk``, the same
  read and write: 1x;
* MLP activation: GeLU / ReLU forward reads ``x`` and writes ``y`` (2 passes), backward reads ``x``
  and ``dy`` and writes ``dx`` (3): 1.5x; SwiGLU forward reads gate and up and writes the product
  (3), backward reads gate, up and ``dy`` and writes both input gradients (5): 5/3.

So a dense layer's element-wise backward moves :func:`dense_backward_bytes`, less than the twice
the forward the default backward would charge. MoE layers (routing, permutation: their own model)
keep the default. Units: bytes per layer and micro-batch, arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

NORM_PASSES = (2, 3)  # (forward, backward) tensor passes of a norm
RESIDUAL_PASSES = (3, 3)  # residual add / gradient sum at the branch point
GELU_PASSES = (2, 3)
SWIGLU_PASSES = (3, 5)
RESIDUALS_PER_LAYER = 2


def dense_backward_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Backward HBM bytes of a dense layer's element-wise ops (module docstring), bf16, on the SP
    shard where :func:`autopar.cost.flops.elementwise_bytes` puts them. Example (test): GPT-style
    layer (LayerNorm, GeLU), ``h = 1024``, ``ffn = 4096``, 1000 tokens, no TP: norms 2 x 3 + residuals
    2 x 3 = 12 passes of ``1000 x 1024``, GeLU 3 passes of ``1000 x 4096``: 2 B x (12 x 1.024e6 +
    3 x 4.096e6) = 49.152 MB, against twice the forward's 2 B x (10 x 1.024e6 + 2 x 4.096e6) x 2 =
    73.728 MB."""
    m, t = p.model, batch.tp
    n_seq = F.tokens(p, batch) / np.where(batch.sp, t, 1)
    passes = m.norms_per_layer * NORM_PASSES[1] + RESIDUALS_PER_LAYER * RESIDUAL_PASSES[1]
    act_fwd, act_bwd = SWIGLU_PASSES if m.gated_mlp else GELU_PASSES
    activation = F.activation_pass_bytes(p, F.tokens(p, batch), m.ffn_hidden_size / t) * act_bwd / act_fwd
    return F.BF16 * passes * n_seq * m.hidden_size + F.rope_bytes(p, batch) + activation
