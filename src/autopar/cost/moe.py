"""Mixture-of-experts layers: routed tokens per device, their activations, GEMMs and all-to-all.

Token flow of Megatron-Core's ``alltoall`` dispatcher (``megatron/core/transformer/moe/
token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``; ``moe_layer.py``): each rank routes the
``n/tp`` tokens of its sequence-parallel shard (MoE with tp > 1 requires SP, see the
``moe_tp_needs_sp`` rule) to ``top-k`` experts, permutes the copies, exchanges them over the
``ep`` group (all-to-all), all-gathers them over the ``etp`` group, runs the local experts as one
grouped GEMM on a ``moe_ffn/etp`` slice, and reverses the path (reduce-scatter over ``etp``,
all-to-all, unpermute with the routing probabilities).

Per-device counts, with ``n = s/cp * mbs`` tokens of a micro-batch on one dense rank and ``k``
= top-k, under balanced routing (every expert gets ``n_total * k / E`` copies):

* token copies one expert-rank processes: ``rows = n * k * etp / tp`` (the ``dp*cp*tp`` dense
  ranks of a stage hold ``dp*mbs*s`` tokens and form ``edp*ep*etp`` expert ranks; each copy is
  seen by the ``etp`` ranks of its expert) - independent of ``ep``, so expert parallelism
  shrinks expert weights, never these activations;
* expert intermediate activations: ``rows * moe_ffn / etp = n * k * moe_ffn / tp``;
* :func:`token_factor` scales ``rows`` for the busiest rank: the routing skew
  (``TrainSpec.moe_token_imbalance``, 1 under forced balance), capped by a dropping capacity
  factor, or the padded capacity: the memory and time peaks follow it.

Megatron-Core's own estimate (``megatron/training/theoretical_memory_usage.py``) uses the same
balanced top-k count.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs import TrainSpec

BF16 = 2
FP32 = 4


def tokens(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Tokens of one micro-batch on one dense rank before SP: (s / cp) * mbs."""
    return p.train.seq_len / batch.cp * batch.mbs


def sp_shard(batch: LayoutBatch) -> np.ndarray:
    return np.where(batch.sp, batch.tp, 1)


def token_factor(train: TrainSpec) -> float:
    """Token copies on the busiest expert rank over the balanced share (>= 1).

    The routing skew is ``TrainSpec.moe_token_imbalance``, or 1 under ``MoeRuntime.force_balance``
    (Megatron ``--moe-router-force-load-balancing``: the router's scores are replaced by uniform
    random ones). A capacity factor ``C`` (Megatron-Core ``moe_utils.apply_router_token_dropping``)
    drops the tokens above ``C`` times an expert's share: ``min(C, skew)``; padded to capacity
    (``--moe-pad-expert-input-to-capacity``) every expert computes ``C`` times its share."""
    moe = train.moe
    skew = 1.0 if moe.force_balance else train.moe_token_imbalance
    if moe.capacity_factor is None:
        return skew
    return moe.capacity_factor if moe.pad_to_capacity else min(moe.capacity_factor, skew)


def processed_fraction(train: TrainSpec) -> float:
    """Share of the routed token copies the experts compute under balanced routing, in (0, 1]:
    ``min(1, C)`` for a capacity factor ``C``, 1 dropless.

    Megatron-Core ``moe_utils.apply_router_token_dropping``: an expert keeps at most ``C`` times
    its balanced share (``n*k/E`` copies), so below ``C`` = 1 a ``1 - C`` share is dropped and never
    computed; padding to capacity (``--moe-pad-expert-input-to-capacity``) adds rows that are not
    tokens at all. The numerator of MFU counts these processed copies only (model FLOPs are the
    FLOPs of the tokens the model computes), so a small capacity factor cannot lift MFU above 100%.
    Megatron-LM's own ``num_floating_point_operations`` (``megatron/training/training.py``,
    ``num_experts_routed_to = args.moe_router_topk``) ignores the capacity: its TFLOP/s/GPU counts
    dropped copies as work done."""
    factor = train.moe.capacity_factor
    return 1.0 if factor is None else min(1.0, factor)


def expert_rows(p: Problem, batch: LayoutBatch, imbalance: bool = True) -> np.ndarray:
    """Token copies the busiest expert-rank processes per micro-batch: ``n*k*etp/tp`` times
    :func:`token_factor` (module docstring); ``imbalance=False`` gives the balanced share of the
    copies the experts compute (:func:`processed_fraction`: dropped copies excluded), for model FLOPs."""
    m = p.model
    factor = token_factor(p.train) if imbalance else processed_fraction(p.train)
    return tokens(p, batch) * m.num_experts_per_tok * batch.etp / batch.tp * factor


