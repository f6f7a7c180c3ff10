"""Fused attention: kernel efficiency by block length, and the per-step costs of ring CP.

**Block length.** A flash-attention kernel (FlashAttention-2/3, cuDNN fused attention) walks
the keys of one 128-row query tile; loading the tile, the online-softmax rescaling and writing
the output and its log-sum-exp cost about as much as a fixed number of keys, so its efficiency
is ``L / (L + L0)`` of the long-sequence rate, with ``L`` the mean keys per query row. Fitted
to the H100 forward curves of the FlashAttention-3 paper (Shah et al. 2024, Fig. "Attention
forward speed, head dim 128 (H100 80GB SXM5)", sequence 512..16k at 16k tokens per batch),
least squares over the training-relevant 1k..16k points (rate and ``L0`` free, residuals
within 2%): causal FA2 260/298/319/333/335 TFLOP/s -> ``L0 = 164`` keys with ``L = s/2``, cuDNN
410..539 -> 174 (FA3 258); non-causal FA2 350..370 -> ``L0 = 65`` with ``L = s`` (cuDNN 42; the
causal value adds the half-masked diagonal tiles). autopar uses 170 (causal) and 60
(non-causal). The device's ``attention_efficiency`` is the long-block rate (the curves'
asymptote is 3% above their 16k point).

**Ring CP** (Megatron-Core / TransformerEngine ``cp_comm_type=p2p``,
``AttnFuncWithCPAndKVP2P``; PyTorch ``context_parallel``, ``_templated_ring_attention``,
used by torchtitan): with load balancing (2 cp chunks per rank, on by default in both) the
attention of one rank runs as ``cp`` kernels of equal work: step 0 causal over the local
``s/cp`` tokens, steps 1..cp-1 non-causal on a (s/cp) x (s/2cp) chunk pair; on the slowest
rank every step has ``s/(2 cp)`` keys per query row, the same mean as causal attention over
``s/cp`` tokens. After each step the partial output is merged into the running output with
the log-sum-exp correction (an element-wise pass), and in backward each step's dQ and dK/dV
are accumulated; those passes are :func:`ring_merge_bytes`.

**How K/V travel** (:func:`ring_exposed_s`). Megatron/TE send the next K/V block to the ring
neighbour while the current step runs, so only a step's excess over its kernel is exposed.
PyTorch's ring (``_ContextParallelOptions.rotate_method`` defaults to ``ALL_GATHER``,
``_AllGatherRotater``, 2024-12 through 2025) gathers every rank's K/V in ONE all-gather issued
at step 0 and waited for at step 1: only step 0's kernel (``1/cp`` of the attention) hides it,
in forward and again in backward (a second all-gather); its dK/dV still travel step by step
(``ALL_TO_ALL`` rotater, ``permute_tensor``), each hidden under one backward step.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

ROW_OVERHEAD_KEYS_CAUSAL = 170.0  # FA3 paper H100 causal forward curves, 1k..16k (FA2 164, cuDNN 174), see module doc
ROW_OVERHEAD_KEYS_FULL = 60.0  # same figure, non-causal, 1k..16k (FA2 65, cuDNN 42)

# Bytes of HBM traffic per element and ring step (derivations in ring_merge_bytes).
TE_FWD_MERGE_BYTES = 6  # read step output + accumulator (bf16), write accumulator: one jit-fused kernel
TE_BWD_ACCUM_BYTES = 6  # dq.add_(dq_) / dkv.add_(dkv_) in bf16
TORCH_FWD_KV_CAT_BYTES = 4  # torch.cat([k, v]) into the send buffer: read + write bf16
TORCH_FWD_MERGE_BYTES = 38  # _SDPAMerger in fp32: .to(fp32) 6, out - block 12, sigmoid(.) * (.) 8, out - (.) 12
TORCH_BWD_KV_BYTES = 22  # K/V cat 4, fp32 dK/dV += bf16 10, cat of the fp32 dK/dV send buffer 8
TORCH_BWD_Q_BYTES = 10  # fp32 dQ += bf16 dQ_ per step


def ring_steps(batch: LayoutBatch) -> np.ndarray:
    """Ranks of the p2p ring of each layout, i.e. attention kernels per layer: ``cp`` for ``p2p``,
    ``cp / cp_a2a`` for ``a2a+p2p`` (the ring runs over the all-to-all groups), 1 for ``a2a`` and
    ``allgather`` (one kernel over the whole sequence; :mod:`autopar.cost.cp_comm`). Shape ``(n,)``."""
    whole = batch.cp_comm_is("a2a") | batch.cp_comm_is("allgather")
    return np.where(whole, 1, batch.cp // np.maximum(batch.cp_a2a, 1))


def kernel_efficiency(mean_keys: np.ndarray, causal: bool) -> np.ndarray:
    """Fraction of the long-sequence attention rate at ``mean_keys`` keys per query row.

    ``L / (L + L0)`` with ``L0`` :data:`ROW_OVERHEAD_KEYS_CAUSAL` or :data:`ROW_OVERHEAD_KEYS_FULL`
    (see the module doc for the fit). Example: causal attention over 4096 tokens (L = 2048)
    runs at 2048 / 2218 = 0.923 of the long-block rate, 0.943 of the 16k one (8192 / 8362);
    FA2 measured 319 / 335 = 0.952.
    """
    overhead = ROW_OVERHEAD_KEYS_CAUSAL if causal else ROW_OVERHEAD_KEYS_FULL
    keys = np.asarray(mean_keys, dtype=float)
    return keys / (keys + overhead)


def block_efficiency(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Per layout: the attention rate relative to long blocks (1 for unfused attention).

    cp = 1: one causal kernel with ``s/2`` keys per query row. cp > 1: ``r`` = :func:`ring_steps`
    ring steps of equal work with ``s/(2 r)`` keys per row (one causal, r-1 non-causal); the time is
    the sum of the steps, i.e. the harmonic mean of their efficiencies (``a2a`` / ``allgather``:
    r = 1, the whole sequence's keys per kernel). Unfused attention
    (``flash_attention=False``: bmm + softmax + bmm) is costed by its GEMM shapes, not by this.
    """
    cp = np.asarray(ring_steps(batch), dtype=float)
    if not p.train.flash_attention:
        return np.ones_like(cp)
    keys = p.train.seq_len / (2.0 * cp)
    causal, full = kernel_efficiency(keys, True), kernel_efficiency(keys, False)
    return cp / (1.0 / causal + (cp - 1.0) / full)


