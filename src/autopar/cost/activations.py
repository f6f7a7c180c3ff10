"""Activation memory kept for the backward pass, per layer and per micro-batch.

Source: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(MLSys 2023, arXiv:2205.05198), section 4.1 and table 2: per layer ``s*b*h*(34 + 5*a*s/h)``
bytes without parallelism, ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with TP, ``s*b*h*34/t + 5*a*s^2*b/t``
with TP + SP, and ``s*b*h*34/t`` with SP + selective recompute (core attention). We write it
op by op so it generalises:

* GQA/MQA: K and V are ``kv_heads * head_dim`` wide, Q ``heads * head_dim``;
* gated MLPs (SwiGLU): the fc1 output is 2f wide and the activation output f wide (6*f bytes
  per token) instead of GeLU's input and output (4*f);
* flash attention keeps no ``s^2`` tensor, only its output and the fp32 log-sum-exp;
* dropout masks (1 byte per element) only when the model trains with dropout;
* SP divides the norm/dropout/GEMM-input tensors that plain TP replicates;
* CP: each rank holds ``s/cp`` tokens (Megatron's load-balanced causal split), so every term
  uses the local sequence;
* full recompute keeps only the layer input (2*s*b*h, sharded by SP);
* MoE layers: :func:`autopar.cost.moe.moe_block_bytes` (router scores, the expert MLPs on the
  ``n*k*etp/tp`` token copies routed to the local experts whatever ``ep`` is, so EP does not
  shrink activations, and shared experts);
* fp8 under Megatron-LM (Transformer Engine): every fp8 linear layer saves its own fp8-quantized
  input for the weight gradient instead of the bf16 tensor (TE ``module/linear.py``,
  ``layernorm_linear.py``, ``grouped_linear.py`` forward: ``saved_inputmat = inputmat`` after
  quantizing, ``update_usage(rowwise_usage=False, columnwise_usage=True)``: 1 B per element);
  a bf16 tensor some other op saves anyway (the flash-attention output, the norm input, the
  SwiGLU input) stays, so the attention output is held twice (2 B + 1 B):
  :func:`linear_input_bytes`. torchtitan's float8 (torchao) is not modelled this way.

Units: bytes. Shapes: arrays broadcast with the ``LayoutBatch`` columns.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

BF16 = 2  # bytes per activation element (bf16/fp16 training)


def linear_input_bytes(p: Problem) -> int:
    """Bytes per element a linear layer saves of its input for the backward pass: 1 for fp8
    training under Megatron-LM (Transformer Engine keeps the fp8 copy it computed with; module
    docstring), else 2 (the bf16/fp16 input itself)."""
    return 1 if p.train.precision == "fp8" and p.train.framework == "megatron" else BF16


def _tokens(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Tokens of one micro-batch held by one rank: (s / cp) * mbs."""
    return p.train.seq_len / batch.cp * batch.mbs


def _sp_shard(batch: LayoutBatch) -> np.ndarray:
    """Divisor for tensors that SP shards and plain TP replicates."""
    return np.where(batch.sp, batch.tp, 1)


def attention_bytes(p: Problem, batch: LayoutBatch, selective: np.ndarray) -> np.ndarray:
    """Attention block (input norm to output-projection dropout) for one micro-batch.

    ``selective``: bool array; True where selective recompute discards what the layout's
    ``recompute_modules`` re-run (:mod:`autopar.cost.recompute`): ``core_attn`` the
    core-attention internals, ``mla_up_proj`` MLA's q, k, v and the up-projections' normed
    latents, ``layernorm`` the output of MLA's separate input norm.
    """
    return attention_bytes_kept_full(p, batch, selective)[0]


def attention_bytes_kept_full(p: Problem, batch: LayoutBatch, selective: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, full): :func:`attention_bytes` with ``selective`` and with no row selective, from
    one evaluation of the shared terms (the same operations in the same order, so each equals
    its own :func:`attention_bytes` call exactly)."""
    m, n = p.model, _tokens(p, batch)
    t, shard = batch.tp, _sp_shard(batch)
    drop = 1.0 if m.dropout else 0.0
    h = m.hidden_size
    on = lambda name: selective & batch.module_on(name)  # noqa: E731
    lin = linear_input_bytes(p)
    out = (BF16 + lin) * n * h / shard  # norm input and QKV GEMM input
    full_out = None
    if m.mla:
        # Megatron-Core multi_latent_attention.py: the duplicated down-projections run on the SP
        # shard; q/kv latents are kept as norm input and up-projection input (2 each), the
        # decoupled rope key once; then q, k (nope+rope per head) and v (v_head_dim per head).
        latent = 2 * (m.q_lora_rank + m.kv_lora_rank) + m.qk_rope_head_dim
        out = out + BF16 * n * latent / shard
        qkv_width = m.q_width + m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.v_width
        up_proj = BF16 * n * (m.q_lora_rank + m.kv_lora_rank) / shard + BF16 * n * qkv_width / t
        full_out = out
        out = out - np.where(on("mla_up_proj"), up_proj, 0.0) - np.where(on("layernorm"), BF16 * n * h / shard, 0.0)
    else:
        qkv_width = m.q_width + 2 * m.kv_width
    qkv = BF16 * n * qkv_width / t
    out = out + qkv
    full_out = out if full_out is None else full_out + qkv
    # The output-projection input; the same bf16 tensor as the core-attention output, which the
    # fused kernel saves too, unless fp8 keeps a separate 1-byte copy (module docstring).
    proj_in = lin * n * m.v_width / t
    attn_out = BF16 * n * m.v_width / t + (proj_in if lin != BF16 else 0.0)
    if p.train.flash_attention:
        internals = 4 * n * m.num_attention_heads / t  # fp32 log-sum-exp
    else:
        scores = n * p.train.seq_len * m.num_attention_heads / t  # elements of one s x s/cp map set
        internals = BF16 * scores + drop * (scores + BF16 * scores)  # softmax (+ mask, dropout out)
    core_full = attn_out + internals
    core = np.where(on("core_attn"), proj_in, core_full)
    dropped = drop * n * h / shard
    return out + core + dropped, full_out + core_full + dropped


def unfused_backward_transient_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Peak transient of one layer's unfused core-attention backward (0 with a fused kernel).

    Megatron-LM / Transformer Engine ``UnfusedDotProductAttention`` (and Megatron-DeepSpeed's
    ``ParallelAttention``): the probabilities-times-V ``bmm`` backward writes the gradient of the
    (dropped-out) probabilities, the dropout backward the gradient of the softmax output, and
    ``FusedScaleMaskSoftmax``'s backward (``scaled_upper_triang_masked_softmax_backward``, in the
    input dtype) the gradient of the scores, each a full ``b * heads/tp * s/cp * s`` map in bf16;
    each is freed once the next is written, so two coexist: ``2 * 2`` bytes per score element, for
    the one layer in backward at a time, on top of what the layers keep (:func:`attention_bytes`
    keeps the bf16 softmax output, and with dropout its 1-byte mask and 2-byte output). Example:
    BLOOM-176B (112 heads, tp 4), s 2048, mbs 2: 2 x 28 x 2048^2 x 4 B = 0.88 GiB.
    """
    if p.train.flash_attention:
        return np.zeros(len(batch))
    scores = _tokens(p, batch) * p.train.seq_len * p.model.num_attention_heads / batch.tp
    return 2 * BF16 * scores


