"""The routed experts' output bias as Megatron-Core adds it: one small op per local expert.

Models whose experts have biases (GPT-OSS: ``GptOssExperts.down_proj_bias``; autopar's
``ModelSpec.linear_bias`` on a MoE model) run their fc2 bias outside the grouped GEMM in
Megatron-Core (core_v0.15.0, the Megatron-Bridge 25.11 container's ``megatron/core/transformer/
moe/experts.py``): ``TEGroupedMLP`` builds ``linear_fc2`` with ``skip_bias_add=True`` (the bias
must be scaled by each token's routing probability, which the GEMM epilogue cannot do) and
``TEGroupedMLP._apply_bias`` adds it per local expert in Python::

    torch.cat([t + b * p for t, b, p in zip(torch.split(output, tokens_per_expert),
                                            bias_parallel, torch.split(probs, tokens_per_expert))])

The fc1 bias is fused into the GEMM (``skip_bias_add=False``) and costs nothing here.

Per element of the busiest rank's expert output (``rows x h``, bf16 probabilities as the router
emits them without ``--moe-router-dtype``), HBM bytes:

* forward :data:`FORWARD_BYTES_PER_ELEMENT` = 12: ``b * p`` writes a ``rows_e x h`` product (2),
  the add reads both operands and writes (6), ``torch.cat`` copies the pieces (4);
* backward :data:`BACKWARD_BYTES_PER_ELEMENT` = 12: autograd's ``MulBackward0`` forms
  ``grad * p`` (read 2, write 2) and reduces it over the rows for the bias gradient (2), and
  ``grad * b`` (4) reduced over ``h`` for the probability gradient (2); the add and the cat pass
  their gradients through as views.

Kernels: :data:`FORWARD_KERNELS_PER_EXPERT` (mul, add) per local expert and one cat forward;
:data:`BACKWARD_KERNELS_PER_EXPERT` (two products, two reductions) per local expert backward,
each paying :data:`autopar.cost.compute.KERNEL_OVERHEAD_S`. Host: the forward's ops
(:func:`forward_host_ops`, two splits, the per-expert mul and add, the cat) go into
:func:`autopar.cost.host.moe_mlp_ops`; the backward mirrors them (one autograd node per op, as
:mod:`autopar.cost.host` counts every layer).

Units: bytes, kernel and op counts, seconds; arrays over the ``LayoutBatch`` rows.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

FORWARD_BYTES_PER_ELEMENT = 12  # b*p write 2, add read 4 + write 2, cat read 2 + write 2
BACKWARD_BYTES_PER_ELEMENT = 12  # grad*p (4) + row reduction (2), grad*b (4) + h reduction (2)
FORWARD_KERNELS_PER_EXPERT = 2  # b * p, t + (b * p)
BACKWARD_KERNELS_PER_EXPERT = 4  # grad * p, its sum over rows, grad * b, its sum over h
SPLIT_AND_CAT_OPS = 3  # torch.split of the output and of the probabilities, torch.cat


def applies(p: Problem) -> bool:
    """True where the experts' fc2 bias runs as :func:`TEGroupedMLP._apply_bias` does: a MoE
    model with biased linears (``ModelSpec.linear_bias``) trained with Megatron-Core."""
    return p.model.is_moe and p.model.linear_bias and p.train.framework == "megatron"


def local_experts(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Routed experts held by one expert-parallel rank: ``num_experts / ep``."""
    return p.model.num_experts / batch.ep


def output_elements(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Elements of the expert output the bias is added to on the busiest rank per micro-batch:
    ``rows x h`` (:func:`autopar.cost.moe.expert_rows`; the fc2 output is the full hidden size)."""
    return moe_cost.expert_rows(p, batch) * p.model.hidden_size


def forward_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward HBM bytes of the per-expert bias add per MoE layer and micro-batch (0 where it
    does not apply): :data:`FORWARD_BYTES_PER_ELEMENT` per output element."""
    if not applies(p):
        return np.zeros(len(batch))
    return FORWARD_BYTES_PER_ELEMENT * output_elements(p, batch)


def backward_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Backward HBM bytes (0 where it does not apply): :data:`BACKWARD_BYTES_PER_ELEMENT` per
    output element."""
    if not applies(p):
        return np.zeros(len(batch))
    return BACKWARD_BYTES_PER_ELEMENT * output_elements(p, batch)


def forward_kernels(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """GPU kernels of the forward: :data:`FORWARD_KERNELS_PER_EXPERT` per local expert and the
    cat (0 where it does not apply). GPT-OSS-120B at ep 8: 16 local experts, 33 kernels."""
    if not applies(p):
        return np.zeros(len(batch))
    return FORWARD_KERNELS_PER_EXPERT * local_experts(p, batch) + 1


def backward_kernels(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """GPU kernels of the backward: :data:`BACKWARD_KERNELS_PER_EXPERT` per local expert."""
    if not applies(p):
        return np.zeros(len(batch))
    return BACKWARD_KERNELS_PER_EXPERT * local_experts(p, batch)


def forward_host_ops(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Host ops of the forward (0 where it does not apply): the two splits and the cat, and the
    mul and add of every local expert."""
    if not applies(p):
        return np.zeros(len(batch))
    return SPLIT_AND_CAT_OPS + FORWARD_KERNELS_PER_EXPERT * local_experts(p, batch)


def times_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward seconds, backward seconds beyond twice the forward) of the bias add per MoE
    layer and micro-batch: the bytes at the device's memory rate plus a fixed cost per kernel
    (:func:`autopar.cost.compute.memory_time_s`, ``KERNEL_OVERHEAD_S``). The second value is what
    :class:`autopar.cost.compute.LayerTimes` adds to its ``2 x forward`` backward (negative:
    the backward moves as many bytes as the forward, in twice the kernels per expert)."""
    from autopar.cost.compute import KERNEL_OVERHEAD_S, memory_time_s

    forward = memory_time_s(p, forward_bytes(p, batch)) + forward_kernels(p, batch) * KERNEL_OVERHEAD_S
    backward = memory_time_s(p, backward_bytes(p, batch)) + backward_kernels(p, batch) * KERNEL_OVERHEAD_S
    return forward, backward - 2 * forward
