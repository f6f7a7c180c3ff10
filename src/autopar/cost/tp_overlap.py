"""Tensor-parallel collectives hidden behind GEMMs: Megatron's async backward all-reduce and,
per layout (``Strategy.tp_comm_overlap``), Transformer Engine userbuffers / torchtitan async TP /
MindSpeed MC2.

**Without ``tp_comm_overlap``** Megatron-LM (``megatron/core/tensor_parallel/layers.py``
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

**With ``tp_comm_overlap``** (:func:`comm_overlap_tp_s`, :func:`userbuffer_bytes`) every SP
all-gather and reduce-scatter of a layer is decomposed into ``tp`` chunks pipelined with the chunks
of the GEMM that consumes or produces it (Wang et al., ASPLOS'23, "Overlap communication with
dependent computation via decomposition"). Transformer Engine ``module/base.py`` ``initialize_ub``
(commit d0067d0) pairs them as: forward AG+GEMM ``ring_exchange`` for ``qkv_fprop`` and
``fc1_fprop``, GEMM+RS ``pipeline`` for ``proj_fprop`` and ``fc2_fprop``; backward AG+GEMM
``ring_exchange`` for ``proj_dgrad`` / ``fc2_dgrad`` (the gather of dY) and ``bulk`` overlaps for
``qkv_dgrad``/``qkv_wgrad``/``fc1_dgrad``/``fc1_wgrad`` (the input re-gather under the data-gradient
GEMM, the dX reduce-scatter under the weight-gradient GEMM). Megatron-LM enables it with
``--tp-comm-overlap`` (``arguments.py`` asserts ``sequence_parallel``; ``initialize.py``
``_initialize_tp_communicators``). torchtitan's async TP (``parallelism.enable_async_tensor_parallel``,
needs ``compile``) rewrites the same AG+matmul and matmul+RS pairs into PyTorch's symmetric-memory
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``; MindSpeed's MC2 (``--use-ascend-mc2``,
``features_manager/tensor_parallel/mc2.py``: needs tp > 1 and SP) fuses them in one Ascend kernel.
All three are costed alike: the first of the ``tp`` chunks of each collective and any excess of the
collectives over the layers' GEMMs stay exposed. torchtitan's pass fuses only a reduce-scatter whose
input is one matmul: in the backward graph the input-gradient reduce-scatter of each column-parallel
block (attention's wq/wk/wv, the MLP's w1/w3) receives the *sum* of several matmuls and is left
unfused (PyTorch PR #149946, review of 2025-03-28: "there were only valid scaled_mm-reduce-scatter
patterns in the forward graph, but not in the backward graph ... the reduce-scatters are receiving as
input the addition of various scaled_mms"), so it stays exposed (:func:`unfused_backward_s`); and PyTorch's symmetric-memory implementation of
the fused ops adds device copies on the compute stream that NCCL's collectives do not need (the local
shard into the peer-to-peer buffer, the stacked partial products summed after the reduce-scatter's
pipeline: :func:`symmetric_memory_copies_s`).
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm, float8_tp, placement
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def overlap_gemms_s(p: Problem, batch: LayoutBatch, moe: bool) -> list[np.ndarray | None]:
    """Forward seconds of the column-parallel GEMMs behind each backward TP collective of one layer:
    [QKV (``wq``, ``wk``, ``wv`` where they are separate GEMMs,
    :func:`autopar.cost.flops.separate_projections`), FC1] (arrays over layouts); None where no GEMM
    hides it: MLA's attention (its up-projections read the replicated latent, not the TP-reduced
    input) and a MoE layer's MLP (its input gradient comes back through the token dispatcher,
    :mod:`autopar.cost.moe`)."""
    qkv = None if p.model.mla else sum(C.gemm_time_s(p, g) for g in F.attention_gemms(p, batch)[:-1])
    fc1 = None if moe else C.gemm_time_s(p, F.mlp_gemms(p, batch, moe=False)[0])
    return [qkv, fc1]


def comm_overlap_tp_s(batch: LayoutBatch, tp_s: np.ndarray | list[np.ndarray], gemm_s: np.ndarray | list[np.ndarray],
                      unfused_s: np.ndarray | float = 0.0) -> np.ndarray:
    """Exposed TP seconds of a stage with ``tp_comm_overlap`` (arrays over layouts).

    Args:
        tp_s: the pipelined TP collectives of the stage's micro-batch (forward, backward,
            recompute), as exposed without overlap: one array, or a list of arrays, one per block
            whose GEMMs alone can hide them (:func:`overlap_blocks`).
        gemm_s: the linear-layer GEMM seconds each entry of ``tp_s`` can hide under (forward,
            2x backward, recomputed forward), same form as ``tp_s``.
        unfused_s: TP seconds the framework leaves out of the pipelining
            (:func:`unfused_backward_s`), exposed in full.

    Returns ``unfused + sum_b max(tp_b - gemm_b, 0) + sum_b tp_b / tp``: the excess of each block's
    collectives over its own GEMMs plus the first of the ``tp`` pipelined chunks of each collective
    (it must arrive before the first GEMM chunk runs). Example: tp 4, 10 ms of collectives under
    40 ms of GEMMs: 2.5 ms exposed; with 2 ms more unfused, 2 + 2.5 = 4.5 ms; split as 5 ms under
    5 ms and 5 ms under 35 ms: 2.5 ms; as 5 ms under 2 ms and 5 ms under 38 ms: 3 + 2.5 = 5.5 ms.
    """
    tp_blocks = tp_s if isinstance(tp_s, list) else [tp_s]
    gemm_blocks = gemm_s if isinstance(gemm_s, list) else [gemm_s]
    exposed = unfused_s + sum(np.maximum(c - g, 0.0) + c / batch.tp for c, g in zip(tp_blocks, gemm_blocks))
    return np.asarray(exposed, dtype=np.float64)


def overlap_blocks(p: Problem, batch: LayoutBatch, fused_s: np.ndarray, n_dense: np.ndarray, n_moe: np.ndarray,
                   recomputed: np.ndarray, moe_gemm_s: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split a stage's pipelined TP seconds ``fused_s`` and the GEMMs that hide them into blocks:
    a collective is decomposed with the GEMM that consumes or produces it (Wang et al., ASPLOS'23;
    TE ``initialize_ub`` pairs ``qkv``/``proj`` with the attention's gather/scatter and ``fc1``/``fc2``
    with the MLP's), so the attention's collectives hide only under the QKV and output projections
    and the MLP's under fc1/fc2. A dense layer has one collective pair per block, so each block
    carries half of ``fused_s``; its GEMMs run forward, twice in backward and once more per
    recomputed layer. Llama-3-8B at tp 8 on an H100: the attention's all-gather (the ``s*b*h``
    input, 7/8 of it over NVLink) outlasts the QKV GEMM (768 of 4096 output columns per rank), so
    part of it stays exposed although the whole layer's GEMMs outlast its collectives. A stage
    holding MoE layers keeps one block (their MLP collectives come from the token dispatcher and
    the shared experts, :mod:`autopar.cost.moe`). Returns (collective seconds, GEMM seconds) per
    block, arrays over layouts."""
    passes = 3 * n_dense + recomputed
    attention = sum(C.gemm_time_s(p, g) for g in F.attention_gemms(p, batch))
    mlp = sum(C.gemm_time_s(p, g) for g in F.mlp_gemms(p, batch, moe=False))
    if not p.model.is_moe:
        return [fused_s / 2, fused_s / 2], [passes * attention, passes * mlp]
    return [fused_s], [passes * (attention + mlp) + 3 * n_moe * moe_gemm_s]


