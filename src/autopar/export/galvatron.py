"""Galvatron (Hetu-Galvatron) JSON strategy: per-layer encodings of one uniform layout.

Which Galvatron: the release ``pip install hetu-galvatron`` installs, 2.4.0, whose reader is
``galvatron/core/runtime/hybrid_parallel_config.py`` (``get_hybrid_parallel_configs_api``,
``config2strategy``). It reads ``pp_deg``, ``pp_division`` ("a,b,..." layers per stage),
``chunks`` (micro-batches), ``global_bsz``, ``pipeline_type`` (``pipedream_flush`` = 1F1B, or
``gpipe``: :attr:`~autopar.strategy.Strategy.schedule`), per layer comma strings ``tp_sizes_enc``,
``tp_consecutive_flags`` (:attr:`~autopar.strategy.Strategy.tp_consecutive`), ``dp_types_enc``
(1 = that layer uses ZeRO-3/FSDP; with pp too, which Galvatron runs), ``use_sp`` (1 = DeepSpeed
Ulysses instead of Megatron TP, so 0 here), ``checkpoint`` (full recompute of the layer),
``default_dp_type`` (``ddp``/``zero2``), ``vtp`` / ``vsp`` (vocabulary TP / Ulysses:
:attr:`~autopar.strategy.Strategy.vocab_tp` / ``vocab_sp``) and ``embed_sdp`` (ZeRO-3 for the
embedding and head). Plans for this target are costed with Galvatron's gradient accumulation
(``TrainSpec.grad_reduce_once``, :mod:`autopar.cost.grad_accumulation`).
GitHub main renamed ``embed_sdp`` to ``vocab_sdp`` and added ``vcp``, ``cp_sizes_enc``,
``ep_sizes_enc``, ``tp_of_ep_sizes_enc``: the JSON carries both spellings of the renamed key and
``vcp`` / ``cp_sizes_enc`` = 1, so either version runs the same plan. What only main can run is
refused, because 2.4.0 never reads those keys and silently runs something else (with cp > 1 its
data parallelism becomes dp x cp): context parallelism, expert parallelism, and MoE models at
all (2.4.0's ``galvatron/models`` are GPT, Llama, BERT, T5, ViT and Swin).

Not a JSON key: Megatron sequence parallelism is Galvatron's runtime ``--sequence-parallel``
(2.4.0 takes Megatron's argument, off by default; main's ``sequence_parallel`` is on by
default); pass it with the JSON where the plan has ``sp`` (:func:`runtime_flags`; ``autopar export``
says so on stderr). Recompute per stage
(:attr:`~autopar.strategy.Strategy.recompute_per_stage`) maps to the per-layer ``checkpoint``
flags. Refused also: ZeRO-1 (not a Galvatron data-parallel type), selective recompute on any
stage (Galvatron checkpoints whole layers), interleaved pipelines (no VPP in Galvatron), and fp8
training: the precision is Galvatron's runtime ``mixed_precision`` (fp32, fp16, bf16), which
has no fp8 (Transformer Engine) path.
"""

from __future__ import annotations

import json
from typing import Any

from autopar.errors import AutoparError
from autopar.export.layout_flags import stage_layers
from autopar.problem import Problem
from autopar.strategy import Strategy

RELEASE = "2.4.0"  # the hetu-galvatron release on PyPI whose reader this JSON is written for
_DP_TYPE = {0: "ddp", 2: "zero2", 3: "zero2"}  # zero 3 = zero2 default + per-layer fsdp flag 1