def ring_kv_width(p: Problem) -> int:
    """Elements per token of the K and V that travel around the CP ring (before the tp split).

    MHA/GQA: ``2 * kv_width``, as Megatron/TE exchange the grouped heads. torchtitan (2024-12,
    ``models/llama/model.py``) calls ``repeat_kv`` before ``F.scaled_dot_product_attention``, so
    its ring carries K and V at the query head count: ``2 * q_width``. MLA: per-head K (nope +
    rope) and V after the up-projection.
    """
    m = p.model
    if m.mla:
        return m.num_attention_heads * (m.attention_head_dim + m.v_head_dim)
    if p.train.framework == "torchtitan":
        return 2 * m.q_width
    return 2 * m.kv_width


def ring_merge_bytes(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) HBM bytes per layer and micro-batch of the ring's per-step passes.

    Zero for a ring of one (:func:`ring_steps`; ``cp`` below is its size). Per device
    ``E_o = tokens * v_width / tp`` output elements and ``E_kv = tokens * ring_kv_width / tp`` K+V
    elements (after an all-to-all a rank holds ``cp_a2a`` times the tokens and ``1/cp_a2a`` of the
    heads: the same counts).

    * Megatron/TE (``flash_attn_fwd_out_correction``, jit-fused; ``dq.add_`` / ``dkv.add_``):
      forward ``cp-1`` corrections of 6 B per output element; backward ``cp`` accumulations of
      6 B per dQ and per dK/dV element.
    * torchtitan / PyTorch ``_templated_ring_attention`` (eager, ``convert_to_f32=True``):
      forward per step ``cat`` of K/V into the send buffer (4 B per element) and the fp32
      ``_SDPAMerger`` (38 B per output element); backward per step the K/V ``cat`` (4 B), fp32
      dK/dV accumulation (10 B) and their fp32 send buffer (8 B), and the fp32 dQ accumulation
      (10 B per element).
    """
    m, n, t = p.model, F.tokens(p, batch), batch.tp
    e_out = n * m.v_width / t
    e_kv = n * ring_kv_width(p) / t
    e_q = n * m.q_width / t
    steps = np.asarray(ring_steps(batch), dtype=float)
    if p.train.framework == "torchtitan":
        fwd = (steps - 1) * (TORCH_FWD_KV_CAT_BYTES * e_kv + TORCH_FWD_MERGE_BYTES * e_out)
        bwd = steps * (TORCH_BWD_KV_BYTES * e_kv + TORCH_BWD_Q_BYTES * e_q)
    else:
        fwd = (steps - 1) * TE_FWD_MERGE_BYTES * e_out
        bwd = steps * TE_BWD_ACCUM_BYTES * (e_q + e_kv)
    on = steps > 1
    return np.where(on, fwd, 0.0), np.where(on, bwd, 0.0)


def ring_grad_bytes_per_element(p: Problem) -> int:
    """Bytes per dK/dV element on the backward ring: bf16 in TE, fp32 in PyTorch's ring
    (``convert_to_f32``: the accumulators are sent as they are)."""
    return 4 if p.train.framework == "torchtitan" else 2


def ring_exposed_s(p: Problem, batch: LayoutBatch, attention_fwd_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of ring K/V traffic left exposed, per layer and micro-batch.

    Args:
        attention_fwd_s: forward seconds of the layer's whole core attention on one rank (all
            ``cp`` steps); each step's kernel takes ``1/cp`` of it forward, ``2/cp`` backward.

    ``kv`` = one rank's K/V block (``tokens * ring_kv_width / tp`` bf16 elements) sent to the
    neighbour (:func:`autopar.cost.comm.send_recv_s`), ``dkv`` the same block's gradient
    (:func:`ring_grad_bytes_per_element`), ``step`` = ``attention_fwd_s / cp``:

    * Megatron/TE (p2p ring): forward ``(cp-1) * max(kv - step, 0)``, backward
      ``(cp-1) * max(kv + dkv - 2 step, 0) + dkv`` (the last dK/dV hand-back to its owner).
    * torchtitan (PyTorch ``_AllGatherRotater``): ``ag`` = all-gather of the ``cp`` blocks over the
      cp group (:func:`autopar.cost.comm.all_gather_s`); forward ``max(ag - step, 0)``, backward
      ``max(ag - 2 step, 0) + (cp-1) * max(dkv - 2 step, 0) + dkv``.

    ``cp`` here is the ring's size (:func:`ring_steps`: ``cp / cp_a2a`` under ``a2a+p2p``, whose
    ring members are ``tp * cp_a2a`` ranks apart). Zero for a ring of one. Example (test): 1 GB/s
    links, Llama-3-8B, seq 8192, cp 4: torchtitan's forward exposes ``3/4 * 4 * kv - step``.
    """
    ring = ring_steps(batch)
    cp = np.asarray(ring, dtype=float)
    stride = batch.tp * batch.cp_a2a
    kv_elements = F.tokens(p, batch) * ring_kv_width(p) / batch.tp
    kv = comm.send_recv_s(p, F.BF16 * kv_elements, ring, stride)
    dkv = comm.send_recv_s(p, ring_grad_bytes_per_element(p) * kv_elements, ring, stride)
    step = attention_fwd_s / cp
    if p.train.framework == "torchtitan":
        gather = comm.all_gather_s(p, F.BF16 * kv_elements * cp, ring, stride)
        fwd = np.maximum(gather - step, 0.0)
        bwd = np.maximum(gather - 2 * step, 0.0) + (cp - 1) * np.maximum(dkv - 2 * step, 0.0) + dkv
    else:
        fwd = (cp - 1) * np.maximum(kv - step, 0.0)
        bwd = (cp - 1) * np.maximum(kv + dkv - 2 * step, 0.0) + dkv
    on = cp > 1
    return np.where(on, fwd, 0.0), np.where(on, bwd, 0.0)
