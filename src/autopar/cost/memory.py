"""Per-device peak memory of each pipeline stage, as a breakdown (bytes).

Model states (Megatron-LM ``theoretical_memory_usage.py``; Rajbhandari et al., "ZeRO", SC'20,
section 5 and figure 1), per parameter with bf16 weights (2 B), ``grad_dtype`` main gradients
(fp32 = 4 B) and Adam's fp32 master weights + m + v (12 B), over a sharding group of N ranks:

====== ============================ =====================================
zero   meaning                      bytes per parameter (fp32 grads)
====== ============================ =====================================
0      plain DDP                    2 + 4 + 12 = 18
1      Megatron distributed opt.    2 + 4 + 12/N  (= 6 + 12/dp)
2      + gradients sharded          2 + (4 + 12)/N
3      + weights sharded (FSDP)     (2 + 4 + 12)/N, plus two gathered layers
====== ============================ =====================================

N is dp*cp for dense parameters (Megatron's distributed optimizer shards over the DP x CP
group) and the expert-data-parallel size world/(etp*ep*pp) for routed experts. The 12 B become
``main_params + exp_avg + exp_avg_sq`` bytes with Megatron's precision-aware optimizer, times
the share not offloaded to the host (``TrainSpec``, :mod:`autopar.cost.offload`).

Frameworks other than Megatron-LM (``TrainSpec.framework``: DeepSpeed's 16-bit gradients and
BF16_Optimizer fp32 buffer, torchtitan's fp32 FSDP2 shards, per-op selective recompute and fp32
loss, allocator reserve) change these terms through :mod:`autopar.cost.framework_memory`.

fp8 training adds an fp8 copy and transpose of the linear weights (:mod:`autopar.cost.fp8`,
counted in ``weights_bytes``). MoE dispatcher buffers (:mod:`autopar.cost.moe`) and the MTP
block on the last stage (:mod:`autopar.cost.mtp`) add to the activations.

Activations: :mod:`autopar.cost.activations` per layer and micro-batch, times the
micro-batches a stage holds in flight under its schedule (Narayanan et al., SC'21, sec. 2.2.1:
1F1B stage ``i`` holds ``pp - i``; interleaved rank ``i`` runs ``2*(pp-i-1) + (vpp-1)*pp + 1``
warm-up chunks, which gives Megatron's ``1 + (pp-1)/(pp*vpp)`` factor on stage 0; GPipe, Galvatron's
``pipeline_type`` gpipe, runs every forward before the first backward, so every stage holds all
``num_microbatches``: Huang et al., NeurIPS 2019, sec. 2.3; Galvatron ``pipeline.py``
``gpipe_forward`` / ``gpipe_backward``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from autopar.cost import activation_offload, cuda_graph, fp8, fp8_bf16_layers, grad_accumulation, mtp, tp_overlap, vocab
from autopar.cost import activations as act
from autopar.cost import framework_memory as fw_mem
from autopar.cost import moe as moe_cost
from autopar.cost.params import StageParams, layer_kinds, stage_params
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.v_cost import v_in_flight_microbatches
from autopar.problem import Problem

OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights + Adam m + v


@dataclass
class MemoryBreakdown:
    """Bytes on one device of one stage, per (layout, stage) row (arrays of shape ``(n,)``)."""

    params: np.ndarray
    weights_bytes: np.ndarray
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray

    @property
    def total_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes


def model_state_bytes(count, group, zero, weight_bytes, grad_bytes, optimizer_bytes=OPTIMIZER_BYTES_PER_PARAM,
                      unsharded_grad_bytes=0) -> tuple:
    """(weights, gradients, optimizer state) bytes of ``count`` parameters on one device.

    ZeRO stage ``zero`` (array or int) shards the optimizer state (>= 1), the gradients (>= 2)
    and the weights (3) over ``group`` ranks; see the table in the module docstring. Example:
    zero 1 with bf16 weights and fp32 grads gives 2 + 4 + 12/N bytes per parameter.
    ``unsharded_grad_bytes`` per parameter are never sharded (DeepSpeed BF16_Optimizer's fp32
    accumulation buffer); the per-framework byte counts come from
    :func:`autopar.cost.framework_memory.state_bytes_per_param`.
    """
    zero = np.asarray(zero)
    weights = count * weight_bytes / np.where(zero >= 3, group, 1)
    grads = count * grad_bytes / np.where(zero >= 2, group, 1) + count * unsharded_grad_bytes
    optimizer = count * optimizer_bytes / np.where(zero >= 1, group, 1)
    return weights, grads, optimizer


def in_flight_microbatches(batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Micro-batches' worth of activations a stage holds at its peak (may be fractional with
    interleaving: chunks in flight divided by vpp; a layout's own count where ``stages.in_flight``
    is set, :func:`autopar.cost.stage.all_stages`)."""
    if stages.in_flight is not None:
        return stages.in_flight.astype(np.float64)
    one_f_one_b = np.minimum(batch.pp - stages.index, batch.num_microbatches)
    chunks = 2 * (batch.pp - stages.index - 1) + (batch.vpp - 1) * batch.pp + 1
    chunks = np.minimum(chunks, batch.num_microbatches * batch.vpp)
    one_f_one_b = np.where(batch.gpipe, batch.num_microbatches, one_f_one_b)  # GPipe: every micro-batch
    count = np.where(batch.vpp > 1, chunks / batch.vpp, one_f_one_b).astype(np.float64)
    if np.any(batch.v_shaped):  # ZB-V / DualPipeV: counted along their op orders
        v_count = v_in_flight_microbatches(batch.v_schedule, batch.pp, batch.num_microbatches, stages.index)
        count = np.where(batch.v_shaped, v_count, count)
    return count


