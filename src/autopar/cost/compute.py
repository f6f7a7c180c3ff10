"""Operator time on one device: a roofline with a fixed per-kernel cost.

``time = max(flops / (peak * gemm_efficiency), bytes / (hbm_bw * memory_efficiency)) + t0``

The roofline (Williams et al., CACM 2009) makes small or skinny GEMMs memory-bound; ``t0``
(:data:`KERNEL_OVERHEAD_S`) models launch latency and wave/tile quantisation tails, so the
achieved efficiency falls for small shapes as measured in NVIDIA's "GPU Performance
Background" guide (a 1024^3 bf16 GEMM reaches about half of a 8192^3 one). Flash attention uses
the device's ``attention_efficiency`` (fused kernels); unfused attention its batched GEMMs on the
roofline plus the softmax/dropout passes (:func:`core_attention_times_s`); element-wise ops the
memory roofline only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.cost import attention as attn
from autopar.cost import (
    dropout,
    elementwise_backward,
    fp8,
    fp8_backward,
    grouped_gemm,
    moe_dispatch,
    moe_expert_bias,
    moe_fp8_padding,
    sink_attention,
    window,
)
from autopar.cost import flops as F
from autopar.cost.hooks import installed
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

BF16_BYTES = F.BF16  # bytes per operand element of :attr:`autopar.cost.flops.Gemm.bytes`
#: Bytes per input and weight element of a quantised GEMM, which reads its operands in the recipe's
#: format and writes a bf16 output (Transformer Engine / torchao ``torch._scaled_mm``: float8_e4m3 /
#: e5m2 operands, 1 B; NVFP4: 4-bit values, 0.5 B, block scales not counted).
LOW_PRECISION_OPERAND_BYTES = {"fp8": 1.0, "fp4": 0.5}
KERNEL_OVERHEAD_S = 4e-6  # per kernel: launch + tail effects (H100/A100 measurements, order 2-6 us)


def gemm_time_s(p: Problem, g: F.Gemm, sm_fraction: float = 1.0) -> np.ndarray:
    """Seconds for the GEMMs ``g`` on one device (on ``sm_fraction`` of its SMs: the tensor-core
    peak scales with the SMs, HBM bandwidth does not; :mod:`autopar.cost.userbuffers_sm`).

    Linear layers use the fp8 peak under fp8 training, plus their input quantisation
    (:mod:`autopar.cost.fp8`; none where the norm before them writes the fp8 input, ``g.norm_input``,
    and once for GEMMs that share one input, ``g.cast_inputs``); their memory roofline reads the
    quantised inputs and weights (:data:`LOW_PRECISION_OPERAND_BYTES`) and writes a bf16 output.
    A grouped GEMM is one kernel whose rows are padded to the M tile
    (:data:`autopar.cost.grouped_gemm.TILE_ROWS`), so few rows per group waste the tensor cores,
    and whose operands are all read once (the memory roofline); the routed experts' grouped GEMM
    (``g.expert``) also pays the short-reduction cost of
    :func:`autopar.cost.grouped_gemm.expert_gemm_flops_s`.
    """
    dev = p.cluster.device
    precision = fp8.gemm_precision(p, g.fp8)
    peak = dev.peak(precision) * fp8.gemm_efficiency(p, g.fp8) * sm_fraction
    mem = dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency
    cast_bytes = fp8.cast_bytes(p, g.m, g.k, g.count if g.cast_inputs is None else g.cast_inputs, g.fp8, g.norm_input)
    if precision in LOW_PRECISION_OPERAND_BYTES:  # quantised inputs and weights, bf16 output
        in_bytes = LOW_PRECISION_OPERAND_BYTES[precision]
        g_bytes = (in_bytes * (g.m * g.k + g.k * g.n) + BF16_BYTES * g.m * g.n) * g.count
    else:
        g_bytes = g.bytes
    if not g.expert and not g.grouped and isinstance(g.count, float) and g.count == 1.0 \
            and isinstance(cast_bytes, float) and cast_bytes == 0.0:
        # One plain GEMM and no cast: the general line below without its ``/ 1.0``, ``* 1.0`` and
        # ``+ 0.0`` (IEEE identities, so the same bits) - most GEMMs of a search, at a third fewer array passes.
        return np.maximum(2.0 * g.m * g.n * g.k / peak, g_bytes / mem) + KERNEL_OVERHEAD_S
    cast_s = memory_time_s(p, cast_bytes)
    if g.expert:
        flops_s = grouped_gemm.expert_gemm_flops_s(g.m, g.n, g.k, g.count, peak)
        return np.maximum(flops_s, g_bytes / mem) + KERNEL_OVERHEAD_S + cast_s
    if g.grouped:
        tiled_flops = 2.0 * grouped_gemm.padded_rows(g.m) * g.n * g.k * g.count
        return np.maximum(tiled_flops / peak, g_bytes / mem) + KERNEL_OVERHEAD_S + cast_s
    per_gemm = np.maximum(g.flops / g.count / peak, g_bytes / g.count / mem) + KERNEL_OVERHEAD_S
    return per_gemm * g.count + cast_s


def memory_time_s(p: Problem, num_bytes: np.ndarray) -> np.ndarray:
    """Seconds to stream ``num_bytes`` through HBM at the achievable bandwidth."""
    dev = p.cluster.device
    return num_bytes / (dev.hbm_bandwidth_bytes_per_s * dev.memory_efficiency)


def attention_time_s(p: Problem, flops: np.ndarray, block_efficiency: np.ndarray | float = 1.0) -> np.ndarray:
    """Seconds for fused attention of ``flops`` (bf16 even under fp8 training), at the device's
    long-sequence ``attention_efficiency`` times ``block_efficiency`` (short query/key blocks,
    :func:`autopar.cost.attention.block_efficiency`)."""
    dev = p.cluster.device
    return flops / (dev.peak("bf16") * dev.attention_efficiency * block_efficiency) + KERNEL_OVERHEAD_S


def core_attention_times_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray | float]:
    """(forward seconds, backward seconds beyond 2x forward) of one layer's core attention.

    Flash attention: :func:`attention_time_s` of the causal FLOPs; its backward is 2x forward
    (slower forward and backward with attention dropout, :func:`autopar.cost.dropout.fused_attention_times_s`).
    Unfused attention (Megatron ``dot_product_attention.py``): the two batched GEMMs over the full
    score matrix on the GEMM roofline (:func:`autopar.cost.flops.unfused_attention_gemms`; with a
    ``head_dim`` inner dimension they are near the memory ridge), plus the softmax and dropout
    passes over the scores (:func:`autopar.cost.flops.unfused_softmax_bytes`, one kernel each).
    Backward: the GEMMs twice (dgrad of both operands), the softmax/dropout backward passes
    instead of twice the forward ones. The forward part is what selective recompute repeats.
    """
    if p.train.flash_attention:
        efficiency = window.mixed_block_efficiency(p.model, p.train.seq_len, attn.block_efficiency(p, batch))
        # With attention sinks the kernel is cuDNN at the model's head dimension (autopar.cost.sink_attention);
        # attention dropout slows both passes (autopar.cost.dropout).
        return dropout.fused_attention_times_s(
            p, *sink_attention.times_s(p, attention_time_s(p, F.attention_core_flops(p, batch), efficiency)))
    fwd_bytes, bwd_bytes = F.unfused_softmax_bytes(p, batch)
    kernels = 2 if p.model.dropout else 1
    bmm_s = sum(gemm_time_s(p, g) for g in F.unfused_attention_gemms(p, batch))
    forward_s = bmm_s + memory_time_s(p, fwd_bytes) + kernels * KERNEL_OVERHEAD_S
    return forward_s, memory_time_s(p, bwd_bytes) - 2 * memory_time_s(p, fwd_bytes)


# Measured operator and layer times (``autopar.profile.provider.ProfileTimes``) override the
# roofline while installed with :func:`use_op_times`; None (the default) is the analytic model.
_OP_TIMES: ContextVar[Any] = ContextVar("autopar_op_times", default=None)


def use_op_times(provider: Any) -> AbstractContextManager[None]:
    """Cost with ``provider``'s measured operator times inside the ``with`` block."""
    return installed(_OP_TIMES, provider)