def unfused_backward_s(p: Problem, fwd_pairs: np.ndarray, one_collective_s: np.ndarray) -> np.ndarray:
    """TP seconds per micro-batch that torchtitan's async TP leaves exposed: the backward
    input-gradient reduce-scatter of every column-parallel block (module docstring), one per
    forward all-gather/reduce-scatter pair, each half of an all-reduce (``one_collective_s``).
    ``fwd_pairs``: the stage's forward collective pairs (two per dense layer). Zero for
    Megatron-LM (TE userbuffers overlap the ``qkv_dgrad``/``fc1_dgrad`` reduce-scatters in bulk)
    and MindSpeed. Llama-3-8B layer, 1 ms per all-reduce: 2 pairs -> 1 ms exposed."""
    if p.train.framework != "torchtitan":
        return np.zeros_like(one_collective_s)
    return 0.5 * fwd_pairs * one_collective_s


def symmetric_memory_copies_s(p: Problem, batch: LayoutBatch, gathers: np.ndarray, scatters: np.ndarray,
                              act_bytes: np.ndarray) -> np.ndarray:
    """Compute-stream seconds of the HBM copies torchtitan's async TP adds to its fused collectives,
    per micro-batch (0 for Megatron-LM and MindSpeed, and without ``tp_comm_overlap``).

    PyTorch's symmetric-memory ops (``torch/distributed/_symmetric_memory/__init__.py``, 2024-08
    onwards) that the micro-pipeline pass substitutes:

    * ``fused_all_gather_matmul`` (``_pipelined_all_gather_and_consume``): the rank's own shard is
      copied into its peer-to-peer buffer and into its chunk of the gathered output with device
      copies (``copy_shard``/``copy_``), one of them on the compute stream before or after the
      local shard's matmul: ``2 S_ag / tp`` bytes (read + write of one shard; ``S_ag`` the gathered
      tensor at the dtype it travels in, fp8 under float8 TP, :mod:`autopar.cost.float8_tp`);
    * ``fused_matmul_reduce_scatter`` (``_fused_matmul_reduce_scatter_impl``): the ``tp`` partial
      products are pulled into ``stacked_partials`` and summed by one reduction kernel after the
      pipeline (``reduce_fn``, ``torch.sum`` over the rank dimension): it reads all ``tp`` partials
      (``S`` bytes, bf16) and writes the ``S / tp`` shard, on the compute stream, where NCCL's
      reduce-scatter reduces inside its own kernel.

    Args:
        gathers: fused all-gathers per micro-batch (forward, recomputed and the backward gathers of
            ``dY``); scatters: fused reduce-scatters (forward and recomputed).
        act_bytes: the bf16 ``s/cp * b * h`` activation ``S`` of one micro-batch (bytes).

    Example (test): tp 8, S = 1 GB, bf16, 6 gathers and 2 scatters per layer: 6 x 0.25 GB + 2 x
    1.125 GB = 3.75 GB of HBM traffic per layer.
    """
    if p.train.framework != "torchtitan":
        return np.zeros(len(batch))
    t = batch.tp
    gather_bytes = np.where(float8_tp.applies(p, batch), act_bytes * float8_tp.FP8_BYTES / F.BF16, act_bytes)
    copies = gathers * 2 * gather_bytes / t + scatters * act_bytes * (1 + 1 / t)
    return np.where(batch.tp_comm_overlap & (t > 1), C.memory_time_s(p, copies), 0.0)


