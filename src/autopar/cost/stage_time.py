"""Time of one pipeline stage for one micro-batch, and of its data-parallel traffic.

Per micro-batch a stage runs the forward and backward (2x forward) of its layers, the
recomputed forward (full: the recomputed layers; selective: the modules of
:mod:`autopar.cost.recompute`, core attention by default), and the
collectives of its parallel groups:

* TP (Megatron, Shoeybi et al. 2019 / Korthikanti et al. 2023 sec. 4.2.2): per layer two
  all-reduces forward and two backward of the ``s/cp * b * h`` activation, or with SP the same
  volume as all-gather + reduce-scatter pairs; recomputed layers repeat the forward ones; the
  vocab-parallel embedding and output layer add one each. Forward ones exposed; the backward ones of
  the column-parallel linears run under their weight-/data-gradient GEMMs
  (``TrainSpec.tp_backward_overlap``, :mod:`autopar.cost.tp_overlap`); with the layout's
  ``tp_comm_overlap`` (TE userbuffers, torchtitan async TP, MindSpeed MC2) only the first of tp
  pipelined chunks and the excess over the GEMMs is exposed (torchtitan's also pays the device
  copies of PyTorch's symmetric-memory ops, :func:`autopar.cost.tp_overlap.symmetric_memory_copies_s`).
* CP (ring attention, Liu et al. 2023; Megatron ``cp_comm_type=p2p``; PyTorch/torchtitan
  ``context_parallel``): ``cp-1`` K/V block exchanges forward, K/V plus dK/dV backward, each
  overlapped with one ring step's attention kernel (only a step's excess is exposed; PyTorch
  gathers all K/V at step 0 instead), the final dK/dV hand-back exposed, and the per-step
  softmax-correction / gradient-accumulation passes (:func:`autopar.cost.attention.ring_exposed_s`);
  the layout's ``cp_comm_type`` a2a / allgather / a2a+p2p adds its blocking all-to-alls or
  all-gathers (:mod:`autopar.cost.cp_comm`).
* EP: all-to-all dispatch and combine of the top-k token copies per MoE layer, forward and
  backward, placed by the expert rank order (:mod:`autopar.cost.moe`); MTP layers on the last
  stage (:mod:`autopar.cost.mtp`).
* PP: one send of the stage output (sharded by SP) per micro-batch and direction.
* Host: with ``TrainSpec.launch_blocking`` (CUDA_LAUNCH_BLOCKING=1) each layer pass adds its host
  dispatch time (:func:`autopar.cost.framework.launch_blocking_host_s_per_layer`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from autopar.cost import (
    activation_offload,
    comm,
    cp_comm,
    float8_tp,
    fp8_bf16_layers,
    framework,
    grad_accumulation,
    host,
    memory,
    moe_dispatch,
    mtp,
    offload,
    placement,
    tp_overlap,
    userbuffers_sm,
    vocab,
    wgrad_accumulation,
)
from autopar.cost import attention as attn
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import moe as moe_cost
from autopar.cost import recompute as recompute_cost
from autopar.cost.params import StageParams, layer_kinds
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

RowRunner = Callable[[str, Callable[[LayoutBatch], Any], LayoutBatch], Any]  # (name, fn, rows) -> fn(rows)
ADAM_BYTES_PER_PARAM = 34  # read grad, master, m, v (16) + write master, m, v (12) + bf16 copy (2) + grad-norm pass (4)


@dataclass
class StageTime:
    """Seconds per micro-batch on one stage (arrays over (layout, stage) rows)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray
    tp_s: np.ndarray
    cp_s: np.ndarray
    ep_s: np.ndarray

    @property
    def compute_s(self) -> np.ndarray:
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def total_s(self) -> np.ndarray:
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s