@dataclass
class LayerBytes:
    """Activation bytes one decoder layer saves per micro-batch, per row (``(n,)`` arrays), each
    term evaluated once (:func:`autopar.cost.activations.attention_bytes_kept_full`,
    :func:`~autopar.cost.activations.mlp_bytes_kept_full`): ``dense`` / ``moe`` under the row's
    selective recompute (torchtitan's per-op SAC on ``dense``), ``dense_megatron`` the dense layer
    under Megatron's selective recompute (what an MTP layer keeps), ``attention_full``,
    ``dense_full`` / ``moe_full`` without any recompute."""

    dense: np.ndarray
    moe: np.ndarray
    dense_megatron: np.ndarray
    attention_full: np.ndarray
    dense_full: np.ndarray
    moe_full: np.ndarray


def layer_bytes(p: Problem, batch: LayoutBatch) -> LayerBytes:
    """The :class:`LayerBytes` of each row (without full recompute; ``moe`` is ``dense`` for a dense model)."""
    selective = batch.recompute == 1
    attn, attn_full = act.attention_bytes_kept_full(p, batch, selective)
    mlp_dense, mlp_dense_full = act.mlp_bytes_kept_full(p, batch, False, selective)
    dense_megatron = attn + mlp_dense
    dense_layer = dense_megatron
    if fw_mem.op_sac(p):  # torchtitan: "selective" is per-op SAC on dense layers
        dense_layer = np.where(selective, fw_mem.op_sac_layer_bytes(p, batch), dense_layer)
    dense_full = attn_full + mlp_dense_full
    if p.model.is_moe:
        mlp_moe, mlp_moe_full = act.mlp_bytes_kept_full(p, batch, True, selective)
        moe_layer, moe_full = attn + mlp_moe, attn_full + mlp_moe_full
    else:
        moe_layer, moe_full = dense_layer, dense_full
    return LayerBytes(dense_layer, moe_layer, dense_megatron, attn_full, dense_full, moe_full)


def stored_layer_bytes(p: Problem, batch: LayoutBatch, stages: Stages, layers: LayerBytes | None = None) -> np.ndarray:
    """Activation bytes the stage's decoder layers save per micro-batch without full recompute; fp8
    training's bf16 first/last layers save their linear inputs in bf16 (:mod:`autopar.cost.fp8_bf16_layers`).
    ``layers``: the rows' :func:`layer_bytes`, computed when None."""
    n_dense, n_moe = layer_kinds(p.model, stages)
    layers = layer_bytes(p, batch) if layers is None else layers
    dense_layer, moe_layer = layers.dense, layers.moe
    out = n_dense * dense_layer + n_moe * moe_layer
    b_dense, b_moe = fp8_bf16_layers.layer_counts(p, batch, stages)
    if b_dense.any() or b_moe.any():
        bf16 = layer_bytes(fp8_bf16_layers.bf16_problem(p), batch)
        out = out + b_dense * (bf16.dense - dense_layer) + b_moe * (bf16.moe - moe_layer)
    return out