def routed_expert_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Saved activations of the routed experts per MoE layer and micro-batch: the gathered fc1
    input (``rows x h``) and the fc1 output / activation (SwiGLU: 2f in + f out = 6 B per unit of
    width per row; GeLU 4 B) on the ``moe_ffn/etp`` slice. For ``k`` = 1 and tp = etp = 1 this is
    exactly a dense MLP of width ``moe_ffn`` (Korthikanti et al. 2022, sec. 4.1). Under fp8
    (Megatron-LM / TE ``GroupedLinear``) the fc1 and fc2 inputs are kept as their 1-byte fp8
    copies (:func:`autopar.cost.activations.linear_input_bytes`): ``rows*h + 5 rows*f`` bytes."""
    from autopar.cost.activations import linear_input_bytes

    m = p.model
    rows = expert_rows(p, batch)
    lin = linear_input_bytes(p)
    per_ffn = (4 if m.gated_mlp else 2) + lin
    return lin * rows * m.hidden_size + per_ffn * rows * m.moe_ffn_hidden_size / batch.etp


def moe_block_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Everything a MoE layer's MLP block keeps besides its input norm: fp32 router logits and
    scores (``2 x 4 x n*E`` on the SP shard), the routed experts, and the shared experts (a
    TP-split dense MLP of width ``shared_ffn``). Megatron-Core ``router.py``, ``shared_experts.py``.

    Megatron-Core since core_v0.13.0 multiplies the routing probabilities into the expert
    activation (``experts.py`` ``TEGroupedMLP.forward``: ``weighted_bias_swiglu_impl(fc1_output,
    bias, permuted_probs)``, or ``activation_func_with_probs``) and unpermutes without them, so
    the combine keeps nothing. Other frameworks (``TrainSpec.framework``) are costed as
    Megatron-Core 0.12 ran it: ``moe_utils.unpermute(..., probs)`` keeps its input, ``k`` copies
    of the SP shard (``2*n*k*h/shard`` bytes), to differentiate the probabilities."""
    m = p.model
    n, shard = tokens(p, batch), sp_shard(batch)
    router = 2 * FP32 * n * m.num_experts / shard
    combine = 0.0 if p.train.framework == "megatron" else BF16 * n * m.num_experts_per_tok * m.hidden_size / shard
    return router + routed_expert_bytes(p, batch) + combine + shared_expert_bytes(p, batch)


def shared_expert_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Saved activations of the shared experts per MoE layer and micro-batch: a TP-split dense
    MLP of width ``shared_ffn`` on the gathered input (which the router and dispatcher keep
    anyway): fc1 output and activation, 6 B (SwiGLU) or 4 B per unit of width per token."""
    m = p.model
    per_ffn = 6 if m.gated_mlp else 4
    return per_ffn * tokens(p, batch) * m.shared_expert_ffn_hidden_size / batch.tp


def dispatcher_buffer_bytes(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Transient buffers of one MoE layer at a time (freed after it, so counted once per stage,
    not per layer or micro-batch): the permuted copies sent by the all-to-all (``n*k/shard``
    rows) and the expert output before its reduce-scatter and all-to-all back (``rows``)."""
    if not p.model.is_moe:
        return np.zeros(len(batch))
    h = p.model.hidden_size
    sent = tokens(p, batch) * p.model.num_experts_per_tok / sp_shard(batch)
    return BF16 * h * (sent + expert_rows(p, batch))


def expert_gemm_shapes(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local experts, padded rows per local expert, useful rows per local expert) of the grouped
    GEMM on the busiest rank; rows are padded to the M tile
    (:func:`autopar.cost.grouped_gemm.padded_rows`: tile quantisation makes small per-expert GEMMs slow)."""
    from autopar.cost.grouped_gemm import padded_rows

    local = p.model.num_experts / batch.ep
    rows = expert_rows(p, batch) / local
    return local, padded_rows(rows), rows


def all_to_all_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """One all-to-all (dispatch or combine) of a MoE layer over the ``ep`` group.

    Each rank sends its ``n*k/shard`` permuted copies of ``h`` (bf16), a ``1/ep`` share to each
    member. Group placement follows Megatron's expert rank order ``tp-ep-dp-pp`` with ``etp`` in
    place of ``tp`` (``parallel_state.initialize_model_parallel``: ``RankGenerator(tp=etp,
    ep=ep, ...)``): ep members are ``etp`` ranks apart. Bytes to a member in the same fast domain
    go over NVLink, bytes to other nodes over the rank's own NIC, concurrently
    (:func:`autopar.cost.comm.all_to_all_s`).
    """
    m = p.model
    num_bytes = BF16 * tokens(p, batch) * m.num_experts_per_tok * m.hidden_size / sp_shard(batch)
    return comm.all_to_all_s(p, num_bytes * token_factor(p.train), batch.ep, batch.etp)


def mlp_tp_collective_pairs(p: Problem) -> int:
    """Dense-TP collective pairs of a MoE layer's MLP block per pass (with SP an all-gather before
    and a reduce-scatter after it; without SP two all-reduces): 0 or 1. A dense layer has 1.

    Megatron-Core (``TrainSpec.framework='megatron'``) hands the sequence-parallel shard
    ``[S/TP, B, H]`` straight to the router and the token dispatcher (``token_dispatcher.py``:
    "num_local_tokens: S/TP*B"; ``MoEAlltoAllTokenDispatcher``: permute -> A2A(EP) -> AG(expert
    TP) -> sort_chunks, and back), so the routed experts add no dense-TP collective: their
    expert-TP all-gather / reduce-scatter are :func:`layer_comm_s`'s ``etp`` terms. Only shared
    experts, a TP-split MLP with sequence-parallel linears (``shared_experts.py``), gather and
    reduce-scatter over the TP group: 1 pair. Other frameworks keep the dense MLP's pair (their
    MoE TP plans are not modelled apart).
    """
    if p.train.framework == "megatron" and not p.model.shared_expert_ffn_hidden_size:
        return 0
    return 1


def layer_comm_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """EP and ETP communication of one MoE layer per micro-batch, forward + backward, none of it
    hidden: two passes of :func:`autopar.cost.moe_dispatch.pass_comm_s` (dispatch and combine,
    and with ``etp > 1`` the all-gather / reduce-scatter of the expert inputs and outputs). What
    the layout's overlaps hide: :func:`autopar.cost.moe_dispatch.exposed_layer_comm_s`."""
    from autopar.cost.moe_dispatch import pass_comm_s

    return 2 * pass_comm_s(p, batch)