def mlp_bytes(p: Problem, batch: LayoutBatch, moe: bool, selective: np.ndarray | None = None) -> np.ndarray:
    """MLP block (pre-MLP norm to its dropout) for one micro-batch; ``moe`` for MoE layers.

    ``selective``: True where selective recompute discards what the layout's ``recompute_modules`` re-run
    (:mod:`autopar.cost.recompute`): ``mlp`` a dense MLP's internals (its input stays),
    ``moe`` a MoE block's (:func:`autopar.cost.moe.moe_block_bytes`), ``moe_act`` the routed
    experts' activation output, ``shared_experts`` their internals, ``layernorm`` the output of
    a MoE layer's separate pre-MLP norm.
    """
    selective = np.zeros(len(batch), dtype=bool) if selective is None else selective
    return mlp_bytes_kept_full(p, batch, moe, selective)[0]


def mlp_bytes_kept_full(p: Problem, batch: LayoutBatch, moe: bool,
                        selective: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kept, full): :func:`mlp_bytes` with ``selective`` and with no row selective, from one
    evaluation of the shared terms (the same operations in the same order, so each equals its
    own :func:`mlp_bytes` call exactly: ``x - 0.0`` is ``x``)."""
    m, n = p.model, _tokens(p, batch)
    t, shard = batch.tp, _sp_shard(batch)
    drop = 1.0 if m.dropout else 0.0
    h = m.hidden_size
    on = lambda name: selective & batch.module_on(name)  # noqa: E731
    lin = linear_input_bytes(p)
    # bytes per token per unit of FFN width (see module doc): fc1 output (2f gated) and fc2 input
    per_ffn = (4 if m.gated_mlp else 2) + lin
    if not moe:
        out = (BF16 + lin) * n * h / shard + drop * n * h / shard  # norm input, fc1 input, mask
        internals = lin * n * h / shard + per_ffn * n * m.ffn_hidden_size / t  # fc1 input, fc1/act outputs
        full = out + per_ffn * n * m.ffn_hidden_size / t
        return full - np.where(on("mlp"), internals, 0.0), full
    out = BF16 * n * h * 2 / shard + drop * n * h / shard  # norm input, router/dispatcher input, mask
    block = moe_cost.moe_block_bytes(p, batch)
    # moe_act frees the activation output; under fp8 fc2 keeps its own 1-byte copy, so nothing.
    act_out = BF16 * moe_cost.expert_rows(p, batch) * m.moe_ffn_hidden_size / batch.etp * (lin == BF16)
    parts = np.where(on("moe_act"), act_out, 0.0) + np.where(on("shared_experts"), moe_cost.shared_expert_bytes(p, batch), 0.0)
    freed = np.where(on("moe"), block, parts) + np.where(on("layernorm"), BF16 * n * h / shard, 0.0)
    full = out + block
    return full - freed, full


def layer_input_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """What full recompute keeps per layer: its input hidden state (SP-sharded)."""
    return BF16 * _tokens(p, batch) * p.model.hidden_size / _sp_shard(batch)


def embedding_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """First stage, per micro-batch: token ids (int64) and the embedding dropout mask.

    Megatron ``theoretical_memory_usage.py`` (``8*s*b`` + ``s*b*h``), divided by tp as there.
    """
    n = _tokens(p, batch)
    drop = 1.0 if p.model.dropout else 0.0
    return (8 * n + drop * n * p.model.hidden_size) / batch.tp


def output_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Last stage, per micro-batch: final-norm input, output-layer input and fp32 logits.

    Megatron ``theoretical_memory_usage.py``: ``4*s*b*h*(1 + V/h) / t`` with SP; without SP the
    two hidden-size inputs are replicated over TP.
    """
    n = _tokens(p, batch)
    h = p.model.hidden_size
    return 2 * BF16 * n * h / _sp_shard(batch) + 4 * n * p.padded_vocab(batch.tp) / batch.tp
