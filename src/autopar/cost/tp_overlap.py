"""Backward tensor-parallel collectives hidden behind the linear layers' own GEMMs.

Megatron-LM (``megatron/core/tensor_parallel/layers.py``
``LinearWithGradAccumulationAndAsyncCommunication``; ``--no-async-tensor-model-parallel-allreduce``
turns it off, on by default since 2021-09; needs ``CUDA_DEVICE_MAX_CONNECTIONS=1`` so the
collective is queued before the GEMM) runs the backward of a column-parallel linear (QKV, FC1) as:

* without SP: launch the all-reduce of the input gradient ``dX = dY W``, then compute the weight
  gradient ``dW = dY^T X`` while it runs;
* with SP (Korthikanti et al. 2022 sec. 4.2.2; Megatron-LM issue #323): launch the all-gather of the
  saved sequence-sharded input ``X``, compute ``dX`` meanwhile, then launch the reduce-scatter of
  ``dX`` and compute ``dW`` meanwhile.

The row-parallel linears' backward collective (SP: the all-gather of ``dY``, the conjugate of the
forward reduce-scatter) has no GEMM to hide behind and stays exposed, as do all forward ones.
Each overlapped collective leaves ``max(collective - GEMM, latency)`` exposed: the GEMM cannot start
before the collective is queued, and the ring's latency steps are launched serially. A GEMM's
data- and weight-gradient halves each take the forward GEMM's FLOPs, so the forward GEMM time is
used for either.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.problem import Problem
from autopar.strategy import LayoutBatch


def overlap_gemms_s(p: Problem, batch: LayoutBatch, moe: bool) -> list[np.ndarray | None]:
    """Forward seconds of the column-parallel GEMM behind each backward TP collective of one layer:
    [QKV, FC1] (arrays over layouts); None where no GEMM hides it: MLA's attention (its
    up-projections read the replicated latent, not the TP-reduced input) and a MoE layer's MLP
    (its input gradient comes back through the token dispatcher, :mod:`autopar.cost.moe`)."""
    qkv = None if p.model.mla else C.gemm_time_s(p, F.attention_gemms(p, batch)[0])
    fc1 = None if moe else C.gemm_time_s(p, F.mlp_gemms(p, batch, moe=False)[0])
    return [qkv, fc1]


def layer_backward_tp_s(p: Problem, batch: LayoutBatch, one_collective_s: np.ndarray,
                        gemms_s: list[np.ndarray | None]) -> np.ndarray:
    """Exposed backward TP seconds of one decoder layer, per micro-batch (arrays over layouts).

    Args:
        one_collective_s: one all-reduce of the layer's ``s/cp * b * h`` activation over tp
            (:func:`autopar.cost.comm.all_reduce_s`); with SP an all-gather or reduce-scatter of
            the same tensor is half of it (ring: ``(g-1)/g`` of the bytes and ``g-1`` latencies).
        gemms_s: per backward collective, the forward time of the GEMM that hides it (None: none).

    Without ``TrainSpec.tp_backward_overlap`` this is ``len(gemms_s)`` collectives, as before.
    """
    n = len(gemms_s)
    if not p.train.tp_backward_overlap:
        return n * one_collective_s
    _, alpha = comm.group_bus_bandwidth(p, batch.tp, 1)
    latency_s = np.where(batch.tp > 1, 2 * (batch.tp - 1) * alpha, 0.0)  # one all-reduce's steps
    half, half_latency = one_collective_s / 2, latency_s / 2
    sp = np.asarray(batch.sp, dtype=bool)
    total = np.zeros_like(one_collective_s)
    for gemm in gemms_s:
        if gemm is None:
            total = total + one_collective_s
            continue
        no_sp = np.maximum(one_collective_s - gemm, latency_s)
        # SP: the dY gather of the row-parallel linear (exposed), the reduce-scatter under dW and
        # the input re-gather under dX.
        with_sp = half + 2 * np.maximum(half - gemm, half_latency)
        total = total + np.where(sp, with_sp, no_sp)
    return np.where(batch.tp > 1, total, 0.0)