@dataclass
class ActivationParts:
    """The parts of :func:`stage_activation_bytes` that read only the layout, not the stage, per
    row (``(n,)`` arrays, bytes): the decoder layers' :class:`LayerBytes`, one layer's input
    (``layer_input``, what full recompute keeps), the backward working set of one layer
    (``working``), the embedding output and the logits/loss bytes of one micro-batch
    (``embedding``, ``output``), the MTP block's activations (``mtp``) and the MoE dispatcher's
    buffers (``dispatch``). Costed once per layout and shared by its stages (the search's three
    stage views)."""

    layers: LayerBytes
    layer_input: np.ndarray
    working: np.ndarray
    embedding: np.ndarray
    output: np.ndarray
    mtp: np.ndarray
    dispatch: np.ndarray

    def take(self, index: np.ndarray) -> "ActivationParts":
        """The rows at ``index``."""
        layers = LayerBytes(*(getattr(self.layers, f.name)[index] for f in fields(LayerBytes)))
        return ActivationParts(layers, *(getattr(self, f.name)[index] for f in fields(self)[1:]))


def activation_parts(p: Problem, batch: LayoutBatch) -> ActivationParts:
    """The stage-independent :class:`ActivationParts` of each row of ``batch``."""
    layers = layer_bytes(p, batch)
    full = batch.recompute == 2
    # Recomputing a layer in backward rebuilds that layer's activations once (no recompute).
    working = np.where(full, np.maximum(layers.dense_full, layers.moe_full), 0.0)
    working = working + act.unfused_backward_transient_bytes(p, batch)  # one layer's, in its backward
    return ActivationParts(layers, act.layer_input_bytes(p, batch), working, act.embedding_bytes(p, batch),
                           fw_mem.output_bytes(p, batch), mtp.activation_bytes(p, batch, layers),
                           moe_cost.dispatcher_buffer_bytes(p, batch))


