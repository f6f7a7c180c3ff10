"""Validity rules for a parallel layout, each with a name, a vectorised check and a reason.

The rules are the ones Megatron-LM enforces for these knobs (``shared/reference/ecosystem.md``
section 1.3; ``megatron/training/arguments.py::validate_args``, ``ModelParallelConfig`` and
``TransformerConfig.__post_init__``, ``parallel_state.initialize_model_parallel``), plus two
planner rules that keep useless layouts out of the ranking (``pipeline_fill``,
``zero_with_pp``). The search applies them to whole :class:`LayoutBatch` arrays and counts
rejections by the first rule that fails; ``autopar estimate`` reports every failing rule of
one layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from autopar.errors import AutoparError, LayoutError
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layout import PipelineLayout, layout_of, needs_flexible
from autopar.problem import Problem
from autopar.strategy import (
    DEFAULT_MODULE_MASK,
    V_SCHEDULE_NAMES,
    Strategy,
    default_layers_per_stage,
    module_mask,
    split_first_middle_last,
)

Check = Callable[[Problem, LayoutBatch], np.ndarray]
Reason = Callable[[Problem, Strategy], str]


@dataclass(frozen=True)
class Rule:
    """One named validity rule. ``check`` returns True where a layout passes."""

    name: str
    check: Check
    reason: Reason


def _layers(p: Problem) -> int:
    return p.model.num_layers


def _uneven_split_ok(p: Problem, b: LayoutBatch) -> np.ndarray:
    first, _, last = split_first_middle_last(np.full(len(b), _layers(p)), b.pp, b.account_embedding, b.account_loss)
    return (b.pp <= _layers(p)) & (first >= 1) & (last >= 1)


def _accounted_layers(p: Problem, b: LayoutBatch) -> np.ndarray:
    """``L' = L + e + l``: decoder layers plus the embedding / loss counted as layers."""
    return _layers(p) + b.account_embedding.astype(np.int64) + b.account_loss.astype(np.int64)


def _balanced_ok(p: Problem, b: LayoutBatch) -> np.ndarray:
    """Where :meth:`~autopar.pipeline.layout.PipelineLayout.balanced` exists for the row's (pp, vpp)
    (the flexible layout autopar uses where Megatron's default split cannot interleave)."""
    ok = np.zeros(len(b), dtype=bool)
    pairs = np.stack([b.pp, b.vpp], axis=1)
    for pp, vpp in np.unique(pairs, axis=0) if len(b) else []:
        try:
            PipelineLayout.balanced(_layers(p), int(pp), int(vpp), p.model.mtp_num_layers)
        except AutoparError:
            continue
        ok |= (b.pp == pp) & (b.vpp == vpp)
    return ok


