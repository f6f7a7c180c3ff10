"""Galvatron JSON of a layer-wise plan (:class:`autopar.layerwise.LayerwisePlan`): one entry per
decoder layer in every per-layer field.

Written for the reader of hetu-galvatron 2.4.0 (``galvatron/core/runtime/hybrid_parallel_config.py``:
``get_hybrid_parallel_configs_api`` -> ``read_json_config`` + ``config2strategy``), the release
that ``pip install hetu-galvatron`` installs, and for its GitHub main, which renamed ``embed_sdp``
to ``vocab_sdp`` and reads ``vcp`` / ``cp_sizes_enc``: both spellings are written, and cp = 1.
Fields: ``pp_deg``, ``pp_division`` (layers per stage), ``chunks`` (micro-batches per step, the
same for every layer), ``global_bsz``, ``pipeline_type`` (``pipedream_flush`` = 1F1B, the
schedule autopar costs), per layer ``tp_sizes_enc``, ``tp_consecutive_flags`` (1: a layer's tp
group is consecutive ranks, the placement autopar's communication model assumes),
``dp_types_enc`` (1 = ZeRO-3 / sharded data parallel on that layer, 0 = ``default_dp_type``),
``use_sp`` (1: the layer's tp ranks run DeepSpeed-Ulysses, 0: Megatron TP), ``checkpoint`` (the
layer is recomputed whole),
``cp_sizes_enc``; and ``default_dp_type`` (``ddp`` or ``zero2``), ``vtp`` / ``vsp`` / ``vcp``
(the embedding and output layer's tp, Ulysses and cp) and ``embed_sdp`` / ``vocab_sdp`` (ZeRO-3
on them). Megatron sequence parallelism is not a JSON key: it is Galvatron's runtime
``--sequence-parallel``, to pass where the plan has ``sp``.

Only Galvatron runs a different layout per layer; every other format runs one layout on all
layers and refuses a layer-wise plan (:func:`layerwise_refusal`).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from autopar.errors import AutoparError
from autopar.layerwise.plan import LayerwisePlan
from autopar.problem import Problem

RELEASE = "2.4.0"
LAYERWISE_FORMATS = ("galvatron",)
_JSON_KEY = {"pp": "pp_deg", "num_microbatches": "chunks", "tp": "tp_sizes_enc", "vocab_tp": "vtp", "ulysses": "use_sp"}
_ONE_LAYOUT = {  # format -> where it sets one layout for all layers
    "megatron": "Megatron-LM sets one --tensor-model-parallel-size, data-parallel type and recompute for every layer",
    "megatron-bridge": "Megatron-Bridge's recipe sets one tensor_model_parallel_size for every layer",
    "mindspeed": "MindSpeed-LLM sets one --tensor-model-parallel-size for every layer",
    "torchtitan": "torchtitan's [parallelism] section sets one tensor_parallel_degree and data_parallel_shard_degree "
                  "for the whole model",
    "deepspeed": "Megatron-DeepSpeed sets one --tensor-model-parallel-size and one ZeRO stage for the whole model",
    "sapp": "MindFormers sets one model_parallel degree for every layer (SAPP's offset/recompute are per stage)",
}


def layerwise_refusal(fmt: str) -> str | None:
    """Why format ``fmt`` cannot run a layer-wise plan, or None where it can (Galvatron)."""
    if fmt in LAYERWISE_FORMATS:
        return None
    why = _ONE_LAYOUT.get(fmt, f"{fmt} runs one layout for all layers")
    return f"{why}; a layer-wise plan is written only as --format galvatron"


def refusal(p: Problem) -> str | None:
    """Why Galvatron cannot run a layer-wise plan of ``p``, or None: a MoE model (2.4.0 has none)
    or fp8 (Galvatron's mixed_precision is fp32, fp16 or bf16)."""
    if p.model.is_moe:
        return (f"{p.model.name} is a MoE model: hetu-galvatron {RELEASE} has no MoE model (galvatron/models) and "
                "never reads ep_sizes_enc")
    if p.train.precision == "fp8":
        return "precision fp8: Galvatron trains in fp32, fp16 or bf16 only (its --mixed_precision choices)"
    return None


def config(p: Problem, plan: LayerwisePlan) -> dict[str, Any]:
    """The Galvatron strategy dict of ``plan``.

    Raises:
        AutoparError: the plan does not fit ``p`` (layers, world, batch), or Galvatron cannot run
            it (:func:`refusal`).
    """
    plan.check(p)
    why = refusal(p)
    if why:
        raise AutoparError(f"Galvatron cannot express this plan: {why}")
    enc = lambda values: ",".join(str(int(v)) for v in values)
    n = plan.num_layers
    sdp = int(plan.vocab_zero3)
    return {
        "pp_deg": plan.pp, "pp_division": enc(plan.layers_per_stage), "chunks": plan.num_microbatches,
        "global_bsz": p.train.global_batch_size, "pipeline_type": "pipedream_flush",
        "tp_sizes_enc": enc(plan.tp), "tp_consecutive_flags": enc([1] * n), "cp_sizes_enc": enc([1] * n),
        "dp_types_enc": enc(plan.zero3), "use_sp": enc(plan.ulysses), "checkpoint": enc(plan.recompute),
        "default_dp_type": "ddp" if plan.default_zero == 0 else "zero2",
        "vtp": plan.vocab_tp, "vsp": 0, "vcp": 1, "embed_sdp": sdp, "vocab_sdp": sdp,
    }


def write(p: Problem, plan: LayerwisePlan) -> str:
    """The plan as Galvatron JSON text."""
    return json.dumps(config(p, plan), indent=2) + "\n"


def read(doc: dict[str, Any], source: str = "the Galvatron JSON") -> LayerwisePlan:
    """A Galvatron strategy dict (as its search writes it) as a :class:`LayerwisePlan`, to cost it
    with autopar's model. ``tp_consecutive_flags`` are not kept (autopar places every tp group on
    consecutive ranks); ``use_sp`` 1 marks a Ulysses layer, and a plan with one has ``sp`` (Galvatron
    runs them under ``--sequence-parallel``); ``vsp`` 1 and cp sizes other than 1 are refused.

    Raises:
        AutoparError: a missing key or a value that is not what Galvatron writes, naming the key
            and ``source``.
    """
    def ints(key: str) -> list[int]:
        try:
            return [int(x) for x in str(doc[key]).split(",")]
        except KeyError:
            raise AutoparError(f"{source}: key {key!r} is missing") from None
        except ValueError:
            raise AutoparError(f"{source}: {key}={doc[key]!r} is not a comma-separated list of integers") from None

    for key, allowed in (("use_sp", {0, 1}), ("cp_sizes_enc", {1})):
        if key in doc and set(ints(key)) - allowed:
            raise AutoparError(f"{source}: {key}={doc[key]!r}: autopar costs Megatron TP or Ulysses layers without "
                               "context parallelism only (use_sp 0 or 1, cp 1)")
    if int(doc.get("vsp", 0)):
        raise AutoparError(f"{source}: vsp={doc['vsp']!r}: autopar costs the vocabulary with Megatron TP only (vsp 0)")
    n = len(ints("tp_sizes_enc"))
    for key in ("dp_types_enc", "checkpoint") + (("use_sp",) if "use_sp" in doc else ()):
        if len(ints(key)) != n:
            raise AutoparError(f"{source}: {key} has {len(ints(key))} entries; tp_sizes_enc has {n} (one per layer)")
    division, pp = ints("pp_division"), ints("pp_deg")[0]
    if len(division) != pp or sum(division) != n or min(division) < 1:
        raise AutoparError(f"{source}: pp_division={doc['pp_division']!r} must be pp_deg={pp} positive parts summing "
                           f"to the {n} layers of tp_sizes_enc")
    dp_type = doc.get("default_dp_type", "ddp")
    if dp_type not in ("ddp", "zero2"):
        raise AutoparError(f"{source}: default_dp_type={dp_type!r}: allowed ddp, zero2")
    ulysses = tuple(bool(x) for x in ints("use_sp")) if "use_sp" in doc else ()
    try:
        return LayerwisePlan(pp=ints("pp_deg")[0], num_microbatches=ints("chunks")[0],
                             layers_per_stage=tuple(ints("pp_division")), tp=tuple(ints("tp_sizes_enc")),
                             zero3=tuple(bool(x) for x in ints("dp_types_enc")),
                             recompute=tuple(bool(x) for x in ints("checkpoint")),
                             default_zero=0 if dp_type == "ddp" else 2, vocab_tp=ints("vtp")[0],
                             vocab_zero3=bool(int(doc.get("embed_sdp", doc.get("vocab_sdp", 0)))),
                             ulysses=ulysses, sp=any(ulysses))
    except ValidationError as e:  # a bound of the plan's fields (e.g. chunks 0), named by its JSON key
        err = e.errors()[0]
        key = _JSON_KEY.get(str(err["loc"][0]) if err["loc"] else "", "the plan")
        raise AutoparError(f"{source}: {key}: {err['msg']}") from None