def _checkpointed(p: Problem, s: Strategy) -> list[int]:
    """Per-layer recompute flags: all layers of a ``full`` stage, or the first N of every stage
    (Megatron ``block``); none on the other stages."""
    flags: list[int] = []
    for n, option in zip(stage_layers(p, s), s.stage_recompute):
        k = min(n, s.recompute_layers or n) if option == "full" else 0
        flags += [1] * k + [0] * (n - k)
    return flags


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """The Galvatron strategy dict.

    Raises:
        AutoparError: fp8 training, ZeRO-1, selective recompute, vpp > 1, a MoE model or cp > 1 (see the
            module docstring).
    """
    why = None
    if p.model.is_moe:  # the model's own reason first: no layout of it can be written
        why = (f"{p.model.name} is a MoE model: hetu-galvatron {RELEASE} has no MoE model (galvatron/models) and never "
               "reads ep_sizes_enc / tp_of_ep_sizes_enc; only its GitHub main trains MoE")
    elif p.train.precision == "fp8":
        why = ("precision fp8: Galvatron trains in fp32, fp16 or bf16 only (its --mixed_precision choices); "
               "fp8 layouts are written by --format megatron or torchtitan")
    elif s.zero == 1:
        why = "zero=1: Galvatron's data-parallel types are ddp, zero2 and zero3"
    elif "selective" in s.stage_recompute:
        why = "selective recompute: Galvatron checkpoints whole layers (write per-stage selective with --format sapp)"
    elif s.vpp > 1:
        why = f"vpp={s.vpp}: Galvatron has no interleaved pipeline schedule"
    elif s.tp_comm_overlap:
        why = "tp_comm_overlap: Galvatron's runtime has no TP communication overlap switch (--no-tp-comm-overlap)"
    elif s.cp > 1:
        why = (f"cp={s.cp}: hetu-galvatron {RELEASE} never reads cp_sizes_enc (hybrid_parallel_config.py "
               "config2strategy), so its data parallelism would become dp x cp; only its GitHub main runs context "
               "parallelism")
    if why:
        raise AutoparError(f"Galvatron cannot express this layout: {why}")
    n = p.model.num_layers
    enc = lambda v: ",".join([str(v)] * n)  # noqa: E731
    doc: dict[str, Any] = {
        "pp_deg": s.pp, "pp_division": ",".join(map(str, stage_layers(p, s))),
        "chunks": s.num_microbatches(p.train.global_batch_size), "global_bsz": p.train.global_batch_size,
        "pipeline_type": "gpipe" if s.schedule == "gpipe" else "pipedream_flush", "tp_sizes_enc": enc(s.tp),
        "tp_consecutive_flags": enc(int(s.tp_consecutive)),
        "cp_sizes_enc": enc(s.cp), "dp_types_enc": enc(1 if s.zero == 3 else 0), "use_sp": enc(0),
        "checkpoint": ",".join(map(str, _checkpointed(p, s))), "default_dp_type": _DP_TYPE[s.zero],
        "vtp": s.vocab_tp_size, "vsp": int(s.vocab_sp), "vcp": s.cp, "embed_sdp": int(s.zero == 3), "vocab_sdp": int(s.zero == 3),
    }
    return doc


def runtime_flags(s: Strategy) -> list[str]:
    """The Galvatron launch flags the plan needs besides the JSON: ``--sequence-parallel`` where ``s``
    has Megatron sequence parallelism. hetu-galvatron 2.4.0 takes it from Megatron's arguments
    (``galvatron/site_package/megatron/training/arguments.py``, ``store_true``: off unless given) and
    its models read ``args.sequence_parallel`` (``galvatron/models/llama_hf/LlamaModel_sequential.py``,
    ``core/runtime/redistribute.py``); no JSON key sets it, so without the flag the activations
    costed as sharded over tp are whole on every tp rank."""
    return ["--sequence-parallel"] if s.sp and s.tp > 1 else []


def write(p: Problem, s: Strategy) -> str:
    """The ``galvatron`` export format (JSON text)."""
    return json.dumps(config(p, s), indent=2) + "\n"


def check(doc: dict[str, Any], world_size: int, num_layers: int) -> list[str]:
    """Consistency Galvatron's runtime relies on: one entry per layer, the division sums to the
    layers over ``pp_deg`` stages, the grid divides the world, chunks divide the batch."""
    bad = []
    per_layer = [k for k in ("tp_sizes_enc", "tp_consecutive_flags", "cp_sizes_enc", "dp_types_enc", "use_sp",
                             "checkpoint") if len(str(doc[k]).split(",")) != num_layers]
    if per_layer:
        bad.append(f"per-layer lists of the wrong length: {per_layer}")
    division = [int(x) for x in doc["pp_division"].split(",")]
    if len(division) != doc["pp_deg"] or sum(division) != num_layers:
        bad.append(f"pp_division {division} for pp_deg {doc['pp_deg']}")
    tp, cp = int(doc["tp_sizes_enc"].split(",")[0]), int(doc["cp_sizes_enc"].split(",")[0])
    if world_size % (doc["pp_deg"] * tp * cp):
        bad.append("pp_deg*tp*cp does not divide the world size")
    if doc["global_bsz"] % doc["chunks"]:
        bad.append("chunks does not divide global_bsz")
    return bad
