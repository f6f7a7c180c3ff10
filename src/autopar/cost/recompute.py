"""Selective recompute: what one decoder layer runs again in backward, per micro-batch.

Megatron-LM (``--recompute-granularity selective --recompute-modules M...``, default
``core_attn``; Megatron-Core ``transformer_layer.py``, ``multi_latent_attention.py``,
``moe/moe_layer.py``, ``moe/experts.py``) checkpoints the listed modules of every layer. Two
mechanisms, the same cost here: a checkpointed module keeps its input and re-runs its forward
before its backward (``core_attn``, ``mlp``, ``moe``, ``shared_experts``); an output-discarding
checkpoint (``CheckpointWithoutOutput``: ``layernorm``, ``moe_act``, ``mla_up_proj``) frees its
output once the consumers have saved it and rebuilds it before their backward. What each frees:
:func:`autopar.cost.activations.attention_bytes` and :func:`~autopar.cost.activations.mlp_bytes`.
What each re-runs (:func:`layer_recompute_s`):

* ``core_attn``: the core attention (``QK^T``, softmax, ``softmax V``; Korthikanti et al. 2022,
  sec. 4.3), with its CP ring steps;
* ``layernorm``: the norms that are separate modules - MLA's input norm, a MoE layer's pre-MLP
  norm (dense layers fuse theirs into Transformer Engine's ``LayerNormLinear``: nothing to do);
* ``mla_up_proj``: MLA's q/kv up-projections with their fused latent norms, and RoPE;
* ``moe_act``: the routed experts' activation function;
* ``mlp``: a dense layer's MLP with its TP collectives; ``shared_experts``: the shared experts
  with theirs; ``moe``: the whole MoE block - router, permutation, dispatch and combine
  all-to-all (and the etp gathers), routed and shared experts.

The set is a layout field (``Strategy.recompute_modules``, a bit mask per ``LayoutBatch`` row).
torchtitan (``TrainSpec.framework='torchtitan'``) has no module list: its selective recompute is
per-op SAC (:func:`layer_recompute_s`). Units: seconds, arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import moe as moe_cost
from autopar.cost import moe_dispatch
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def _norm_pass_s(p: Problem, batch: LayoutBatch, width: float | np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One norm over ``rows x width`` (read + write, bf16) and its kernel."""
    return C.memory_time_s(p, 2 * F.BF16 * rows * width) + C.KERNEL_OVERHEAD_S


def separate_norms(p: Problem, moe: bool) -> int:
    """Norms of a layer that are their own modules (what ``layernorm`` recompute re-runs): MLA's
    input norm (its down-projections are plain linears) and a MoE layer's pre-MLP norm (its
    output feeds the router); 0 for a dense GQA layer (norms fused into ``LayerNormLinear``)."""
    return int(p.model.mla) + int(moe)


def layer_recompute_s(p: Problem, batch: LayoutBatch, layer: C.LayerTimes, moe: bool) -> np.ndarray:
    """Compute-stream seconds one layer re-runs per micro-batch under selective recompute; the
    collectives of the re-run modules are :func:`extra_tp_collectives` and :func:`extra_ep_passes`.

    Args:
        layer: the layer's forward times (:func:`autopar.cost.compute.layer_forward_times`).
        moe: a MoE layer (else dense).

    torchtitan (per-op SAC, ``parallelize_llama.py`` ``_save_list``/``_custom_policy`` of
    2024-12): inside each layer the outputs of SDPA and of every *odd* ``aten.mm`` are saved, so
    the *even* matmuls of the order wq, wk, wv, wo, w1, w3, w2 -- wk, wo, w3 (gated; else wk,
    wo, fc2) -- and every element-wise op (norms, RoPE, activation, residual adds) run again in
    backward; attention does not. Example: Llama-3-8B recomputes 4096*(1024 + 4096 + 14336) of
    its 4096*(2*4096 + 2*1024 + 3*14336) forward GEMM MACs per token: 36.5%.
    """
    m, n, t = p.model, F.tokens(p, batch), batch.tp
    h = m.hidden_size
    if p.train.framework == "torchtitan":
        mlp_even = F.Gemm(n, m.ffn_hidden_size / t, h) if m.gated_mlp else F.Gemm(n, h, m.ffn_hidden_size / t)
        even = [F.Gemm(n, m.kv_width / t, h), F.Gemm(n, h, m.v_width / t), mlp_even]
        return sum(C.gemm_time_s(p, g) for g in even) + layer.elementwise_s
    def on(name: str) -> np.ndarray | None:  # None: no row re-runs the module (its cost is not computed)
        rows = batch.module_on(name)
        return rows if rows.any() else None

    n_seq = n / np.where(batch.sp, t, 1)
    total = np.where(batch.module_on("core_attn"), layer.attention_s, 0.0)
    if (rows := on("layernorm")) is not None:
        total = total + np.where(rows, separate_norms(p, moe) * _norm_pass_s(p, batch, h, n_seq), 0.0)
    if m.mla and (rows := on("mla_up_proj")) is not None:
        # attention_gemms order: kv down, kv up, output, then q down + q up (or one q projection,
        # which the checkpointed function runs when there is no q latent).
        gemms = F.attention_gemms(p, batch)
        up_s = (C.gemm_time_s(p, gemms[1]) + C.gemm_time_s(p, gemms[-1]) + C.memory_time_s(p, F.rope_bytes(p, batch))
                + _norm_pass_s(p, batch, m.q_lora_rank + m.kv_lora_rank, n_seq) + 2 * C.KERNEL_OVERHEAD_S)
        total = total + np.where(rows, up_s, 0.0)
    if not moe:
        if (rows := on("mlp")) is not None:
            mlp_s = (sum(C.gemm_time_s(p, g) for g in F.mlp_gemms(p, batch, False))
                     + C.memory_time_s(p, F.mlp_elementwise_bytes(p, batch, False)) + _norm_pass_s(p, batch, h, n_seq))
            total = total + np.where(rows, mlp_s, 0.0)
        return total
    parts = np.zeros(len(batch))
    if (rows := on("moe_act")) is not None:
        expert_rows = moe_cost.expert_rows(p, batch)
        act_s = C.memory_time_s(p, F.activation_pass_bytes(p, expert_rows, m.moe_ffn_hidden_size / batch.etp))
        parts = parts + np.where(rows, act_s + C.KERNEL_OVERHEAD_S, 0.0)
    if m.shared_expert_ffn_hidden_size and (rows := on("shared_experts")) is not None:
        shared = F.mlp_gemms(p, batch, True)[3:]  # router, routed fc1, routed fc2, then the shared fc1, fc2
        shared_s = (sum(C.gemm_time_s(p, g) for g in shared)
                    + C.memory_time_s(p, F.activation_pass_bytes(p, n, m.shared_expert_ffn_hidden_size / t)))
        parts = parts + np.where(rows, shared_s, 0.0)
    if (rows := on("moe")) is not None:
        block_s = (sum(C.gemm_time_s(p, g) for g in F.mlp_gemms(p, batch, True))
                   + C.memory_time_s(p, F.mlp_elementwise_bytes(p, batch, True))
                   + moe_dispatch.extra_kernels(p) * C.KERNEL_OVERHEAD_S)
        parts = np.where(rows, block_s, parts)
    return total + parts