def _embedding_loss_split_ok(p: Problem, b: LayoutBatch) -> np.ndarray:
    """Megatron-Core ``TransformerConfig.__post_init__``: ``L' % pp == 0`` and
    ``(L' / pp) % vpp == 0``; autopar also wants >= 1 decoder layer in the chunk that holds
    the embedding (loss), i.e. ``L' / (pp * vpp) >= 2`` unless one chunk holds everything."""
    total, pp, vpp = _accounted_layers(p, b), np.maximum(b.pp, 1), np.maximum(b.vpp, 1)
    whole = (total % pp == 0) & ((total // pp) % vpp == 0)
    per_chunk = total // (pp * vpp)
    return ~b.accounted | (whole & ((pp * vpp == 1) | (per_chunk >= 2)))


def _embedding_loss_reason(p: Problem, s: Strategy) -> str:
    e, l = int(s.account_for_embedding), int(s.account_for_loss)
    total = _layers(p) + e + l
    return (f"with the embedding/loss counted as layers (--account-for-embedding/loss-in-pipeline-split) "
            f"num_layers + {e} + {l} = {total} must be a multiple of pp*vpp = {s.pp}*{s.vpp} = {s.pp * s.vpp}, "
            f"with >= 2 per model chunk so the embedding and loss chunks keep a decoder layer (Megatron-Core "
            f"TransformerConfig: 'num_layers ... must be divisible by pipeline_model_parallel_size')")


def missing_modules(p: Problem) -> dict[str, str]:
    """Recompute modules the model does not have, each with what it needs (ecosystem.md 1.3 rule
    25: ``mla_up_proj`` needs MLA; ``moe_act`` needs the grouped-GEMM experts, ``moe`` MoE
    layers, ``shared_experts`` shared experts)."""
    m = p.model
    needs = {"mla_up_proj": (m.mla, "multi-latent attention"), "moe_act": (m.is_moe, "MoE layers"),
             "moe": (m.is_moe, "MoE layers"), "shared_experts": (bool(m.shared_expert_ffn_hidden_size), "shared experts")}
    return {name: what for name, (has, what) in needs.items() if not has}


def _modules_reason(p: Problem, s: Strategy) -> str:
    missing = missing_modules(p)
    bad = [f"{n} needs {missing[n]}" for n in s.recompute_modules if n in missing]
    return f"recompute_modules {','.join(s.recompute_modules)}: {'; '.join(bad)}; model {p.model.name} has none"


def _zero_with_pp_ok(p: Problem, b: LayoutBatch) -> np.ndarray:
    """ZeRO-2/3 with pp > 1: Megatron-LM runs it as Megatron-FSDP (``--use-megatron-fsdp``;
    ``validate_args`` has no pipeline check for it and ``finalize_model_grads.py`` all-reduces
    the FSDP-sharded embedding gradients across pipeline stages), reduce-scattering every
    micro-batch as :func:`autopar.cost.stage_time.dp_exposed_s` costs it; torchtitan runs FSDP2
    (zero 3) with pp; DeepSpeed's PipelineEngine refuses both stages."""
    fw = p.train.framework
    return (b.zero <= 1) | (b.pp == 1) | (fw == "megatron") | ((b.zero == 3) & (fw == "torchtitan"))


def _zero_with_pp_reason(p: Problem, s: Strategy) -> str:
    if p.train.framework == "torchtitan":
        return (f"ZeRO stage {s.zero} with pp={s.pp} on torchtitan: with pipelining torchtitan keeps each stage "
                "gathered and reduce-scatters once per step (fsdp_reshard_after_forward 'default', "
                "torchtitan/models/llama3/infra/parallelize.py), which autopar costs as zero 3; use zero 3")
    return (f"ZeRO stage {s.zero} with pp={s.pp}: DeepSpeed's PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are "
            "incompatible with pipeline parallelism' (deepspeed/runtime/pipe/engine.py); use zero <= 1 with "
            "pp > 1, or pp = 1")


def _gbs(p: Problem) -> int:
    return p.train.global_batch_size


RULES: tuple[Rule, ...] = (
    Rule(
        "world_size",
        lambda p, b: b.dp * b.tp * b.pp * b.cp == p.world_size,
        lambda p, s: f"dp*tp*pp*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp} = {s.world_size} must equal the "
        f"world size {p.world_size} ({p.cluster.num_nodes} nodes x {p.cluster.devices_per_node}) (Megatron-LM "
        "megatron/training/arguments.py: 'world size ... is not divisible by total_model_size')",
    ),
    Rule(
        "tp_divides_heads",
        lambda p, b: p.model.num_attention_heads % b.tp == 0,
        lambda p, s: f"tp={s.tp} must divide num_attention_heads={p.model.num_attention_heads} (Megatron-Core "
        "transformer_config.py: 'num_attention_heads ... must be a multiple of tensor_model_parallel_size')",
    ),
    Rule(
        "tp_divides_kv_heads",
        lambda p, b: p.model.num_kv_heads % b.tp == 0,
        lambda p, s: f"tp={s.tp} must divide num_key_value_heads={p.model.num_kv_heads} "
        "(autopar does not replicate KV heads across TP ranks; Megatron-Core transformer_config.py allows a divisor too)",
    ),
    Rule(
        "tp_divides_ffn",
        lambda p, b: (p.model.num_moe_layers == p.model.num_layers) | (p.model.ffn_hidden_size % b.tp == 0),
        lambda p, s: f"tp={s.tp} must divide ffn_hidden_size={p.model.ffn_hidden_size} (Megatron-Core "
        "ColumnParallelLinear/RowParallelLinear: divide(ffn, tp) asserts it; dense MLP layers)",
    ),
    Rule(
        "sp_needs_tp",
        lambda p, b: ~b.sp | (b.tp > 1),
        lambda p, s: "sequence parallelism (--sp) needs tp > 1 (megatron/training/arguments.py switches it off at tp=1)",
    ),
    Rule(
        "cp_divides_seq",
        lambda p, b: (b.cp == 1) | (p.train.seq_len % (2 * b.cp) == 0),
        lambda p, s: f"seq_len={p.train.seq_len} must be a multiple of 2*cp={2 * s.cp} "
        "(megatron/training/arguments.py: 'seq-length should be a multiple of 2 * context-parallel-size')",
    ),
    Rule(
        "sp_divides_seq",
        lambda p, b: ~b.sp | ((p.train.seq_len // b.cp) % b.tp == 0),
        lambda p, s: f"with sequence parallelism (on by default with tp > 1; --no-sp turns it off) "
        f"seq_len/cp={p.train.seq_len // s.cp} must be divisible by tp={s.tp}",
    ),
    Rule(
        "tp_comm_overlap_needs_sp",
        lambda p, b: ~b.tp_comm_overlap | (b.sp & (b.tp > 1)),
        lambda p, s: f"TP communication overlap (--tp-comm-overlap) needs sequence parallelism with tp > 1 (got "
        f"tp={s.tp}, sp={'on' if s.sp else 'off'}): Megatron-LM arguments.py asserts sequence_parallel, MindSpeed's "
        "MC2 and torchtitan's async TP overlap the SP all-gather / reduce-scatter",
    ),
    Rule(
        "tp_comm_overlap_in_node",
        lambda p, b: ~b.tp_comm_overlap | (b.tp <= p.cluster.fast_domain_size),
        lambda p, s: f"TP communication overlap with tp={s.tp} spans more than one NVLink domain of "
        f"{p.cluster.fast_domain_size} devices: Transformer Engine's userbuffers (CUDA multicast / IPC; TE issue "
        "#1071) and PyTorch's symmetric memory for async TP work within one domain only",
    ),
    Rule(
        "cp_a2a_divides_cp",
        lambda p, b: b.cp % b.cp_a2a == 0,
        lambda p, s: f"the all-to-all group of context parallelism ({s.cp_a2a_size}) must divide cp={s.cp} "
        "(Megatron --hierarchical-context-parallel-sizes multiply to cp)",
    ),
    Rule(
        "cp_a2a_divides_heads",
        lambda p, b: (b.cp_a2a == 1) | ((p.model.num_attention_heads // b.tp) % b.cp_a2a == 0),
        lambda p, s: f"context parallelism {s.cp_comm_type} scatters the attention heads over {s.cp_a2a_size} ranks: "
        f"num_attention_heads/tp = {p.model.num_attention_heads}/{s.tp} must be divisible by it "
        "(TransformerEngine context_parallel.py AttnFuncWithCPAndQKVOA2A; MindSpeed arguments.py ulysses_cp_algo)",
    ),
    Rule(
        "pp_le_layers",
        lambda p, b: b.pp <= _layers(p),
        lambda p, s: f"pp={s.pp} exceeds num_layers={_layers(p)}",
    ),
    Rule(
        "interleaved_needs_pp",
        lambda p, b: (b.vpp == 1) | (b.pp > 1),
        lambda p, s: f"vpp={s.vpp} (interleaved schedule) needs pp > 1",
    ),
    Rule(
        "interleaved_layer_split",
        lambda p, b: (b.vpp == 1) | b.accounted | ~needs_flexible(_layers(p), b.pp, b.vpp) | _balanced_ok(p, b),
        lambda p, s: f"num_layers={_layers(p)} with {p.model.mtp_num_layers} MTP layers has no layout over "
        f"pp={s.pp} x vpp={s.vpp} chunks: neither num_layers/pp = {_layers(p) / s.pp:g} splits over vpp={s.vpp} "
        "chunks nor does a flexible layout (--pipeline-layout) give each rank a decoder layer and room for the "
        "embedding, MTP layers and loss",
    ),
    Rule("embedding_loss_split", _embedding_loss_split_ok, _embedding_loss_reason),
    Rule(
        "uneven_layer_split",
        _uneven_split_ok,
        lambda p, s: f"num_layers={_layers(p)} cannot be split over pp={s.pp} stages with "
        "non-empty first and last stages",
    ),
    Rule(
        "gbs_divisible",
        lambda p, b: _gbs(p) % (b.mbs * b.dp) == 0,
        lambda p, s: f"global batch size {_gbs(p)} must be divisible by mbs*dp = {s.mbs}*{s.dp} = "
        f"{s.mbs * s.dp} (megatron/core/num_microbatches_calculator.py: 'global batch size ... is not divisible by "
        "micro batch size ... times data parallel size')",
    ),
    Rule(
        "interleaved_microbatches",
        lambda p, b: ~b.interleaved | (b.num_microbatches % b.pp == 0),
        lambda p, s: f"the interleaved schedule needs num_microbatches={s.num_microbatches(_gbs(p))} "
        f"to be a multiple of pp={s.pp} (autopar's interleaved schedule runs whole groups of pp micro-batches; "
        "Megatron-LM main runs a final partial group, megatron/core/pipeline_parallel/schedules.py)",
    ),
    Rule(
        "pipeline_fill",
        lambda p, b: (b.pp == 1) | (b.num_microbatches >= b.pp),
        lambda p, s: f"num_microbatches={s.num_microbatches(_gbs(p))} is below pp={s.pp}: the "
        "pipeline never fills (most stages idle)",
    ),
    Rule("zero_with_pp", _zero_with_pp_ok, _zero_with_pp_reason),
    Rule(
        "recompute_layers",
        lambda p, b: (b.recompute_layers == 0)
        | ((b.recompute == 2) & (b.recompute_layers * b.vpp * b.pp <= _accounted_layers(p, b))),
        lambda p, s: f"recompute_layers={s.recompute_layers} needs --recompute full and at most "
        f"num_layers/(pp*vpp) = {(_layers(p) + s.account_for_embedding + s.account_for_loss) // (s.pp * s.vpp)} "
        "layers per model chunk (the embedding/loss counted as layers where the split does)",
    ),
    Rule(
        "ep_needs_experts",
        lambda p, b: (b.ep == 1) | ((p.model.num_experts > 0) & (p.model.num_experts % b.ep == 0)),
        lambda p, s: f"ep={s.ep} must divide the number of routed experts "
        f"({p.model.num_experts}; 0 means a dense model, where ep must be 1)",
    ),
    Rule(
        "expert_grid",
        lambda p, b: p.world_size % (b.etp * b.ep * b.pp) == 0,
        lambda p, s: f"etp*ep*pp = {s.expert_tp}*{s.ep}*{s.pp} = {s.expert_tp * s.ep * s.pp} must divide the "
        f"world size {p.world_size}, i.e. etp*ep must divide the dense grid dp*cp*tp = {s.dp * s.cp * s.tp} "
        "(Megatron-Core parallel_state: 'world_size is not divisible by "
        f"expert_tensor_model_pipeline_parallel size'; etp is {s.expert_tp} here, Megatron's default when unset "
        f"is tp = {s.tp})",
    ),
    Rule(
        "etp_divides_moe_ffn",
        lambda p, b: (p.model.num_experts == 0) | (p.model.moe_ffn_hidden_size % b.etp == 0),
        lambda p, s: f"etp={s.expert_tp} must divide moe_ffn_hidden_size={p.model.moe_ffn_hidden_size} "
        "(expert fc1/fc2 are split over expert tensor parallelism)",
    ),
    Rule(
        "moe_tp_needs_sp",
        lambda p, b: (p.model.num_experts == 0) | (b.tp == 1) | b.sp,
        lambda p, s: f"a MoE model with tp={s.tp} needs sequence parallelism (--sp): Megatron-Core "
        "MoELayer raises 'performance may degrade if MoE and tensor parallelism are enabled "
        "without also enabling sequence parallelism' in training",
    ),
    Rule(
        "recompute_modules_in_model",
        lambda p, b: (b.recompute_modules & module_mask(tuple(missing_modules(p)))) == 0,
        _modules_reason,
    ),
    Rule(
        "recompute_modules_megatron",
        lambda p, b: (b.recompute_modules == DEFAULT_MODULE_MASK) | (p.train.framework == "megatron"),
        lambda p, s: f"recompute_modules {','.join(s.recompute_modules)} is Megatron-LM's --recompute-modules; "
        f"{p.train.framework} recomputes its own way (leave the default core_attn)",
    ),
    Rule(
        "fp8_param_gather_needs_sharding",
        lambda p, b: (b.zero >= 1) | (not p.train.fp8_param_storage),
        lambda p, s: f"fp8 parameter storage (--fp8-param-gather) with zero={s.zero}: Megatron-LM asserts "
        "'--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp' "
        "(arguments.py); use zero >= 1",
    ),
    Rule(
        "activation_offload_pp1_no_recompute",
        lambda p, b: (p.train.activation_offload_layers == 0) | ((b.pp == 1) & (b.recompute == 0)),
        lambda p, s: f"activation offloading ({p.train.activation_offload_layers} layers) with pp={s.pp}, "
        f"recompute={s.recompute}: Megatron-Core's CPU offloading runs with pp 1 and no recompute "
        "(shared/reference/ecosystem.md rule 27; autopar.cost.activation_offload); use pp 1 and recompute none",
    ),
    Rule(
        "cuda_graph_no_full_recompute",
        lambda p, b: (b.recompute != 2) | (p.train.cuda_graph_impl == "none")
        | ("full_iteration" in p.train.cuda_graph_scope),
        lambda p, s: f"CUDA graphs (--cuda-graph-impl {p.train.cuda_graph_impl}) with recompute=full: Megatron-LM "
        "main asserts 'full recompute is only supported with full iteration CUDA graph.' "
        "(megatron/core/transformer/transformer_config.py); use recompute selective or none",
    ),
    Rule(
        "fp8_bf16_layers_per_stage",
        lambda p, b: max(p.train.bf16_end_layers) <= _layers(p) // b.pp,
        lambda p, s: f"fp8 bf16 layers {p.train.bf16_end_layers[0]},{p.train.bf16_end_layers[1]} with pp={s.pp}: "
        f"Megatron-Core allows at most num_layers // pp = {_layers(p) // s.pp} bf16 layers at each end "
        "(transformer_config.py __post_init__; autopar.cost.fp8_bf16_layers)",
    ),
    Rule(
        "window_attention_cp",
        lambda p, b: (b.cp == 1) | (not p.model.window_layers),
        lambda p, s: f"cp={s.cp} with model {p.model.name}'s sliding-window layers: autopar costs context "
        "parallelism as Transformer Engine's p2p ring, which asserts 'The context parallel running configs cannot "
        "support sliding window attention' (TE attention/dot_product_attention/context_parallel.py: window "
        "layers need cp_comm_type a2a or all_gather); use cp=1",
    ),
    # Galvatron's own knobs (Strategy.vocab_tp / tp_consecutive / schedule gpipe; autopar.export.galvatron).
    Rule(
        "vocab_tp_in_stage",
        lambda p, b: (b.tp * b.dp * b.cp) % b.vocab_tp == 0,
        lambda p, s: f"vocab_tp={s.vocab_tp_size} must divide the ranks of a pipeline stage, tp*dp*cp = "
        f"{s.tp * s.dp * s.cp} (Galvatron: the vocabulary layers' TP group lies inside the stage, their data "
        "parallelism is the rest)",
    ),
    Rule(
        "vocab_tp_whole_samples",
        lambda p, b: ((b.mbs * b.vocab_tp) % b.tp == 0) & (~b.vocab_sp | (p.train.seq_len % b.vocab_tp == 0)),
        lambda p, s: f"vocab_tp={s.vocab_tp_size} with tp={s.tp}, mbs={s.mbs}: a vocabulary rank gets mbs*vocab_tp/tp = "
        f"{s.mbs * s.vocab_tp_size / s.tp:g} sequences per micro-batch, which must be a whole number (Galvatron "
        "chunks each rank's batch, global_bsz / (world/pp/vtp), into 'chunks' micro-batches; torch.chunk makes fewer "
        "otherwise)" + (f", and vocab_sp splits seq_len={p.train.seq_len} over {s.vocab_tp_size} ranks" if s.vocab_sp
                        else ""),
    ),
    Rule(
        "tp_consecutive_needs_cp1",
        lambda p, b: b.tp_consecutive | (b.cp == 1),
        lambda p, s: f"tp_consecutive=False with cp={s.cp}: Galvatron's non-consecutive TP groups stride over the "
        "data-parallel ranks of a stage, which has no context parallelism in Galvatron 2.4.0; use cp=1",
    ),
    # torchtitan's V schedules (torch.distributed.pipelining ScheduleZBVZeroBubble / ScheduleDualPipeV).
    Rule(
        "v_schedule_two_chunks",
        lambda p, b: ~b.v_shaped | ((b.vpp == 2) & (b.pp > 1)),
        lambda p, s: f"schedule {s.schedule} with pp={s.pp}, vpp={s.vpp}: the V schedules run exactly 2 model chunks "
        "per pipeline rank over pp > 1 ranks (PyTorch ScheduleZBVZeroBubble: 'requires exactly 2 stages per rank')",
    ),
    Rule(
        "v_schedule_even_chunks",
        lambda p, b: ~b.v_shaped | ((_layers(p) % (2 * b.pp) == 0) & ~b.accounted),
        lambda p, s: f"schedule {s.schedule}: num_layers={_layers(p)} must split into 2 * pp = {2 * s.pp} equal "
        "chunks with no embedding/loss accounting (autopar writes flexible layouts in the interleaved order only)",
    ),
    Rule(
        "dualpipev_microbatches",
        lambda p, b: ~b.v_schedule_is("dualpipev") | (b.num_microbatches >= 2 * b.pp),
        lambda p, s: f"schedule dualpipev needs num_microbatches={s.num_microbatches(_gbs(p))} >= 2 * pp = {2 * s.pp} "
        "(PyTorch ScheduleDualPipeV: 'requires at least as many microbatches as stages')",
    ),
    Rule(
        "gpipe_one_chunk",
        lambda p, b: ~b.gpipe | (b.vpp == 1),
        lambda p, s: f"schedule gpipe with vpp={s.vpp}: GPipe runs one model chunk per pipeline rank",
    ),
)

from autopar.rules_moe import MOE_RULES  # noqa: E402 (the MoE choices' rules build on Rule above)

RULES = RULES + MOE_RULES
RULE_NAMES: tuple[str, ...] = tuple(r.name for r in RULES)


# The rules that refuse a tp for the model's own shape (heads, KV heads, dense and expert FFN
# widths), whatever the rest of the layout: a suggested tp must pass all of them.
MODEL_TP_RULES: tuple[str, ...] = ("tp_divides_heads", "tp_divides_kv_heads", "tp_divides_ffn", "etp_divides_moe_ffn")


def model_tp_values(p: Problem, candidates: list[int], etp: int | None = None) -> list[int]:
    """The tp values among ``candidates`` that pass every rule of :data:`MODEL_TP_RULES`.

    Args:
        p: the problem (its model's heads, KV heads and FFN widths decide).
        candidates: tp values to try, e.g. the divisors of world / (pp * cp).
        etp: the expert tensor-parallel size given, or None (Megatron-Core: etp = tp).
    Returns:
        The passing values, in the order given (e.g. tp 16 is dropped for 8 KV heads).
    """
    if not candidates:
        return []
    batch = LayoutBatch.concat([LayoutBatch.from_strategy(Strategy(dp=1, tp=tp, etp=etp), p.train.global_batch_size)
                                for tp in candidates])
    ok = np.ones(len(candidates), dtype=bool)
    for rule in RULES:
        if rule.name in MODEL_TP_RULES:
            ok &= np.asarray(rule.check(p, batch), dtype=bool)
    return [tp for tp, passes in zip(candidates, ok) if passes]


def first_failure(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Index into :data:`RULES` of the first rule each layout fails, or -1 if it passes all."""
    failed = np.full(len(batch), -1, dtype=np.int64)
    for index, rule in enumerate(RULES):
        bad = (failed < 0) & ~np.asarray(rule.check(p, batch), dtype=bool)
        failed[bad] = index
    return failed


def _explicit_split_reasons(p: Problem, s: Strategy) -> list[str]:
    """Why an explicit split (``pipeline_layout`` or ``layers_per_stage``) is invalid, if it is."""
    if s.pipeline_layout is not None:
        try:
            layout_of(p, s)
        except AutoparError as err:
            return [str(err)]
        return []
    if s.layers_per_stage is None:
        return []
    stages = s.layers_per_stage
    if s.account_for_embedding or s.account_for_loss:  # the flags fix the split (ecosystem.md 1.3 rule 22)
        derived = default_layers_per_stage(_layers(p), s.pp, s.account_for_embedding, s.account_for_loss)
        if derived is not None and tuple(stages) != derived:
            return [f"layers_per_stage {','.join(map(str, stages))} with the embedding/loss counted as layers: "
                    f"Megatron derives the split itself ({','.join(map(str, derived))}) and cannot combine "
                    "--account-for-embedding/loss-in-pipeline-split with --decoder-first/last-pipeline-num-layers"]
        return []
    reasons = []
    if len(stages) != s.pp:
        reasons.append(f"layers_per_stage has {len(stages)} entries but pp={s.pp}")
    if sum(stages) != _layers(p):
        reasons.append(f"layers_per_stage {','.join(map(str, stages))} sums to {sum(stages)}, "
                       f"not num_layers={_layers(p)}")
    if any(n < 1 for n in stages):
        reasons.append("every stage of layers_per_stage needs >= 1 layer")
    return reasons


def check_strategy(p: Problem, s: Strategy) -> None:
    """Raise if ``s`` breaks any rule, naming every broken rule and why.

    Raises:
        LayoutError: one line, ``rule: reason`` for each failing rule, joined by ``; ``.
    """
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size)
    failing = [r for r in RULES if not bool(np.asarray(r.check(p, batch))[0])]
    explicit = s.pipeline_layout is not None or (s.layers_per_stage is not None
                                                 and not (s.account_for_embedding or s.account_for_loss))
    if explicit:  # an explicit split replaces the default-split rules (with the flags it must equal the default)
        failing = [r for r in failing if r.name not in {"uneven_layer_split", "interleaved_layer_split"}]
    messages = [f"{r.name}: {r.reason(p, s)}" for r in failing]
    split = _explicit_split_reasons(p, s)
    field = "pipeline_layout" if s.pipeline_layout is not None else "layers_per_stage"
    messages += [f"{field}: {m}" for m in split]
    if s.schedule not in V_SCHEDULE_NAMES and (s.schedule == "interleaved") != (s.vpp > 1):
        messages.append(f"schedule: '{s.schedule}' with vpp={s.vpp}; interleaved 1F1B is exactly vpp > 1")
    if s.schedule in V_SCHEDULE_NAMES and explicit and not split:
        chunks = layout_of(p, s).decoder
        if np.ptp(chunks) or chunks.size != 2 * s.pp:
            messages.append(f"{field}: schedule {s.schedule} needs {2 * s.pp} equal chunks, got "
                            f"{chunks.T.ravel().tolist()} (autopar writes unequal chunks in the interleaved order only)")
    if messages:
        names = tuple(r.name for r in failing) + ((field,) if split else ())
        raise LayoutError("invalid layout: " + "; ".join(messages), names)
