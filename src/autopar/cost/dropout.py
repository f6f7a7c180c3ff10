"""Time of dropout during training (``ModelSpec.dropout``): the attention dropout inside a fused
attention kernel.

**Attention dropout in fused attention.** FlashAttention-2 (``flash_fwd_kernel.h``, the kernel
Transformer Engine runs with ``NVTE_FLASH_ATTN=1``) and cuDNN's fused attention draw the
dropout mask inside the kernel from a Philox generator (``philox.cuh``: one call gives 128 random
bits, 8 bits per mask element), once in forward and again in backward to rebuild the same mask:
integer work on the CUDA cores per score element, next to the tensor-core GEMMs. Measured on the
same kernels with and without ``p_dropout`` (Dao-AILab/flash-attention PR #2597, 2026-05, FA4 and
cuDNN 9.24 on GB200, bf16, 16 heads, 32k tokens per batch, "fwd ~ 75-85%, bwd ~ 60-70% of no-drop
TFLOPS"): forward at :data:`FUSED_FWD_RATE` and backward at :data:`FUSED_BWD_RATE` of the
dropout-free rate (midpoints of those ranges; FA2's own dropout path is the one FA4 copies "bit-
identical", so the same integer work per element). Unfused attention already costs its dropout
pass (:func:`autopar.cost.flops.unfused_softmax_bytes`).

The hidden dropout of the residual adds (Megatron-Core's jit-fused ``bias_dropout_add``) adds a
1-byte keep mask to a memory-bound pass that is not costed separately here.

Units: seconds per micro-batch and layer, arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.problem import Problem

FUSED_FWD_RATE = 0.80  # fraction of the dropout-free forward rate (flash-attention PR #2597: 75-85%)
FUSED_BWD_RATE = 0.65  # fraction of the dropout-free backward rate (same PR: 60-70%)


def fused_attention_times_s(p: Problem, forward_s: np.ndarray,
                            backward_extra_s: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray | float]:
    """(forward seconds, backward seconds beyond twice the forward) of fused attention whose
    dropout-free kernels take ``forward_s`` forward and ``2 forward_s + backward_extra_s`` backward
    (:func:`autopar.cost.sink_attention.times_s` gives both): with dropout the forward runs at
    :data:`FUSED_FWD_RATE` and the backward at :data:`FUSED_BWD_RATE` of those. Example (test): 1 ms
    without dropout -> 1.25 ms forward and 2 / 0.65 = 3.077 ms backward, i.e. 3.077 - 2.5 = 0.577
    ms beyond twice the forward. Without dropout: ``(forward_s, backward_extra_s)``."""
    if not p.model.dropout:
        return forward_s, backward_extra_s
    forward = forward_s / FUSED_FWD_RATE
    return forward, (2 * forward_s + backward_extra_s) / FUSED_BWD_RATE - 2 * forward
