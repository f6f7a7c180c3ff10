"""DeepSpeed JSON config for Megatron-DeepSpeed: batch, ZeRO stage, precision.

Keys and rules: ``shared/reference/ecosystem.md`` 4.1 (``deepspeed/runtime/config.py``):
``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`` where
dp is the data-parallel size Megatron's ``mpu`` reports. The tensor/pipeline sizes are
Megatron-DeepSpeed flags, not JSON keys: :mod:`autopar.export.megatron_deepspeed` writes them
next to this JSON (the ``deepspeed`` export format). Refused (:func:`refusal_reason`): ZeRO-2/3
with pipeline parallelism ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
interleaved pipelines (the DeepSpeed pipeline engine has none), context parallelism other than
Ulysses (``cp_comm_type`` a2a, written as ``--ds-sequence-parallel-size cp``; not with Megatron's
``--sequence-parallel``, only with tp = pp = 1: Megatron-DeepSpeed's
``megatron/core/parallel_state.py`` ``initialize_model_parallel`` asserts it, and its
``get_batch_pipe`` never splits the sequence; the K/V heads must divide by cp), fp8, and what the Megatron-DeepSpeed arguments
cannot say (an uneven pipeline split, block recompute, model features without a flag there).
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.export.layout_flags import stage_layers
from autopar.export.per_stage import require_default_modules, require_uniform_recompute
from autopar.problem import Problem
from autopar.strategy import Strategy

# Our field -> DeepSpeed key (a rename is a change here).
KEYS = {"gbs": "train_batch_size", "mbs": "train_micro_batch_size_per_gpu", "gas": "gradient_accumulation_steps",
        "zero": "zero_optimization", "stage": "stage"}


def refusal_reason(p: Problem, s: Strategy) -> str | None:
    """Why DeepSpeed plus the Megatron-DeepSpeed arguments cannot run layout ``s`` of ``p``
    unchanged, or None.

    Sources: ecosystem.md 4.1-4.2; Megatron-DeepSpeed ``megatron/model/gpt_model.py``
    (``GPTModelPipe``: the pipeline engine partitions by transformer-layer count,
    ``partition_method='type:transformer'``, and recomputes in chunks of
    ``--checkpoint-num-layers``: "deepspeed's pipeline doesn't support the block recompute
    method"; without the pipeline, pp = 1, ``ParallelTransformer._checkpointed_forward`` in
    ``megatron/model/transformer.py`` runs ``--recompute-method block``); ``megatron/arguments.py`` (model flags: no MoE router of Megatron-core's kind, no
    MLA, no QK-norm, no bias on QKV only, no multi-token prediction); ``megatron/core/parallel_state.py``
    ``initialize_model_parallel`` (main f4157be, since the Ulysses release a2a476e: DeepSpeed's sequence
    parallelism asserts tp == pp == 1; the examples_deepspeed/sequence_parallel README says the same).
    """
    m = p.model
    missing = [name for name, on in (("MoE", m.is_moe), ("MLA", m.mla), ("QK-norm", m.qk_norm),
                                     ("QKV-only bias", m.qkv_bias and not m.linear_bias),
                                     ("multi-token prediction", m.mtp_num_layers > 0)) if on]
    if missing:  # the model's own reason first: no layout of it can be written
        return f"{m.name}: {', '.join(missing)} has no Megatron-DeepSpeed pretrain_gpt.py flag autopar can write"
    split = stage_layers(p, s)
    if s.zero >= 2 and s.pp > 1:
        return (f"zero={s.zero} with pp={s.pp}: DeepSpeed's PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are "
                "incompatible with pipeline parallelism' (deepspeed/runtime/pipe/engine.py)")
    if s.vpp > 1:
        return f"vpp={s.vpp}: the DeepSpeed pipeline engine has no interleaved schedule"
    if s.cp > 1 and s.cp_comm_type != "a2a":
        return (f"cp={s.cp} with cp_comm_type={s.cp_comm_type}: DeepSpeed's sequence parallelism is Ulysses "
                "(--ds-sequence-parallel-size, cp_comm_type a2a); it has no ring context parallelism")
    if s.cp > 1 and s.sp:
        return (f"cp={s.cp} with sequence parallelism: Megatron-DeepSpeed's --ds-sequence-parallel-size cannot be "
                "combined with --sequence-parallel (megatron/arguments.py); use --no-sp")
    if s.cp > 1 and (s.tp > 1 or s.pp > 1):
        return (f"cp={s.cp} with tp={s.tp}, pp={s.pp}: Megatron-DeepSpeed's initialize_model_parallel asserts "
                "'DeepSpeed's sequence parallel does not work with tensor parallel or pipeline parallel' "
                "(megatron/core/parallel_state.py); Ulysses (--ds-sequence-parallel-size) needs tp = pp = 1")
    if s.cp > 1 and (m.num_kv_heads // s.tp) % s.cp:
        return (f"cp={s.cp}: DeepSpeed Ulysses scatters the K/V heads too, and num_key_value_heads/tp = "
                f"{m.num_kv_heads // s.tp} is not divisible by it")
    if s.tp_comm_overlap:
        return ("tp_comm_overlap: Megatron-DeepSpeed has no --tp-comm-overlap (no Transformer Engine userbuffers); "
                "turn it off (--no-tp-comm-overlap)")
    if s.moe_dispatcher != "alltoall" or s.moe_ep_overlap:
        return (f"moe_dispatcher={s.moe_dispatcher}, moe_ep_overlap={s.moe_ep_overlap}: DeepSpeed MoE has its own "
                "all-to-all and no flex dispatcher or EP overlap switch; use alltoall without EP overlap")
    if p.train.precision == "fp8":
        return "fp8: DeepSpeed's config has no fp8 training section"
    if len(set(split)) > 1:
        return (f"split {','.join(map(str, split))}: Megatron-DeepSpeed's pipeline partitions by transformer-layer "
                "count (partition_method type:transformer); use a layer count divisible by pp")
    if s.recompute == "full" and s.recompute_layers and s.pp > 1:
        return (f"recompute_layers={s.recompute_layers} (block recompute) with pp={s.pp}: DeepSpeed's pipeline "
                "(GPTModelPipe) recomputes every layer in chunks (--checkpoint-num-layers); use full recompute of "
                "all layers, or pp=1")
    return None


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """The DeepSpeed config dict (``--deepspeed_config`` of Megatron-DeepSpeed).

    Raises:
        AutoparError: a layout DeepSpeed cannot run (:func:`refusal_reason`), or recompute per
            stage (one ``activation_checkpointing`` section for all stages).
    """
    require_uniform_recompute("DeepSpeed", s)
    require_default_modules("DeepSpeed", s)
    why = refusal_reason(p, s)
    if why:
        raise AutoparError(f"DeepSpeed cannot express this layout: {why}")
    doc: dict[str, Any] = {
        KEYS["gbs"]: p.train.global_batch_size,
        KEYS["mbs"]: s.mbs,
        KEYS["gas"]: s.num_microbatches(p.train.global_batch_size),
        KEYS["zero"]: {KEYS["stage"]: s.zero, "overlap_comm": s.zero > 0, "contiguous_gradients": s.zero > 0},
        "bf16": {"enabled": p.train.precision == "bf16"},
        "fp16": {"enabled": p.train.precision == "fp16", "loss_scale": 0},
        "gradient_clipping": 1.0,
    }
    if s.recompute == "full" and not s.recompute_layers:
        doc["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return doc


def check(doc: dict[str, Any], dp: int, pp: int) -> list[str]:
    """DeepSpeed's batch assertion and the pipeline/ZeRO rule (ecosystem.md 4.1)."""
    bad = []
    if doc[KEYS["gbs"]] != doc[KEYS["mbs"]] * doc[KEYS["gas"]] * dp:
        bad.append("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size")
    if pp > 1 and doc[KEYS["zero"]][KEYS["stage"]] >= 2:
        bad.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    return bad
