"""Exposed communication of the context-parallel attention algorithms (``Strategy.cp_comm_type``).

Transformer Engine ``DotProductAttention`` ``cp_comm_type`` (``attention/dot_product_attention/
dot_product_attention.py`` docstring and ``context_parallel.py``, commit d0067d0), set by
Megatron-LM ``--cp-comm-type`` (``core/extensions/transformer_engine.py`` ``TEDotProductAttention``):

* ``p2p`` (``AttnFuncWithCPAndKVP2P``): the K/V ring, :func:`autopar.cost.attention.ring_exposed_s`;
  MindSpeed ``--context-parallel-algo megatron_cp_algo``.
* ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, DeepSpeed Ulysses, Jacobs et al. 2023 sec. 3): an
  all-to-all turns the sequence-sharded Q, K, V into head-sharded full-sequence ones before the
  attention kernel and another turns the output back; backward the same for dO and dQ, dK, dV.
  Blocking, nothing to hide behind: forward ``a2a(Q+K+V) + a2a(O)``, backward
  ``a2a(dO) + a2a(dQ+dK+dV)`` over the ``cp`` ranks (stride tp). Needs the heads per tp rank
  divisible by cp (rule ``cp_a2a_divides_heads``). MindSpeed ``ulysses_cp_algo``.
* ``allgather`` (``AttnFuncWithCPAndKVAllGather``): forward all-gathers K and V of the whole
  sequence ("not async, cannot be overlapped"), backward gathers them again and reduce-scatters
  dK, dV: forward ``ag(KV)``, backward ``ag(KV) + rs(dKV)``.
* ``a2a+p2p`` (hierarchical, Megatron ``--hierarchical-context-parallel-sizes A P``; MindSpeed
  ``hybrid_cp_algo`` with ``--ulysses-degree-in-cp A``): the all-to-all over the inner ``A``
  ranks (stride tp), then the p2p ring over the ``P = cp / A`` groups (stride ``tp * A``).

The all-to-all moves a rank's local tensors: ``tokens * width / tp`` bf16 elements with
``tokens = s / cp * mbs``. K/V width: ``2 * kv_heads * head_dim``; where the kv heads per tp rank
are fewer than the all-to-all group (GQA), MindSpeed's Ulysses repeats them up to the group (TE
refuses: the Megatron writer says so), so the width is ``max(kv_heads / tp, A) * tp * head_dim``.
Activations are unchanged: after the all-to-all a rank holds ``A`` times the tokens of ``1/A`` of
the heads.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import attention as attn
from autopar.cost import comm
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def a2a_exposed_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the Ulysses all-to-alls per layer and micro-batch, over the
    ``cp_a2a`` ranks (0 where ``cp_a2a`` is 1). See the module docstring.

    Example: Llama-3-8B (32 heads, 8 kv heads of 128), seq 8192, mbs 1, tp 1, cp = cp_a2a = 2:
    Q+K+V = 4096 x (4096 + 2 x 1024) x 2 B = 48 MiB and O = 32 MiB per rank, each all-to-all moving
    half of it; backward the same volumes.
    """
    m, a = p.model, batch.cp_a2a
    tokens = F.tokens(p, batch)
    head_dim = m.kv_width / max(m.num_kv_heads, 1)
    kv_heads = np.maximum(m.num_kv_heads / batch.tp, a)  # per tp rank, repeated up to the group (GQA)
    qkv_bytes = F.BF16 * tokens * (m.q_width / batch.tp + 2 * kv_heads * head_dim)
    out_bytes = F.BF16 * tokens * m.v_width / batch.tp
    fwd = comm.all_to_all_s(p, qkv_bytes, a, batch.tp) + comm.all_to_all_s(p, out_bytes, a, batch.tp)
    return fwd, fwd.copy()


def allgather_exposed_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the ``allgather`` algorithm per layer and micro-batch: the
    K/V all-gather over cp (stride tp) forward; the gather again and the dK/dV reduce-scatter
    backward (0 for other algorithms)."""
    kv_bytes = F.BF16 * F.tokens(p, batch) * attn.ring_kv_width(p) / batch.tp * batch.cp  # the gathered K/V
    gather = comm.all_gather_s(p, kv_bytes, batch.cp, batch.tp)
    on = batch.cp_comm_is("allgather") & (batch.cp > 1)
    return np.where(on, gather, 0.0), np.where(on, 2 * gather, 0.0)


def exposed_s(p: Problem, batch: LayoutBatch, attention_fwd_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) exposed CP seconds per layer and micro-batch of each layout's algorithm:
    the p2p ring part (:func:`autopar.cost.attention.ring_exposed_s`, a ring of one for ``a2a`` and
    ``allgather``), plus the all-to-alls (:func:`a2a_exposed_s`) and the all-gathers
    (:func:`allgather_exposed_s`). ``attention_fwd_s``: forward seconds of the layer's core attention."""
    ring_fwd, ring_bwd = attn.ring_exposed_s(p, batch, attention_fwd_s)
    a2a_fwd, a2a_bwd = a2a_exposed_s(p, batch)
    ag_fwd, ag_bwd = allgather_exposed_s(p, batch)
    return ring_fwd + a2a_fwd + ag_fwd, ring_bwd + a2a_bwd + ag_bwd