# Transformer Engine ``initialize_ub`` registers one userbuffer per overlapped GEMM: ring_exchange
# qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline proj_fprop, fc2_fprop; bulk qkv_dgrad, qkv_wgrad,
# fc1_dgrad, fc1_wgrad (module/base.py, methods dict).
USERBUFFERS = 10


def userbuffer_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Bytes per device of Transformer Engine's userbuffers with ``tp_comm_overlap`` (Megatron-LM;
    0 elsewhere and for torchtitan, whose symmetric-memory workspace is not modelled).

    Megatron-LM ``initialize.py`` ``_initialize_tp_communicators`` passes
    ``shape = [seq_length * micro_batch_size / cp, hidden_size]`` to TE ``initialize_ub``; each of
    the :data:`USERBUFFERS` communicators registers one buffer of that shape (``CommOverlap`` /
    ``CommOverlapP2P`` for all-gather: ``buffer_shape[0] * buffer_shape[1]`` elements,
    ``comm_gemm_overlap.cpp``) in the activation dtype (bf16, 2 B). Llama-3-70B, seq 8192, mbs 1,
    cp 1: 10 x 8192 x 8192 x 2 B = 1.25 GiB. Shape ``(n,)``.
    """
    if p.train.framework != "megatron":
        return np.zeros(len(batch))
    per_buffer = F.BF16 * p.train.seq_len * batch.mbs / batch.cp * p.model.hidden_size
    return np.where(batch.tp_comm_overlap, USERBUFFERS * per_buffer, 0.0)


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
    _, alpha = comm.group_bus_bandwidth(p, batch.tp, placement.tp_stride(batch))
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