@dataclass
class LayerTimes:
    """Forward seconds of one layer for one micro-batch, split for recompute accounting;
    ``backward_s``: measured backward seconds, None for the analytic 2x forward plus
    ``backward_extra_s`` (unfused attention: its softmax/dropout backward passes less twice
    their forward ones, :func:`autopar.cost.flops.unfused_softmax_bytes`)."""

    gemm_s: np.ndarray
    attention_s: np.ndarray
    elementwise_s: np.ndarray
    backward_s: np.ndarray | None = None
    backward_extra_s: np.ndarray | float = 0.0
    mlp_gemm_s: tuple | None = None  # analytic seconds of each GEMM of F.mlp_gemms, in order (None: not kept)

    @property
    def forward_s(self) -> np.ndarray:
        return self.gemm_s + self.attention_s + self.elementwise_s

    def backward(self) -> np.ndarray:
        return 2 * self.forward_s + self.backward_extra_s if self.backward_s is None else self.backward_s


def layer_forward_times(p: Problem, batch: LayoutBatch, moe: bool) -> LayerTimes:
    """Forward compute of one decoder layer (dense or MoE) on one device, one micro-batch; a dense
    layer's element-wise backward as :func:`autopar.cost.elementwise_backward.dense_backward_bytes`
    (in ``backward_extra_s``); the MLP block's per-GEMM seconds kept in ``mlp_gemm_s`` (the analytic
    times; :func:`autopar.cost.moe_dispatch.expert_compute_s` reads them instead of costing again)."""
    attention_gemms, mlp_gemms = F.attention_gemms(p, batch), F.mlp_gemms(p, batch, moe)
    gemms = attention_gemms + mlp_gemms
    each_s = [gemm_time_s(p, g) for g in gemms]
    gemm_s = sum(each_s)
    router_s = moe_dispatch.extra_kernels(p) * KERNEL_OVERHEAD_S if moe else 0.0  # routing, permutation
    attention_s, backward_extra_s = core_attention_times_s(p, batch)
    elementwise_fwd_bytes = F.elementwise_bytes(p, batch, moe)
    if not moe:  # element-wise and fp8-cast backward kernels: their own bytes, not twice the forward's
        backward_extra_s = backward_extra_s + memory_time_s(
            p, elementwise_backward.dense_backward_bytes(p, batch) - 2 * elementwise_fwd_bytes
            + fp8_backward.dense_backward_cast_bytes(p, batch) - 2 * fp8_backward.forward_cast_bytes(p, batch, gemms))
    # Megatron-Core's expert-side copies: the per-expert fc2 bias and the fp8 row padding.
    bias_s, bias_backward_extra_s = moe_expert_bias.times_s(p, batch) if moe else (0.0, 0.0)
    pad_s, pad_backward_extra_s = moe_fp8_padding.times_s(p, batch) if moe else (0.0, 0.0)
    times = LayerTimes(
        gemm_s=gemm_s,
        attention_s=attention_s,
        elementwise_s=memory_time_s(p, elementwise_fwd_bytes) + router_s + bias_s + pad_s,
        backward_extra_s=backward_extra_s + bias_backward_extra_s + pad_backward_extra_s,
        mlp_gemm_s=tuple(each_s[len(attention_gemms):]),
    )
    provider = _OP_TIMES.get()
    return times if provider is None else provider.layer(p, batch, moe, times)


def output_forward_time_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Output layer GEMM and the cross-entropy loss on the last stage (forward)."""
    analytic = gemm_time_s(p, F.logits_gemm(p, batch)) + memory_time_s(p, F.loss_bytes(p, batch))
    provider = _OP_TIMES.get()
    return analytic if provider is None else provider.output(p, batch, analytic)


def embedding_forward_time_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Embedding lookup on the first stage (a gather of mbs*s/cp rows of h)."""
    return memory_time_s(p, 2 * F.BF16 * F.tokens(p, batch) * p.model.hidden_size) + KERNEL_OVERHEAD_S