def stage_time(p: Problem, batch: LayoutBatch, stages: Stages, floor: bool = False,
               once: RowRunner | None = None) -> StageTime:
    """Per-micro-batch times of each (layout, stage) row.

    ``once(name, fn, rows)``: runs the pure row terms ``fn(rows)`` (the layers' forward times,
    the EP pass), which read ``rows``' columns only (no stage); the search costs each once per
    distinct value of the columns it reads (:class:`autopar.search.distinct_rows.RowTerms`);
    None runs them on every row.

    ``floor``: instead, times whose ``total_s`` is at most the row's ``total_s`` under every
    recompute setting (:func:`without_recompute`; the search rules layouts out with it before
    choosing their recompute, :mod:`autopar.search.stream`). The row is costed without recompute,
    except that with ``tp_comm_overlap`` the TP collectives' excess over the GEMMs they hide under
    is left out (recomputed GEMMs can hide more) and so is the activation-offload exposure (it
    depends on what the recompute setting stores). Proof that each term is at most its value under
    a recompute setting ``r``: the forward and backward of the layers, the embedding, the output
    layer and MTP, the per-layer EP exposure and the backward TP collectives do not read the
    recompute columns; recompute seconds are ``>= 0``; ``r`` adds TP collective pairs
    (``recomputed_pairs``, ``selective_pairs`` ``>= 0``) and so raises every pipelined TP block,
    whose exposure with overlap is ``>= block / tp``; the CP ring's forward passes are ``layers +
    recomputed >= layers``; the EP passes are ``n_moe + (>= 0)``; the host-bound total is
    ``max(device total, host total)`` and ``r`` raises the host total (recomputed and selective
    ops ``>= 0``), as it does the per-layer launch-blocking seconds. Checked on random layouts by
    ``tests/cost/test_stage_time_floor.py``.
    """
    if floor:
        batch = without_recompute(batch)
    n_dense, n_moe = layer_kinds(p.model, stages)
    run = _every_row if once is None else once
    dense = run("layer_forward_dense", lambda b: C.layer_forward_times(p, b, moe=False), batch)
    moe = run("layer_forward_moe", lambda b: C.layer_forward_times(p, b, moe=True), batch) if p.model.is_moe else dense
    first, last = stages.is_first(), stages.is_last(batch)
    # fp8 training's bf16 first/last layers (autopar.cost.fp8_bf16_layers): their bf16-over-fp8 seconds
    bf16_fwd, bf16_bwd = fp8_bf16_layers.layer_time_deltas(p, batch, stages, dense, moe)
    layers_fwd = n_dense * dense.forward_s + n_moe * moe.forward_s + bf16_fwd
    # Megatron --tp-comm-overlap: the SMs Transformer Engine's userbuffers kernels take from the GEMMs
    # they overlap (autopar.cost.userbuffers_sm); the forward part is recomputed with its layer.
    ub_fwd, ub_bwd = 0.0, 0.0
    if userbuffers_sm.may_apply(p):
        dense_ub_fwd, dense_ub_bwd, moe_ub_fwd, moe_ub_bwd = run("userbuffers", lambda b: userbuffers_layer_s(p, b), batch)
        ub_fwd = n_dense * dense_ub_fwd + n_moe * moe_ub_fwd
        ub_bwd = n_dense * dense_ub_bwd + n_moe * moe_ub_bwd
    layers_fwd = layers_fwd + ub_fwd
    embedding_s, output_s = C.embedding_forward_time_s(p, batch), C.output_forward_time_s(p, batch)
    extra_fwd = np.where(first, embedding_s, 0.0) + np.where(last, output_s, 0.0) + np.where(
        stages.holds_mtp(batch), mtp.forward_s(p, batch, dense.forward_s, moe.forward_s, output_s, embedding_s), 0.0)
    forward = layers_fwd + extra_fwd

    full = batch.recompute == 2
    per_chunk = np.where(batch.recompute_layers > 0, batch.recompute_layers,
                         -(-stages.layers // batch.vpp))  # ceil: the embedding/loss chunks hold one layer fewer
    recomputed = np.where(full, np.minimum(stages.layers, per_chunk * batch.vpp), 0)
    mean_layer_fwd = layers_fwd / np.maximum(stages.layers, 1)
    recompute = np.where(full, recomputed * mean_layer_fwd, 0.0)
    selective = batch.recompute == 1
    recompute = recompute + np.where(selective, recompute_cost.stage_recompute_s(p, batch, dense, moe, n_dense, n_moe), 0.0)

    # Tensor parallel: (2 fwd + 2 bwd + 2 per recomputed layer) collectives of the activation;
    # a Megatron MoE layer without shared experts has only its attention's (autopar.cost.moe).
    n_tokens = F.tokens(p, batch)
    act_bytes = F.BF16 * n_tokens * p.model.hidden_size
    one_collective = comm.all_reduce_s(p, act_bytes, batch.tp, placement.tp_stride(batch))
    # A decoder layer's pair (torchtitan float8 TP: all-gathers in fp8, autopar.cost.float8_tp).
    layer_pair = float8_tp.layer_pair_s(p, batch, act_bytes, one_collective)
    moe_mlp_pairs = moe_cost.mlp_tp_collective_pairs(p)
    fwd_pairs = 2 * n_dense + (1 + moe_mlp_pairs) * n_moe
    recomputed_pairs = recomputed * fwd_pairs / np.maximum(stages.layers, 1)
    selective_pairs = np.where(selective, recompute_cost.extra_tp_collectives(p, batch, n_dense, n_moe), 0.0)
    selective_pair = float8_tp.recompute_gathers_s(p, batch, act_bytes, one_collective)
    ends = first.astype(np.float64) + last  # the embedding's and the output layer's collectives (bf16)
    tp_total = (2 * fwd_pairs + recomputed_pairs) * layer_pair + selective_pairs * selective_pair + ends * one_collective
    # Without TP overlap: the backward collectives of the column-parallel linears under their own
    # GEMMs (autopar.cost.tp_overlap); the forward ones exposed.
    bwd_dense = tp_overlap.layer_backward_tp_s(p, batch, layer_pair, tp_overlap.overlap_gemms_s(p, batch, moe=False))
    bwd_moe = tp_overlap.layer_backward_tp_s(p, batch, layer_pair,
                                             tp_overlap.overlap_gemms_s(p, batch, moe=True)[:1 + moe_mlp_pairs])
    # Galvatron's vtp/vsp: the embedding's and output layer's collectives on their own group (autopar.cost.vocab).
    # ``ends`` counts both where one stage holds both (pp 1); ``first + last`` of two bool arrays is their OR.
    vocab_extra = ends * np.where(vocab.own_layout(batch), vocab.layer_collective_s(p, batch) - one_collective, 0.0)
    tp = (fwd_pairs + recomputed_pairs) * layer_pair + selective_pairs * selective_pair \
        + ends * one_collective + n_dense * bwd_dense + n_moe * bwd_moe + vocab_extra
    # Strategy.tp_comm_overlap (TE userbuffers, torchtitan async TP, MindSpeed MC2): every collective
    # pipelined with its GEMM's chunks (autopar.cost.tp_overlap.comm_overlap_tp_s).
    if batch.tp_comm_overlap.any():
        unfused = tp_overlap.unfused_backward_s(p, fwd_pairs, one_collective)
        tp_blocks, gemm_blocks = tp_overlap.overlap_blocks(p, batch, tp_total - unfused,
                                                           n_dense, n_moe, recomputed, moe.gemm_s)
        if floor:  # no excess over the GEMMs: only the first of the tp chunks of each block
            gemm_blocks = [np.full(len(batch), np.inf)] * len(gemm_blocks)
        # torchtitan: the symmetric-memory copies of its fused collectives - per forward pair one
        # gather and one scatter, the backward dY gathers (its input-gradient scatters stay unfused),
        # the recomputed pairs, and the two gathers of each selectively recomputed layer.
        gathers = 2 * fwd_pairs + recomputed_pairs + 2 * selective_pairs
        copies = tp_overlap.symmetric_memory_copies_s(p, batch, gathers, fwd_pairs + recomputed_pairs, act_bytes)
        tp = np.where(batch.tp_comm_overlap,
                      tp_overlap.comm_overlap_tp_s(batch, tp_blocks, gemm_blocks, unfused) + vocab_extra + copies, tp)

    # Context parallel (autopar.cost.attention): per ring step the next K/V block (backward: K/V
    # and the running dK/dV) travels while the step's attention kernel runs; the excess of a step
    # is exposed, and so is the last dK/dV hand-back to its owner after backward's final step.
    # The per-step merge / gradient-accumulation passes run on the compute stream.
    m = p.model
    exposed_fwd, exposed_bwd = cp_comm.exposed_s(p, batch, dense.attention_s)
    merge_fwd_bytes, merge_bwd_bytes = attn.ring_merge_bytes(p, batch)
    fwd_passes = stages.layers + recomputed  # + the core attention Megatron's selective recompute reruns
    fwd_passes = fwd_passes + np.where(selective & recompute_cost.reruns_core_attention(p, batch), stages.layers, 0)
    cp = np.where(batch.cp > 1, fwd_passes * (exposed_fwd + C.memory_time_s(p, merge_fwd_bytes))
                  + stages.layers * (exposed_bwd + C.memory_time_s(p, merge_bwd_bytes)), 0.0)

    # Expert parallel (autopar.cost.moe, moe_dispatch): dispatch + combine forward and backward per
    # MoE layer (+ the etp gathers) less what the layout's overlaps hide, the forward half again for
    # recomputed MoE layers, the MTP layers.
    if m.is_moe:
        moe_recomputed = recomputed * n_moe / np.maximum(stages.layers, 1)
        ep_passes = n_moe + 0.5 * moe_recomputed + np.where(selective, recompute_cost.extra_ep_passes(p, batch, n_moe), 0.0)
        shared_s, routed_s = moe_dispatch.expert_compute_s(p, batch, moe.mlp_gemm_s)
        one_pass = run("moe_pass_comm", lambda b: moe_dispatch.pass_comm_s(p, b), batch)  # exposed, layer, MTP share it
        exposed = moe_dispatch.exposed_layer_comm_s(p, batch, moe.forward_s, shared_s, routed_s, one_pass)
        layer_comm = 2 * one_pass  # moe_cost.layer_comm_s
        ep = n_moe * exposed + (ep_passes - n_moe) * layer_comm
        ep = ep + np.where(stages.holds_mtp(batch), mtp.ep_comm_s(p, batch, layer_comm), 0.0)
    else:
        ep = np.zeros(len(batch))
    backward = 2 * (forward - layers_fwd) + n_dense * dense.backward() + n_moe * moe.backward() + bf16_bwd + ub_bwd
    backward = backward + wgrad_accumulation.unfused_backward_s(p, batch, stages)  # --no-gradient-accumulation-fusion
    if p.train.activation_offload_layers and not floor:  # host-link copies beyond the layers they hide under
        layers = np.maximum(stages.layers, 1)
        backward = backward + activation_offload.exposed_s(
            p, stages.layers, memory.stored_layer_bytes(p, batch, stages) / layers, layers_fwd / layers,
            (n_dense * dense.backward() + n_moe * moe.backward()) / layers)
    # Synchronous launches (CUDA_LAUNCH_BLOCKING=1): each layer pass also pays its host dispatch
    # time, once per forward and recomputed forward, twice per backward (autopar.cost.framework).
    host_per_layer = framework.launch_blocking_host_s_per_layer(p)
    if host_per_layer:
        forward = forward + stages.layers * host_per_layer
        backward = backward + 2 * stages.layers * host_per_layer
        recompute = recompute + recomputed * host_per_layer
    else:
        forward, backward, recompute = _host_bound(p, batch, n_dense, n_moe, recomputed,
                                                   (forward, backward, recompute), tp + cp + ep)
    return StageTime(forward_s=forward, backward_s=backward, recompute_s=recompute, tp_s=tp, cp_s=cp, ep_s=ep)


def _every_row(name: str, fn: Callable[[LayoutBatch], Any], rows: LayoutBatch) -> Any:
    """:func:`stage_time`'s default ``once``: ``fn(rows)`` on every row."""
    return fn(rows)


def userbuffers_layer_s(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dense forward, dense backward, MoE forward, MoE backward) seconds per micro-batch one decoder
    layer's GEMMs lose to Transformer Engine's userbuffers kernels, ``(n,)`` arrays
    (:func:`autopar.cost.userbuffers_sm.layer_extra_s` under the layer's TP collective pair; 0 where
    it does not apply; a dense model's MoE pair is its dense one). A pure row term: it reads the
    same columns on every row, so :func:`stage_time`'s ``once`` may cost it per distinct row."""
    act_bytes = F.BF16 * F.tokens(p, batch) * p.model.hidden_size
    pair = float8_tp.layer_pair_s(p, batch, act_bytes,
                                  comm.all_reduce_s(p, act_bytes, batch.tp, placement.tp_stride(batch)))
    dense_fwd, dense_bwd = userbuffers_sm.layer_extra_s(p, batch, pair, moe=False)
    if not p.model.is_moe:
        return dense_fwd, dense_bwd, dense_fwd, dense_bwd
    moe_fwd, moe_bwd = userbuffers_sm.layer_extra_s(p, batch, pair, moe=True)
    return dense_fwd, dense_bwd, moe_fwd, moe_bwd


def without_recompute(batch: LayoutBatch) -> LayoutBatch:
    """``batch`` with no activation recompute on any row (recompute, its layer count and its
    modules set to 0)."""
    none = np.zeros(len(batch), dtype=np.int64)
    return replace(batch, recompute=none, recompute_layers=none, recompute_modules=none)


def _host_bound(p: Problem, batch: LayoutBatch, n_dense, n_moe, recomputed, passes, comm_s):
    """(forward, backward, recompute) seconds raised to the host launch time when the host is
    slower than the GPU (:mod:`autopar.cost.host`): a micro-batch takes ``max(GPU, host)``; the
    excess is split over the passes in proportion to their host time."""
    forward, backward, recompute = passes
    host_fwd, host_rest = host.stage_host_s(p, batch, n_dense, n_moe, recomputed)
    host_total = host_fwd + host_rest
    excess = np.maximum(host_total - (forward + backward + recompute + comm_s), 0.0)
    share_fwd = np.divide(host_fwd, host_total, out=np.zeros_like(host_total), where=host_total > 0)
    rest = backward + recompute
    share_bwd = np.divide(backward, rest, out=np.ones_like(rest), where=rest > 0)
    extra_rest = excess * (1 - share_fwd)
    return forward + excess * share_fwd, backward + extra_rest * share_bwd, recompute + extra_rest * (1 - share_bwd)


def p2p_time_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """One pipeline send of a micro-batch's activation between adjacent stages.

    Each of the tp ranks sends only its 1/tp slice: with SP the activation is sequence-sharded;
    without SP, Megatron-LM's scatter/gather optimisation (Narayanan et al. SC'21 sec. 4.1,
    ``--scatter-gather-tensors-in-pipeline``, on by default) and DeepSpeed's pipeline engine
    (``is_pipe_partitioned = is_model_parallel``, ``PartitionedTensor``) split it across the tp
    ranks and the receiver all-gathers it over the tp group (over NVLink while tp fits in a
    node; :mod:`autopar.cost.comm` places the group).
    """
    slice_bytes = F.BF16 * F.tokens(p, batch) * p.model.hidden_size / batch.tp
    send = comm.send_recv_s(p, slice_bytes, batch.pp, batch.tp * batch.cp * batch.dp)
    gather = np.where(batch.sp, 0.0, comm.all_gather_s(p, slice_bytes * batch.tp, batch.tp, 1))
    return send + gather


def tied_embedding_grad_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Seconds per step of the all-reduce that keeps a tied embedding consistent across the
    pipeline (0 without ``pp > 1`` or without a shared copy).

    With tied input/output embeddings (or MTP modules, which reuse the input embedding on the
    last stage; DeepSeek-V3 sec. 2.2) the first and the last stage each hold the
    ``padded_vocab/tp x h`` shard, and after the backward passes of a step the two gradients
    are summed over the two-rank embedding group: Megatron-LM ``_allreduce_word_embedding_grads``
    (``core/distributed/finalize_model_grads.py``, after the data-parallel sync, not overlapped)
    and DeepSpeed's pipeline ``ReduceTiedGrads`` instruction (``runtime/pipe/engine.py``, at
    the end of the step). Every tp rank reduces its own shard over its own NIC, in the dtype of
    :func:`grad_comm_bytes`. Returns shape ``(n,)``.
    """
    m = p.model
    if not (m.tie_word_embeddings or m.mtp_num_layers > 0):
        return np.zeros(len(batch))
    shard_bytes = grad_comm_bytes(p) * p.padded_vocab(batch.tp) / batch.tp * m.hidden_size
    stride = (batch.pp - 1) * batch.tp * batch.cp * batch.dp  # first to last stage, Megatron rank order
    return np.where(batch.pp > 1, comm.all_reduce_s(p, shard_bytes, 2, np.maximum(stride, 1)), 0.0)


def grad_comm_bytes(p: Problem) -> int:
    """Bytes per gradient element on the wire of the data-parallel reduction.

    Megatron-LM: ``grad_dtype`` (fp32 main grads by default). DeepSpeed fp16 (ZeRO stage 1/2/3
    optimizers, ``stage_1_and_2.py`` / ``stage3.py``): the 16-bit ``param.grad`` is reduced as is
    (``communication_data_type`` defaults to the fp16 model dtype). DeepSpeed bf16 reduces its
    fp32 accumulation buffer (``bf16_optimizer.py``), torchtitan FSDP2 reduce-scatters in
    ``reduce_dtype=float32``: 4 B, as the default.
    """
    if p.train.framework == "deepspeed" and p.train.precision == "fp16":
        return 2
    return p.train.grad_bytes


def dp_exposed_s(p: Problem, batch: LayoutBatch, params: StageParams, t: StageTime, slack_s: np.ndarray) -> np.ndarray:
    """Data-parallel communication left exposed on one stage after overlap.

    Gradients are reduced in :func:`grad_comm_bytes` (Megatron's fp32 default), weights gathered
    in bf16, the fp8 linear weights in fp8 with fp8 parameter storage
    (:mod:`autopar.cost.fp8_param_gather`). ZeRO 0/1 (``--overlap-grad-reduce --overlap-param-gather``): the gradient
    reduction overlaps the last micro-batch's backward, the weight all-gather the first
    micro-batch's forward of the next step. ZeRO-2 reduce-scatters every micro-batch; ZeRO-3
    also gathers weights every forward and backward (one collective per layer as Megatron/torch
    FSDP; torchtitan with pp > 1 gathers once per step and reduce-scatters once, after the
    stage's last backward, exposed beyond ``slack_s``; with ``TrainSpec.framework='deepspeed'`` one per submodule, whose latencies
    :func:`autopar.cost.framework.zero3_latency_s` adds, exposed: the gathers are issued
    on the critical path before each submodule runs); one layer's gather per forward and one
    layer's reduce-scatter per backward are never hidden. ``slack_s`` is time the stage waits for
    the pipeline to drain anyway (later stages finish their last backward earlier). The
    vocabulary matrices of Galvatron's ``vtp``/``vsp`` are reduced and gathered over their own
    group by collectives of their own (:func:`autopar.cost.vocab.own_group_params`).
    """
    g = grad_comm_bytes(p)
    dense_group = batch.dp * batch.cp
    # Dense models have no expert collectives (a zero-byte ring would still pay its latency).
    expert_group = np.where(params.experts > 0, p.world_size // (batch.etp * batch.ep * batch.pp), 1)
    dp_stride = placement.dp_stride(batch)  # tp, or 1 with Galvatron's non-consecutive TP groups
    # Galvatron's vtp/vsp: the vocabulary matrices on their own group, by collectives of their own (autopar.cost.vocab).
    own_vocab = vocab.own_group_params(batch, params.vocab)
    vocab_group = np.where(own_vocab > 0, vocab.data_parallel_ranks(batch), 1)
    vocab_stride = vocab.data_parallel_stride(batch)
    layers_dense = params.dense - own_vocab
    ar = (comm.all_reduce_s(p, layers_dense * g, dense_group, dp_stride)
          + comm.all_reduce_s(p, own_vocab * g, vocab_group, vocab_stride)
          + comm.all_reduce_s(p, params.experts * g, expert_group, batch.etp * batch.ep))
    rs = (comm.reduce_scatter_s(p, layers_dense * g, dense_group, dp_stride)
          + comm.reduce_scatter_s(p, own_vocab * g, vocab_group, vocab_stride)
          + comm.reduce_scatter_s(p, params.experts * g, expert_group, batch.etp * batch.ep))
    # Weights gather in bf16, their fp8 linear ones at 1 B with fp8 parameter storage (autopar.cost.fp8_param_gather).
    ag = (comm.all_gather_s(p, layers_dense * 2 - params.fp8_dense, dense_group, dp_stride)
          + comm.all_gather_s(p, own_vocab * 2, vocab_group, vocab_stride)
          + comm.all_gather_s(p, params.experts * 2 - params.fp8_experts, expert_group, batch.etp * batch.ep))
    fwd, bwd = t.forward_s, t.backward_s + t.recompute_s
    m = batch.num_microbatches
    # DeepSpeed ZeRO-3 gathers module by module (autopar.cost.framework); only torchtitan pipelines ZeRO-3.
    layers = p.model.num_layers // batch.pp
    per_chunk = np.where(batch.recompute_layers > 0, batch.recompute_layers * batch.vpp, layers)
    recomputed = np.where(batch.recompute == 2, np.minimum(per_chunk, layers), 0)
    _, alpha = comm.group_bus_bandwidth(p, dense_group, dp_stride)
    z3_latency = framework.zero3_latency_s(p, batch, layers, recomputed, params.dense, alpha)
    # ZeRO-3 overlaps layer by layer (FSDP prefetch): the first layer's gather of a forward and the
    # last reduce-scatter of a backward have no compute to hide behind (torchtitan keeps the last
    # layer gathered into backward, ``reshard_after_forward=False``), so at least 1/layers of each
    # stays exposed per micro-batch.
    per_layer = np.maximum(layers, 1)
    if not p.train.overlap_grad_reduce:
        # Megatron-LM before --overlap-grad-reduce (2021-22, Narayanan et al. SC'21 sec. 4; Korthikanti
        # et al. sec. 6.3) and DeepSpeed's ZeRO-1 engine reduce gradients after the last backward.
        fwd, bwd, slack_s = 0.0 * fwd, 0.0 * bwd, 0.0 * slack_s
    # torchtitan FSDP2 + PP (autopar.cost.framework_memory): the stage is gathered once per step,
    # prefetched layer by layer under the first micro-batch's forward, and reduce-scattered once,
    # after its last backward (pipelining/stage.py runs FSDP's post_backward by hand then), so only
    # the pipeline-drain slack hides it.
    titan_pp = (p.train.framework == "torchtitan") & (batch.pp > 1) & (batch.zero == 3)
    # Galvatron's no_sync accumulation (TrainSpec.grad_reduce_once): one reduce-scatter per step
    # (autopar.cost.grad_accumulation).
    once = grad_accumulation.applies(p, batch)
    exposed = np.select(
        [once, batch.zero == 0, batch.zero == 1, batch.zero == 2, titan_pp],
        [grad_accumulation.exposed_s(batch, ar, ag, rs, fwd, bwd, slack_s, layers),
         np.maximum(ar - bwd - slack_s, 0.0),
         np.maximum(rs - bwd - slack_s, 0.0) + np.maximum(ag - fwd, 0.0),
         m * np.maximum(rs - bwd, 0.0) + np.maximum(ag - fwd, 0.0),
         np.maximum(ag - fwd, ag / per_layer) + np.maximum(rs - slack_s, 0.0)],
        default=m * (np.maximum(ag - fwd, ag / per_layer) + np.maximum(ag + rs - bwd, rs / per_layer) + z3_latency),
    )
    return exposed


def optimizer_time_s(p: Problem, batch: LayoutBatch, params: StageParams) -> np.ndarray:
    """Adam step over the parameters this device updates (sharded for ZeRO >= 1): memory-bound
    for the share kept on the device, plus the host-link copies of the share offloaded with
    ``--optimizer-cpu-offload`` (:func:`autopar.cost.offload.transfer_time_s`). The vocabulary
    matrices of Galvatron's ``vtp``/``vsp`` are sharded over their own group
    (:func:`autopar.cost.vocab.data_parallel_ranks`), as :mod:`autopar.cost.memory` counts them."""
    dense_group = np.where(batch.zero >= 1, batch.dp * batch.cp, 1)
    expert_group = np.where(batch.zero >= 1, p.world_size // (batch.etp * batch.ep * batch.pp), 1)
    own_vocab = vocab.own_group_params(batch, params.vocab)  # Galvatron's vtp/vsp: sharded over its own group
    vocab_group = np.where(batch.zero >= 1, vocab.data_parallel_ranks(batch), 1)
    local = (params.dense - own_vocab) / dense_group + own_vocab / vocab_group + params.experts / expert_group
    on_device = offload.device_optimizer_fraction(p) * local
    return C.memory_time_s(p, ADAM_BYTES_PER_PARAM * on_device) + offload.transfer_time_s(p, local)
