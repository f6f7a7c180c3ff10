"""FP8 row padding of the routed experts' grouped GEMM: a copy of the token copies in and out.

FP8 GEMMs need each expert's row count aligned (16 rows, 32 for MXFP8), so Megatron-Core's
``TEGroupedMLP`` (core_v0.15.0 ``megatron/core/transformer/moe/experts.py``, the Megatron-Bridge
25.11 container) wraps the experts in Transformer Engine's ``Fp8Padding`` / ``Fp8Unpadding``
whenever fp8 is on: the permuted hidden states and the routing probabilities are padded before
fc1 and the fc2 output is unpadded after it. TE v2.9 ``pytorch/module/fp8_padding.py`` returns
the input untouched when every count is already aligned and otherwise copies the whole tensor
(``tex.fused_multi_row_padding`` into a new buffer, one kernel); its backward runs the inverse
copy (``fused_multi_row_unpadding``). The padded rows themselves (under 16 or 32 per expert) are
negligible next to the copies and not counted. Routed counts are aligned only by chance: forced balance
draws random router scores (``moe_router_force_load_balancing``), and Megatron-Bridge's MoE
recipes leave ``moe_router_padding_for_fp8`` (which pads in the router instead) off (not set in
v0.2.0), so autopar charges the copies on every fp8 MoE layer run by Megatron-LM unless the run
sets ``MoeRuntime.router_padding_for_fp8`` (``--moe-router-padding-for-fp8``): then every count
arrives aligned and ``Fp8Padding`` returns its input untouched.

Per element of the busiest rank's expert rows (``rows x h``, bf16): forward
:data:`FORWARD_BYTES_PER_ELEMENT` = 8 (pad the input: read 2 + write 2; unpad the output: 4),
backward the same 8 (unpad the input gradient, pad the output gradient); the probabilities
(one value per row) are left out. Kernels: :data:`KERNELS_PER_PASS` per pass (input,
probabilities, output), each with :data:`autopar.cost.compute.KERNEL_OVERHEAD_S`.

Units: bytes, kernels, seconds; arrays over the ``LayoutBatch`` rows.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

FORWARD_BYTES_PER_ELEMENT = 8  # pad input (read 2 + write 2), unpad output (read 2 + write 2)
BACKWARD_BYTES_PER_ELEMENT = 8  # unpad the input gradient, pad the output gradient
KERNELS_PER_PASS = 3  # hidden states, probabilities, fc2 output (TE fused_multi_row_(un)padding)


def applies(p: Problem) -> bool:
    """True for a MoE model trained in fp8 with Megatron-Core whose router does not pad the
    counts itself (module docstring)."""
    return (p.model.is_moe and p.train.precision == "fp8" and p.train.framework == "megatron"
            and not p.train.moe.router_padding_for_fp8)


def times_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward seconds, backward seconds beyond twice the forward) of the padding copies per MoE
    layer and micro-batch; zeros where they do not apply. The bytes are
    :data:`FORWARD_BYTES_PER_ELEMENT` / :data:`BACKWARD_BYTES_PER_ELEMENT` per element of the
    ``rows x h`` expert input (:func:`autopar.cost.moe.expert_rows`) at the device's memory rate,
    plus :data:`KERNELS_PER_PASS` kernel overheads per pass; the second value is what
    :class:`autopar.cost.compute.LayerTimes` adds to its ``2 x forward`` backward (here
    ``-forward``: the backward copies as much as the forward)."""
    from autopar.cost.compute import KERNEL_OVERHEAD_S, memory_time_s

    if not applies(p):
        zero = np.zeros(len(batch))
        return zero, zero
    elements = moe_cost.expert_rows(p, batch) * p.model.hidden_size
    forward = memory_time_s(p, FORWARD_BYTES_PER_ELEMENT * elements) + KERNELS_PER_PASS * KERNEL_OVERHEAD_S
    backward = memory_time_s(p, BACKWARD_BYTES_PER_ELEMENT * elements) + KERNELS_PER_PASS * KERNEL_OVERHEAD_S
    return forward, backward - 2 * forward
