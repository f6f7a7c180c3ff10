"""FLOPs and bytes of each operator, at the shapes one device runs (forward, one micro-batch).

A GEMM of ``(m x k) @ (k x n)`` costs ``2*m*n*k`` FLOPs (Narayanan et al., SC'21, appendix:
``96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h))`` for GPT with 4h MLPs is the sum of these). Shapes
are the sharded ones: column-parallel outputs and row-parallel inputs divided by ``tp``,
tokens divided by ``cp``, expert GEMMs per local expert.

Causal attention does half the work of the full ``s x s`` score matrix (flash attention skips
masked tiles; the load-balanced CP split keeps that per rank). The backward pass is twice the
forward (two GEMMs per forward GEMM); recompute adds the recomputed forward.

Unfused attention (``TrainSpec.flash_attention=False``; Megatron-LM "local" core attention,
``megatron/core/transformer/dot_product_attention.py`` and the older ``CoreAttention`` of
``megatron/model/transformer.py``) runs ``baddbmm`` (Q K^T) over the FULL ``s x s`` scores,
the fused scale-mask-softmax kernel (``megatron/core/fusions/fused_softmax.py``), the attention
dropout and ``bmm`` with V: no causal skipping, and the scores go through HBM
(:func:`unfused_attention_gemms`, :func:`unfused_softmax_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost import moe as moe_cost
from autopar.cost import window
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

BF16 = 2


@dataclass
class Gemm:
    """``count`` GEMMs of shape (m x k) @ (k x n); m, n, k are arrays over layouts.

    ``fp8``: Transformer Engine runs linear layers in fp8 under fp8 training; the router (fp32
    scores, Megatron ``--moe-router-dtype``) and the output layer stay in bf16 (Megatron keeps
    the first/last layers' GEMMs out of ``fp8_autocast``; TE fp8 primer).
    """

    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    count: np.ndarray | float = 1.0
    fp8: bool = True  # a linear layer: runs in fp8 under --precision fp8 (router, output layer: no)
    grouped: bool = False  # the ``count`` GEMMs are one kernel (MoE grouped GEMM; unfused attention's bmm)
    norm_input: bool = False  # the input is a norm's output (TE LayerNormLinear: quantised by the norm kernel)
    expert: bool = False  # the routed experts' grouped GEMM (autopar.cost.grouped_gemm)
    cast_inputs: float | None = None  # inputs it quantises under fp8 (None: ``count``; fewer where GEMMs share one)

    @property
    def flops(self) -> np.ndarray:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def bytes(self) -> np.ndarray:
        """HBM traffic of the operands and the result in bf16."""
        return BF16 * (self.m * self.k + self.k * self.n + self.m * self.n) * self.count


def tokens(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Tokens of one micro-batch on one rank: (s / cp) * mbs."""
    return p.train.seq_len / batch.cp * batch.mbs


def separate_projections(p: Problem) -> bool:
    """Whether the model's projections that read one input run as separate GEMMs: torchtitan's
    Llama (``torchtitan/models/llama3/model.py``: ``Attention`` holds ``wq``, ``wk``, ``wv`` as three
    ``nn.Linear``, ``FeedForward`` ``w1`` and ``w3`` as two, ``xq, xk, xv = self.wq(x), self.wk(x),
    self.wv(x)``; neither eager PyTorch nor ``torch.compile`` merges matmuls). Megatron-Core and
    DeepSpeed's Megatron fuse them into one ``linear_qkv`` / ``linear_fc1`` GEMM. Separate GEMMs each
    read the whole input, so a narrow one (Llama-3-8B's ``wk`` at tp 8: 128 of 4096 output columns)
    is bound by HBM rather than by the tensor cores (:func:`autopar.cost.compute.gemm_time_s`)."""
    return p.train.framework == "torchtitan"


def attention_gemms(p: Problem, batch: LayoutBatch) -> list[Gemm]:
    """QKV and output projections (MHA/GQA), or MLA's down/up projections: QKV as one GEMM, or
    as ``wq`` and two ``wk``/``wv`` GEMMs (``count`` 2) where :func:`separate_projections`; the
    output projection is always last."""
    m, n, t = p.model, tokens(p, batch), batch.tp
    h = m.hidden_size
    if not m.mla and separate_projections(p):  # wq, then wk and wv on the same (already quantised) input
        return [Gemm(n, m.q_width / t, h, norm_input=True),
                Gemm(n, m.kv_width / t, h, count=2.0, norm_input=True, cast_inputs=0.0), Gemm(n, h, m.v_width / t)]
    if not m.mla:
        return [Gemm(n, (m.q_width + 2 * m.kv_width) / t, h, norm_input=True), Gemm(n, h, m.v_width / t)]
    # MLA (DeepSeek-V3 report sec. 2.1.1; Megatron-Core multi_latent_attention.py): the
    # duplicated down-projections run on the rank's SP shard (all n tokens without SP).
    heads = m.num_attention_heads
    n_shard = n / np.where(batch.sp, t, 1)
    ops = [
        Gemm(n_shard, m.kv_lora_rank + m.qk_rope_head_dim, h),  # kv down (replicated)
        Gemm(n, heads * (m.qk_nope_head_dim + m.v_head_dim) / t, m.kv_lora_rank),  # kv up
        Gemm(n, h, m.v_width / t),  # output projection
    ]
    if m.q_lora_rank:
        ops += [Gemm(n_shard, m.q_lora_rank, h), Gemm(n, m.q_width / t, m.q_lora_rank)]
    else:
        ops.append(Gemm(n, m.q_width / t, h))
    return ops


def mlp_gemms(p: Problem, batch: LayoutBatch, moe: bool, imbalance: bool = True) -> list[Gemm]:
    """Dense MLP, or router + routed experts + shared experts. Routed experts run on the busiest
    rank's rows (``imbalance=False``: the balanced share, for model FLOPs). A dense gated MLP's up
    projection is one GEMM of ``2 ffn / tp`` columns, or ``w1`` and ``w3`` as two GEMMs (``count`` 2,
    one input quantised once) where :func:`separate_projections`."""
    m, n, t = p.model, tokens(p, batch), batch.tp
    h = m.hidden_size
    up = 2 if m.gated_mlp else 1

    def mlp(rows, ffn, shard, count=1.0, grouped=False, norm_input=False):
        return [Gemm(rows, up * ffn / shard, h, count, grouped=grouped, expert=grouped, norm_input=norm_input),
                Gemm(rows, h, ffn / shard, count, grouped=grouped, expert=grouped)]

    if not moe and up == 2 and separate_projections(p):  # w1 and w3: two GEMMs on one input, quantised once
        return [Gemm(n, m.ffn_hidden_size / t, h, 2.0, norm_input=True, cast_inputs=1.0),
                Gemm(n, h, m.ffn_hidden_size / t)]
    if not moe:
        return mlp(n, m.ffn_hidden_size, t, norm_input=True)
    # Busiest expert rank: n*k*etp/tp token copies over its E/ep experts (autopar.cost.moe).
    local_experts = m.num_experts / batch.ep
    rows_per_expert = moe_cost.expert_rows(p, batch, imbalance) / local_experts
    router = Gemm(n / np.where(batch.sp, t, 1), m.num_experts, h, fp8=False)
    ops = [router] + mlp(rows_per_expert, m.moe_ffn_hidden_size, batch.etp, local_experts, grouped=True)
    if m.shared_expert_ffn_hidden_size:
        ops += mlp(n, m.shared_expert_ffn_hidden_size, t)
    return ops


def attention_core_flops(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward FLOPs of QK^T and softmax(.)V, causal (half of the full matrix), per rank, for the
    model's mean layer: sliding-window layers scale with ``seq*window``, not ``seq^2/2``
    (:func:`autopar.cost.window.mean_key_fraction`)."""
    m = p.model
    n = tokens(p, batch)
    per_key = m.attention_head_dim + (m.v_head_dim if m.mla else m.head_dim)
    full = 2.0 * n * p.train.seq_len * m.num_attention_heads * per_key / batch.tp * 0.5
    return full * window.mean_key_fraction(m, p.train.seq_len)


def unfused_attention_gemms(p: Problem, batch: LayoutBatch) -> list[Gemm]:
    """The two batched GEMMs of unfused attention (forward), one kernel each, per rank.

    Megatron-LM core attention (``dot_product_attention.py``): ``baddbmm`` of Q (``[b*np, sq, d]``)
    by K^T into the full ``[b*np, sq, sk]`` score tensor (beta 0, alpha ``1/sqrt(d)``), then
    ``bmm`` of the probabilities by V. ``np = heads / tp`` per rank, ``sq = s / cp`` local queries,
    ``sk = s`` keys, ``d`` the query/key head width (MLA: nope + rope) and the value head width.
    Every score is computed (no causal tile skipping): ``2 * mbs * np * sq * s * (d_qk + d_v)``
    FLOPs, twice :func:`attention_core_flops`. bf16 even under fp8 training (not a linear layer).
    """
    m = p.model
    count = batch.mbs * m.num_attention_heads / batch.tp
    sq = p.train.seq_len / batch.cp
    d_v = m.v_head_dim if m.mla else m.head_dim
    return [Gemm(sq, p.train.seq_len, m.attention_head_dim, count, fp8=False, grouped=True),
            Gemm(sq, d_v, p.train.seq_len, count, fp8=False, grouped=True)]


SOFTMAX_FWD_BYTES = 4  # fused scale-mask-softmax: read the bf16 scores, write the bf16 probabilities
SOFTMAX_BWD_BYTES = 6  # its backward: read the probabilities and their gradient, write the gradient
DROPOUT_FWD_BYTES = 5  # attention dropout: read probabilities, write output (bf16) and the 1-byte mask
DROPOUT_BWD_BYTES = 5  # its backward: read the gradient and the mask, write the gradient


def unfused_softmax_bytes(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) HBM bytes of unfused attention's softmax and dropout, per rank.

    Per element of the ``mbs * heads/tp * s/cp * s`` score tensor: Megatron's fused
    scale-mask-softmax (``FusedScaleMaskSoftmax``, ``scaled_upper_triang_masked_softmax`` /
    ``scaled_masked_softmax`` CUDA kernels) reads the scores and writes the probabilities
    (:data:`SOFTMAX_FWD_BYTES`); its backward reads the probabilities and the incoming gradient
    and writes the gradient (:data:`SOFTMAX_BWD_BYTES`). With dropout (``ModelSpec.dropout``)
    ``attention_dropout`` adds a pass that writes the dropped probabilities and a 1-byte mask
    (:data:`DROPOUT_FWD_BYTES`), and a backward pass (:data:`DROPOUT_BWD_BYTES`). Zero under
    flash attention (the softmax runs inside the fused kernel).
    """
    if p.train.flash_attention:
        zero = np.zeros(np.shape(batch.tp))
        return zero, zero
    scores = tokens(p, batch) * p.train.seq_len * p.model.num_attention_heads / batch.tp
    drop = 1.0 if p.model.dropout else 0.0
    return (scores * (SOFTMAX_FWD_BYTES + drop * DROPOUT_FWD_BYTES),
            scores * (SOFTMAX_BWD_BYTES + drop * DROPOUT_BWD_BYTES))


def elementwise_bytes(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Forward HBM traffic of the memory-bound ops of one layer (bytes).

    Norms (read + write), two residual adds (2 reads + 1 write), rotary embedding on q and k,
    and the MLP's own passes (:func:`mlp_elementwise_bytes`). Norms and residuals run on the SP
    shard when SP is on. Unfused attention's softmax/dropout: :func:`unfused_softmax_bytes`.
    """
    m, n, t = p.model, tokens(p, batch), batch.tp
    n_seq = n / np.where(batch.sp, t, 1)
    norms_and_residual = (m.norms_per_layer * 2 + 2 * 3) * n_seq * m.hidden_size
    return BF16 * norms_and_residual + rope_bytes(p, batch) + mlp_elementwise_bytes(p, batch, moe)


def rope_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward HBM traffic of the rotary embedding on q and k (read + write), per rank (bytes)."""
    m = p.model
    return BF16 * 2 * tokens(p, batch) * (m.q_width + (m.q_width if m.mla else m.kv_width)) / batch.tp


def activation_pass_bytes(p: Problem, rows: np.ndarray, width: np.ndarray) -> np.ndarray:
    """One MLP activation over ``rows x width`` outputs (bytes): gated (SwiGLU) reads ``2 width``
    and writes ``width``, GeLU/ReLU reads and writes ``width``."""
    return BF16 * (3 if p.model.gated_mlp else 2) * rows * width


def mlp_elementwise_bytes(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Forward HBM traffic of an MLP block's memory-bound ops (bytes): the dense activation, or
    the routed experts' activation on the busiest rank's rows, the shared experts' activation,
    and :func:`dispatch_bytes`."""
    m, n, t = p.model, tokens(p, batch), batch.tp
    if not moe:
        return activation_pass_bytes(p, n, m.ffn_hidden_size / t)
    routed = activation_pass_bytes(p, moe_cost.expert_rows(p, batch), m.moe_ffn_hidden_size / batch.etp)
    shared = activation_pass_bytes(p, n, m.shared_expert_ffn_hidden_size / t)
    return routed + shared + dispatch_bytes(p, batch)


def dispatch_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward HBM traffic of MoE routing on the SP shard (bytes): permute and unpermute (read +
    write of ``k`` copies of the shard each, twice when unfused:
    :func:`autopar.cost.moe_dispatch.permute_passes`), the router scores (about 3 fp32 passes
    over ``num_experts`` scores per token = 6 bf16 units) and the alltoall dispatcher's sort by
    local expert (:func:`autopar.cost.moe_dispatch.sort_chunks_bytes`)."""
    from autopar.cost.moe_dispatch import permute_passes, sort_chunks_bytes

    m = p.model
    n_shard = tokens(p, batch) / np.where(batch.sp, batch.tp, 1)
    permute = 2 * 2 * n_shard * m.num_experts_per_tok * m.hidden_size * permute_passes(p, batch)
    return BF16 * (permute + 6 * n_shard * m.num_experts) + sort_chunks_bytes(p, batch)


def logits_gemm(p: Problem, batch: LayoutBatch) -> Gemm:
    """Output layer at the padded, vocab-parallel width (bf16 even under fp8 training)."""
    return Gemm(tokens(p, batch), p.padded_vocab(batch.tp) / batch.tp, p.model.hidden_size, fp8=False)


def loss_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Forward traffic of the vocab-parallel cross entropy on fp32 logits (about 3 passes)."""
    return 3 * 4 * tokens(p, batch) * p.padded_vocab(batch.tp) / batch.tp


def model_flops_per_token(p: Problem) -> float:
    """Training FLOPs per token of the unsharded model, no recompute: 3 x forward (forward +
    2x backward), causal attention, the unpadded vocabulary. The numerator of MFU (PaLM,
    Chowdhery et al. 2022, appendix B, with the attention term halved for causal masks): the
    FLOPs of the tokens the model computes, so MFU stays at most 100% (a MoE's dropped token
    copies and padding rows are not counted, below; Megatron-LM's logged TFLOP/s/GPU counts every
    top-k copy, so it differs from autopar's for a token-dropping MoE).

    MoE layers count the router, the shared experts and ``top-k`` routed experts per token
    (active parameters only, balanced routing), times the share the experts compute under a
    capacity factor ``C`` (:func:`autopar.cost.moe.processed_fraction`, ``min(1, C)``: dropped
    copies are no work, padding rows no model FLOPs; Megatron's ``num_floating_point_operations``
    ignores the capacity and would exceed the peak for small ``C``); MTP modules (DeepSeek-V3 sec. 2.2) add their
    projection, one layer and one more output layer each, as Megatron's
    ``num_floating_point_operations`` does."""
    one = LayoutBatch(**{k: np.ones(1, dtype=np.int64) for k in (
        "dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "recompute_layers", "num_microbatches")},
        sp=np.zeros(1, dtype=bool), recompute=np.zeros(1, dtype=np.int64))
    seq = p.train.seq_len
    forward = 0.0
    m = p.model
    for i in range(m.num_layers):
        moe = m.is_moe_layer(i)
        ops = attention_gemms(p, one) + mlp_gemms(p, one, moe, imbalance=False)
        forward += float(sum(g.flops for g in ops)[0]) + float(attention_core_flops(p, one)[0])
    forward += 2.0 * seq * m.hidden_size * m.vocab_size
    if m.mtp_num_layers:
        last = attention_gemms(p, one) + mlp_gemms(p, one, m.is_moe_layer(m.num_layers - 1), imbalance=False)
        per_mtp = float(sum(g.flops for g in last)[0]) + float(attention_core_flops(p, one)[0])
        per_mtp += 2.0 * seq * 2 * m.hidden_size * m.hidden_size + 2.0 * seq * m.hidden_size * m.vocab_size
        forward += m.mtp_num_layers * per_mtp
    return 3.0 * forward / seq