def stage_recompute_s(p: Problem, batch: LayoutBatch, dense: C.LayerTimes, moe: C.LayerTimes,
                      n_dense: np.ndarray, n_moe: np.ndarray) -> np.ndarray:
    """Compute-stream seconds a stage of ``n_dense`` dense and ``n_moe`` MoE layers re-runs per
    micro-batch under selective recompute (:func:`layer_recompute_s` per layer). torchtitan's
    per-op SAC is costed on the dense layer for every layer (its policy inside a MoE block is
    not modelled)."""
    if p.train.framework == "torchtitan":
        return (n_dense + n_moe) * layer_recompute_s(p, batch, dense, False)
    moe_s = layer_recompute_s(p, batch, moe, True) if p.model.is_moe else 0.0
    return n_dense * layer_recompute_s(p, batch, dense, False) + n_moe * moe_s


def extra_tp_collectives(p: Problem, batch: LayoutBatch, n_dense: np.ndarray, n_moe: np.ndarray) -> np.ndarray:
    """TP collective pairs (all-gather + reduce-scatter with SP, else one all-reduce) that
    selective recompute repeats per micro-batch: one per dense layer under ``mlp``, the MoE MLP
    block's (:func:`autopar.cost.moe.mlp_tp_collective_pairs`) per MoE layer under ``moe`` or
    ``shared_experts``.

    torchtitan's per-op SAC saves the reduce-scatter outputs but not the all-gathers
    (``parallelize_llama.py`` ``_save_list``: mm, SDPA, ``reduce_scatter_tensor``, max; every other
    op is ``PREFER_RECOMPUTE``), and its recomputed ``wk``/``w3`` matmuls need their gathered
    input: with SP each layer repeats its two forward all-gathers (attention and MLP input) in
    backward, one pair's worth of traffic per layer. Without SP there is no forward all-gather."""
    if p.train.framework == "torchtitan":
        return (n_dense + n_moe) * np.asarray(batch.sp, dtype=bool) * (batch.tp > 1)
    on = batch.module_on
    moe_block = on("moe") | on("shared_experts")
    return n_dense * on("mlp") + n_moe * moe_cost.mlp_tp_collective_pairs(p) * moe_block


def extra_ep_passes(p: Problem, batch: LayoutBatch, n_moe: np.ndarray) -> np.ndarray:
    """MoE layers' worth of forward expert-parallel traffic (dispatch and combine, etp gathers:
    half of :func:`autopar.cost.moe.layer_comm_s`) that ``moe`` recompute repeats per micro-batch."""
    return 0.5 * n_moe * (batch.module_on("moe") & (p.train.framework != "torchtitan"))


def reruns_core_attention(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Where selective recompute runs the core attention again (and with it the CP ring)."""
    return batch.module_on("core_attn") & (p.train.framework != "torchtitan")


def memory_saving_modules(p: Problem) -> tuple[str, ...]:
    """Megatron's default ``core_attn`` plus the output-discarding modules the model has -
    ``layernorm`` (MLA or MoE layers), ``mla_up_proj`` (MLA), ``moe_act`` (MoE): "modules with
    smaller computational workload but larger memory occupation" (Megatron-LM DeepSeek-V3 GB200
    guide, baseline item 8), the set the search offers besides the default. Only ``core_attn``
    for a framework other than Megatron-LM (no module list there) or a dense GQA model."""
    m = p.model
    if p.train.framework != "megatron":
        return ("core_attn",)
    extra = (["layernorm"] if m.mla or m.is_moe else []) + (["mla_up_proj"] if m.mla else []) + \
        (["moe_act"] if m.is_moe else [])
    return ("core_attn", *extra)