def stage_activation_bytes(p: Problem, batch: LayoutBatch, stages: Stages,
                           parts: ActivationParts | None = None) -> np.ndarray:
    """Peak activation bytes of each (layout, stage) row, including embedding/logits terms; less what
    activation CPU offloading moves to the host (:mod:`autopar.cost.activation_offload`).
    ``parts``: the rows' :func:`activation_parts` when the caller has them (costed here when None)."""
    n_moe = layer_kinds(p.model, stages)[1]
    parts = activation_parts(p, batch) if parts is None else parts
    layers = parts.layers
    stored = stored_layer_bytes(p, batch, stages, layers)  # per micro-batch, no full recompute

    full = batch.recompute == 2
    per_chunk = np.where(batch.recompute_layers > 0, batch.recompute_layers,
                         -(-stages.layers // batch.vpp))  # ceil: the embedding/loss chunks hold one layer fewer
    recomputed = np.where(full, np.minimum(stages.layers, per_chunk * batch.vpp), 0)
    mean_layer = stored / np.maximum(stages.layers, 1)
    kept = (stages.layers - recomputed) * mean_layer + recomputed * parts.layer_input
    kept = kept - activation_offload.saved_bytes(p, stages.layers, mean_layer)

    in_flight = in_flight_microbatches(batch, stages)
    first, last = stages.is_first(), stages.is_last(batch)
    embedding_in_flight = np.where(batch.gpipe, batch.num_microbatches, np.minimum(batch.pp, batch.num_microbatches))
    embedding = np.where(first, embedding_in_flight * parts.embedding, 0.0)
    output = np.where(last, parts.output, 0.0) + np.where(stages.holds_mtp(batch), parts.mtp, 0.0)
    dispatch = np.where(n_moe > 0, parts.dispatch, 0.0)  # one MoE layer at a time
    return in_flight * kept + fw_mem.backward_transient_bytes(p, parts.working, output) + embedding + dispatch


@dataclass
class StageState:
    """Model-state bytes on one device of one stage, per (layout, stage) row (``(n,)`` arrays):
    the stage's parameters, its weights (with fp8 copies), the dense and expert gradients and
    optimizer states, and the unsharded parameters gathered at once (ZeRO-3, per framework)."""

    params: np.ndarray
    weights_bytes: np.ndarray
    dense_grads_bytes: np.ndarray
    expert_grads_bytes: np.ndarray
    dense_optimizer_bytes: np.ndarray
    expert_optimizer_bytes: np.ndarray
    gathered_bytes: np.ndarray


@dataclass
class StageBuffers:
    """Buffers allocated once per device, per (layout, stage) row (``(n,)`` arrays): TE userbuffers
    of ``--tp-comm-overlap`` (:func:`autopar.cost.tp_overlap.userbuffer_bytes`) and CUDA graphs'
    static tensors (:func:`autopar.cost.cuda_graph.static_buffer_bytes`)."""

    userbuffer_bytes: np.ndarray
    graph_bytes: np.ndarray


def stage_state(p: Problem, batch: LayoutBatch, stages: Stages) -> StageState:
    """Model-state bytes of each (layout, stage) row (see the module docstring's ZeRO table)."""
    params: StageParams = stage_params(p, batch, stages)
    state = fw_mem.state_bytes_per_param(p, batch.zero)  # (weight, grad, unsharded grad, optimizer)
    dense_group = (batch.dp * batch.cp).astype(np.float64)
    expert_group = p.world_size / (batch.etp * batch.ep * batch.pp)
    dw, dg, do = model_state_bytes(params.dense, dense_group, batch.zero, state[0], state[1], state[3], state[2])
    ew, eg, eo = model_state_bytes(params.experts, expert_group, batch.zero, state[0], state[1], state[3], state[2])
    # Galvatron's vtp/vsp: the vocabulary matrices are ZeRO-sharded over their own group (autopar.cost.vocab).
    own = vocab.own_layout(batch)
    mine = model_state_bytes(params.vocab, vocab.data_parallel_ranks(batch), batch.zero, state[0], state[1], state[3],
                             state[2])
    as_layers = model_state_bytes(params.vocab, dense_group, batch.zero, state[0], state[1], state[3], state[2])
    dw, dg, do = (x + np.where(own, a - b, 0.0) for x, a, b in zip((dw, dg, do), mine, as_layers))
    dg = dg + grad_accumulation.unsharded_grad_bytes(p, batch, params.total)  # Galvatron's no_sync accumulation
    gathered = fw_mem.unsharded_param_bytes(p, batch, params.layer_max, stages.is_first(), stages.is_last(batch),
                                            params.total)
    weights = dw + ew + fp8.extra_memory_bytes(p, batch, stages)
    n = (len(batch),)
    return StageState(*(np.broadcast_to(x, n) for x in (params.total, weights, dg, eg, do, eo, gathered)))


def stage_buffers(p: Problem, batch: LayoutBatch, stages: Stages) -> StageBuffers:
    """The once-allocated buffers of each (layout, stage) row (see :class:`StageBuffers`)."""
    graphs = cuda_graph.static_buffer_bytes(p, batch, *layer_kinds(p.model, stages), in_flight_microbatches(batch, stages))
    n = (len(batch),)
    return StageBuffers(np.broadcast_to(tp_overlap.userbuffer_bytes(p, batch), n), np.broadcast_to(graphs, n))


def assemble_memory(p: Problem, state: StageState, activations: np.ndarray, buffers: StageBuffers) -> MemoryBreakdown:
    """The memory breakdown from a stage's model state, activation bytes
    (:func:`stage_activation_bytes`) and buffers: the live tensors, plus the device's framework
    overhead, the gathered parameters, the buffers and the allocator's reserve on the tensors
    (:func:`autopar.cost.framework_memory.allocator_reserve_bytes`) as ``other_bytes``."""
    s = state
    tensors = (s.weights_bytes + s.dense_grads_bytes + s.expert_grads_bytes + s.dense_optimizer_bytes
               + s.expert_optimizer_bytes + activations + s.gathered_bytes)
    other = (p.cluster.device.framework_overhead_bytes + s.gathered_bytes + buffers.userbuffer_bytes
             + fw_mem.allocator_reserve_bytes(p, tensors) + buffers.graph_bytes)
    return MemoryBreakdown(
        params=s.params,
        weights_bytes=s.weights_bytes,
        grads_bytes=s.dense_grads_bytes + s.expert_grads_bytes,
        optimizer_bytes=s.dense_optimizer_bytes + s.expert_optimizer_bytes,
        activations_bytes=activations,
        other_bytes=np.broadcast_to(other, np.broadcast_shapes(np.shape(other), s.params.shape)).astype(np.float64),
    )


def stage_memory(p: Problem, batch: LayoutBatch, stages: Stages) -> MemoryBreakdown:
    """Memory breakdown of each (layout, stage) row. See the module docstring for formulas; the
    parts (:func:`stage_state`, :func:`stage_activation_bytes`, :func:`stage_buffers`) read
    different knobs, so the search costs each once per distinct value of what it reads."""
    return assemble_memory(p, stage_state(p, batch, stages), stage_activation_bytes(p, batch, stages),
                           stage_buffers(p, batch, stages))
