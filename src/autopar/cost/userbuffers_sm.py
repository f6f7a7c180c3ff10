"""GEMM seconds lost to the SMs Transformer Engine's userbuffers kernels take under Megatron's
``--tp-comm-overlap`` (``Strategy.tp_comm_overlap`` with ``TrainSpec.framework`` megatron).

Userbuffers overlap a TP collective with a GEMM by running the collective as a kernel beside it
(:mod:`autopar.specs.userbuffers`: per GEMM a ``method``, ``num_sm``, ``set_sm_margin``; TE
``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp``):

* ``ring_exchange``: copy-engine peer-to-peer copies; the GEMM keeps every SM (unless
  ``set_sm_margin``: then ``sm_count - num_sm``, as below);
* ``pipeline`` (``split_overlap_rs``) and ``bulk`` (``bulk_overlap``): every GEMM launch gets
  ``_math_sms`` as cuBLAS's SM-count target, ``sm_count - num_sm`` with ``set_sm_margin``
  (:func:`gemm_with_comm_s`: the GEMM at ``(sm_count - num_sm) / sm_count`` of the tensor-core
  peak throughout); without it ``sm_count``, and the communication kernel, launched first, holds
  ``num_sm`` SMs while it runs: the GEMM runs on the others for the collective's duration ``c``
  and on all of them after it, ``t + c * num_sm / sm_count`` (work conserved), never more than the
  GEMM on ``sm_count - num_sm`` SMs throughout (a collective outlasting it).

Which GEMMs (TE ``initialize_ub`` pairing, :mod:`autopar.cost.tp_overlap`): per dense layer the
forward of the output projection and fc2 (their reduce-scatters), the data- and weight-gradient
GEMMs of QKV and fc1 (the input re-gather and the input-gradient reduce-scatter). Each collective
is half of the layer's all-gather + reduce-scatter pair. A MoE layer has only its attention's
(Megatron's expert GEMMs are grouped GEMMs without userbuffers); MLA attention has none (its
projections are not TE's fused ``linear_qkv``). A GEMM's data- and weight-gradient halves each
take the forward GEMM's FLOPs (:mod:`autopar.cost.stage_time`).

Example (test): Llama-3-70B at tp 4 on an H100 (132 SMs), ``proj_fprop`` pipeline with 24 SMs and
``set_sm_margin``: the 8192 x 8192 x 2048-per-rank GEMM runs at 108/132 of the peak.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs.userbuffers import UbGemm


def may_apply(p: Problem) -> bool:
    """Whether any layout of ``p`` can run its TP collectives as userbuffers kernels: Megatron-LM on a
    GPU whose SM count is known (``DeviceSpec.sm_count``); not on Ascend, whose TP overlap is
    MindSpeed's MC2, not Transformer Engine's userbuffers.

    Raises:
        AutoparError: an ``sm_count`` no larger than the SMs a userbuffers kernel takes (``num_sm``).
    """
    device = p.cluster.device
    if p.train.framework != "megatron" or device.sm_count is None or device.vendor == "huawei":
        return False
    ub = p.train.userbuffers
    most = max(getattr(ub, name).num_sm for name in type(ub).model_fields)
    if device.sm_count <= most:
        raise AutoparError(f"sm_count={device.sm_count} (device {device.name}, --device-set or --device-file): Transformer Engine's userbuffers "
                           f"kernels take {most} SMs for --tp-comm-overlap; allowed more than {most} (an H100 SXM "
                           "has 132)")
    return True


def applies(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Rows whose TP collectives run as userbuffers kernels: :func:`may_apply`, with ``tp_comm_overlap``
    and tp > 1. Shape ``(n,)``."""
    if not may_apply(p):
        return np.zeros(len(batch), dtype=bool)
    return np.asarray(batch.tp_comm_overlap, dtype=bool) & (batch.tp > 1)


def gemm_with_comm_s(p: Problem, g: F.Gemm, gemm_s: np.ndarray, ub: UbGemm, comm_s: np.ndarray) -> np.ndarray:
    """Seconds of GEMM ``g`` (``gemm_s`` on every SM) while its userbuffers collective of
    ``comm_s`` seconds runs with setting ``ub`` (module docstring). Example: 132 SMs, 16 taken,
    a 10 ms compute-bound GEMM: 11.38 ms with ``set_sm_margin``; without it, under a 4 ms
    collective, 10 + 4 x 16/132 = 10.48 ms."""
    if ub.num_sm == 0:
        return gemm_s
    sms = p.cluster.device.sm_count
    fewer = C.gemm_time_s(p, g, sm_fraction=max(sms - ub.num_sm, 1) / sms)
    if ub.set_sm_margin:
        return fewer
    return np.minimum(gemm_s + comm_s * ub.num_sm / sms, np.maximum(fewer, gemm_s))


def layer_extra_s(p: Problem, batch: LayoutBatch, pair_s: np.ndarray, moe: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds one decoder layer's GEMMs lose to the userbuffers kernels, per
    micro-batch (arrays over layouts; 0 where :func:`applies` is false).

    Args:
        pair_s: the layer's all-gather + reduce-scatter pair of the ``s/cp * b * h`` activation
            (one all-reduce's time); each overlapped collective is half of it.
        moe: a MoE layer (only its attention's GEMMs count, module docstring).
    """
    zero = np.zeros(len(batch))
    on = applies(p, batch)  # no early return where no row applies: every call reads the same columns
    ub = p.train.userbuffers
    one = pair_s / 2

    def lost(g: F.Gemm, cfg: UbGemm) -> np.ndarray:
        t = C.gemm_time_s(p, g)
        return gemm_with_comm_s(p, g, t, cfg, one) - t

    forward, backward = zero, zero
    if not p.model.mla:
        attention = F.attention_gemms(p, batch)
        qkv, proj = attention[0], attention[-1]
        forward = forward + lost(proj, ub.proj_fprop)
        backward = backward + lost(qkv, ub.qkv_dgrad) + lost(qkv, ub.qkv_wgrad)
    if not moe:
        fc1, fc2 = F.mlp_gemms(p, batch, moe=False)[:2]
        forward = forward + lost(fc2, ub.fc2_fprop)
        backward = backward + lost(fc1, ub.fc1_dgrad) + lost(fc1, ub.fc1_wgrad)
    return np.where(on, forward, 0.0), np.where(on, backward, 0.0)
