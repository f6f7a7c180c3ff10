"""torchtitan v0.2 job-config TOML (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``,
float8 under ``[quantize.linear.float8]``).

Fields and rules: ``shared/reference/ecosystem.md`` 3.2 and 3.3 (torchtitan tag v0.2.2,
``torchtitan/config/job_config.py``, ``distributed/parallel_dims.py``). What torchtitan cannot
run as planned is refused, never approximated: ZeRO-1 (FSDP2 shards parameters too; DDP
replicates everything), Megatron TP without sequence-parallel sharding (torchtitan's TP always
shards norms/activations), DDP combined with any other parallelism (rule 8), expert TP other
than 1 or tp (rule 3), ``recompute_layers`` N (torchtitan's integer option checkpoints every
N-th layer, a different policy), an uneven split with virtual stages, ``seq % (2*tp*cp)`` (rule 4), a V schedule (ZB-V, DualPipeV)
with async TP (PyTorch's V schedules refuse compiled stage modules),
and what torchtitan's model for the architecture cannot run (:func:`model_refusal`: Qwen3 has no
pipelining, DeepSeek-V3's flex attention no context parallelism, Mixtral-style MoE no model), and
the costed settings it has no switch for (:func:`plan_refusal`: unfused attention, dropout, fp8
parameter storage, multi-token prediction).

The sections are merged into the model's own train config (e.g. ``llama3_405b.toml``), so every
setting the plan depends on is written even where it is torchtitan's default, overriding what
that config turns on: ``[model] converters`` (``[]`` unless fp8: the 405B config enables float8),
``[parallelism] enable_async_tensor_parallel`` (the layout's ``tp_comm_overlap``, costed by
:mod:`autopar.cost.tp_overlap`; true needs ``[compile] enable = true`` with ``components``
naming ``model``: torchtitan 0.2.2's ``distributed/tensor_parallel.py`` raises without both, and
DeepSeek-V3's config compiles only the loss), ``pipeline_parallel_degree`` (also 1) and ``[compile] enable = false`` without
async TP (the time model has no torch.compile fusion).
"""

from __future__ import annotations

import tomllib
from typing import Any

from autopar.errors import AutoparError
from autopar.export.comm_knobs import require_cp_algorithms, require_default_moe
from autopar.pipeline.layout import layout_of
from autopar.export.per_stage import require_default_modules, require_uniform_recompute
from autopar.problem import Problem
from autopar.strategy import Strategy

# autopar's V schedules -> torchtitan pipeline_parallel_schedule (torch.distributed.pipelining get_schedule_class).
V_SCHEDULES = {"zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
# Our precision -> torchtitan mixed_precision_param.
_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}
FLOAT8_SECTION = "quantize.linear.float8"


def _refuse(why: str) -> AutoparError:
    return AutoparError(f"torchtitan cannot express this layout: {why}")


def torchtitan_model(p: Problem) -> str | None:
    """The torchtitan 0.2.2 model (``torchtitan/models/<name>``) that runs ``p``'s architecture:
    ``deepseek_v3`` for MLA + MoE, ``qwen3`` for QK-norm attention, ``llama3`` for the other dense
    decoders, None for a MoE model without MLA (Mixtral: torchtitan's MoE models are DeepSeek-V3,
    Qwen3-MoE and Llama 4, each with its own router and attention)."""
    m = p.model
    if m.mla:
        return "deepseek_v3" if m.is_moe else None
    if m.qk_norm:
        return "qwen3"
    return None if m.is_moe else "llama3"


def model_refusal(p: Problem, s: Strategy) -> str | None:
    """Why torchtitan 0.2.2's model for ``p`` cannot run ``s``, in torchtitan's own words, or None.

    Sources (tag v0.2.2): ``torchtitan/models/qwen3/__init__.py`` (``pipelining_fn=None``;
    ``torchtitan/train.py`` raises "Pipeline Parallel is enabled but qwen3 does not support
    pipelining"); ``torchtitan/models/deepseek_v3/model/args.py`` (every DeepSeek-V3 flavor has
    ``attn_type="flex"``; ``update_from_config`` raises "Context Parallel only supports SDPA
    attention")."""
    name = torchtitan_model(p)
    if name is None:
        return (f"{p.model.name}: torchtitan 0.2.2 has no model for a MoE without MLA or QK-norm (its models: "
                "llama3, llama4, qwen3, deepseek_v3; torchtitan/models)")
    if name == "qwen3" and s.pp > 1:
        return (f"pp={s.pp}: 'Pipeline Parallel is enabled but qwen3 does not support pipelining' (torchtitan/train.py;"
                " the qwen3 TrainSpec has no pipelining_fn)")
    if name == "deepseek_v3" and s.cp > 1:
        return (f"cp={s.cp}: 'Context Parallel only supports SDPA attention' (torchtitan/models/deepseek_v3/model/"
                "args.py); DeepSeek-V3's flavors use flex attention")
    return None


def plan_refusal(p: Problem) -> str | None:
    """Why torchtitan 0.2.2 cannot run ``p``'s costed settings, or None. Each was written as the same
    TOML as the plan without it, so the job ran something other than the estimate:

    * unfused attention (``TrainSpec.flash_attention`` off): torchtitan's models call
      ``F.scaled_dot_product_attention`` or flex attention (``torchtitan/models/attention.py``),
      fused kernels with no job-config switch to a materialised score matrix;
    * dropout (``ModelSpec.dropout``): torchtitan's llama3 / qwen3 / deepseek_v3 models have no
      dropout layers;
    * fp8 parameter storage (``TrainSpec.fp8_param_storage``, Megatron's ``--fp8-param-gather``):
      torchtitan's FSDP2 keeps the sharded parameters in fp32 (``mixed_precision_param`` is the
      compute copy) and ``enable_fsdp_float8_all_gather`` only casts them to float8 for the all-gather;
      no weight is stored in fp8 alone;
    * multi-token prediction (``ModelSpec.mtp_num_layers``, DeepSeek-V3's ``num_nextn_predict_layers``):
      torchtitan 0.2.2 has no MTP module (``torchtitan/models/deepseek_v3/model/model.py`` builds the
      embedding, ``n_layers`` decoder layers, norm and output only; no file of the package mentions MTP),
      so the MTP block costed on the last stage would not run.
    """
    if not p.train.flash_attention:
        return ("unfused attention (--no-flash-attention): torchtitan's models run SDPA or flex attention "
                "(torchtitan/models/attention.py), fused kernels with no unfused switch; plan with fused attention")
    if p.model.dropout:
        return (f"dropout: model {p.model.name} is costed with dropout masks, and torchtitan's models have no "
                "dropout; plan the model without dropout")
    if p.train.precision == "fp8" and p.train.fp8_param_storage:
        return ("fp8 parameter storage (--fp8-param-storage): torchtitan's FSDP2 keeps fp32 sharded parameters and "
                "only casts them to float8 for the all-gather (enable_fsdp_float8_all_gather); plan without "
                "--fp8-param-storage")
    if p.model.mtp_num_layers:
        return (f"multi-token prediction: model {p.model.name} is costed with {p.model.mtp_num_layers} MTP layer(s), and "
                "torchtitan 0.2.2's models have no MTP module (torchtitan/models/deepseek_v3/model/model.py); plan a "
                "model config with num_nextn_predict_layers 0")
    return None


def _dp_degrees(s: Strategy, other: int) -> tuple[int, int, str]:
    """(dp_replicate, dp_shard, fsdp_reshard_after_forward) for our ZeRO stage.

    ZeRO-3 with pp > 1 writes ``"default"``: torchtitan then keeps every block gathered from the
    first forward to the last backward of a step (``not pp_enabled``; the layout autopar costs,
    :mod:`autopar.cost.framework_memory`); ``"always"`` would re-gather per micro-batch."""
    if s.zero == 1:
        raise _refuse("zero=1 (optimizer-only sharding); FSDP2 is ZeRO-2/3, DDP is ZeRO-0")
    if s.zero == 0:
        if other > 1 and s.dp > 1:
            raise _refuse("zero=0 is DDP, which torchtitan does not combine with tp/pp/cp ('DDP has not "
                          "supported > 1D parallelism'); use zero 2 or 3")
        return s.dp, 1, "default"
    if s.zero == 3 and s.pp > 1:
        return 1, s.dp, "default"
    return 1, s.dp, "never" if s.zero == 2 else "always"


def _pipeline(p: Problem, s: Strategy) -> dict[str, Any]:
    """``[parallelism]`` pipeline fields. torchtitan builds ``ceil((L + first_less + last_less) / k)``
    stages of ``k = pipeline_parallel_layers_per_stage`` weighted slots, the embedding (output) counting
    ``first_less`` (``last_less``) slots (ecosystem.md 3.3 rule 7, ``generate_llm_fqn_per_model_part``):
    with Megatron's embedding/loss-aware split that is ``k = (L+e+l)/(pp*vpp)``, weights ``e``, ``l``;
    otherwise weights 0 for an even split, or explicit module names of every model part for any
    other layout (:class:`~autopar.pipeline.layout.PipelineLayout`, virtual stage ``v * pp + r`` on
    rank ``r`` as torchtitan's interleaved schedules place parts; ``module_fqns_per_model_part``).
    ``pipeline_parallel_schedule``: ``1F1B``, ``Interleaved1F1B``, or the layout's V schedule
    (``ZBVZeroBubble``, ``DualPipeV``: torchtitan places stage ``j`` of ``2 pp`` on rank ``j`` or
    ``2 pp - 1 - j``, ``distributed/pipeline_parallel.py`` ``_get_stage_indices`` style "v"; DualPipeV
    with EP writes ``pipeline_parallel_expert_parallel_overlap = false``: its default overlap
    raises with activation checkpointing, ``distributed/dual_pipe_v.py``, and is not costed).

    """
    if s.pp == 1:
        return {}
    layout = layout_of(p, s)
    split = layout.layers_per_stage
    name = V_SCHEDULES.get(s.schedule) or ("Interleaved1F1B" if s.vpp > 1 else "1F1B")
    section: dict[str, Any] = {"pipeline_parallel_schedule": name, "pipeline_parallel_microbatch_size": s.mbs}
    if s.schedule == "dualpipev" and s.ep > 1:  # its default true overlaps EP a2a (not costed) and refuses recompute
        section["pipeline_parallel_expert_parallel_overlap"] = False
    e, l = int(s.account_for_embedding), int(s.account_for_loss)
    if e or l:  # Megatron's embedding/loss-aware split is torchtitan's weighted one (ecosystem.md 3.3 rule 7)
        section.update(pipeline_parallel_layers_per_stage=(p.model.num_layers + e + l) // (s.pp * s.vpp),
                       pipeline_parallel_first_stage_less_layers=e, pipeline_parallel_last_stage_less_layers=l)
        return section
    if len(set(layout.decoder.flatten().tolist())) == 1:
        section.update(pipeline_parallel_layers_per_stage=split[0] // s.vpp,
                       pipeline_parallel_first_stage_less_layers=0, pipeline_parallel_last_stage_less_layers=0)
        return section
    parts, start = [], 0
    for stage in layout.stages:
        n = stage.count("t")
        parts.append((["tok_embeddings"] if "E" in stage else []) + [f"layers.{k}" for k in range(start, start + n)]
                     + (["norm", "output"] if "L" in stage else []))
        start += n
    section["module_fqns_per_model_part"] = parts
    return section


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """The TOML document as a dict (see the module docstring for refusals).

    Raises:
        AutoparError: the layout cannot be expressed in torchtitan (the reason is named), e.g.
            recompute per stage (one ``[activation_checkpoint]`` mode for all stages).
    """
    require_uniform_recompute("torchtitan", s)
    require_default_modules("torchtitan", s)
    why = model_refusal(p, s)
    if why:
        raise _refuse(why)
    if s.tp > 1 and not s.sp:
        raise _refuse(f"tp={s.tp} without sequence parallelism (torchtitan's TP always shards activations)")
    if (why := plan_refusal(p)) is not None:
        raise _refuse(why)
    require_cp_algorithms("torchtitan", s, ("p2p",))  # PyTorch's ring attention (context_parallel)
    require_default_moe("torchtitan", s, "its MoE dispatches with its own all-to-all, no flex backend or "
                        "1F1B EP overlap switch")
    if s.ep > 1 and s.expert_tp not in (1, s.tp):
        raise _refuse(f"etp={s.expert_tp}; only 1 or tp={s.tp} are allowed")
    if s.recompute == "full" and s.recompute_layers:
        raise _refuse(f"full recompute of {s.recompute_layers} layers per stage (torchtitan recomputes all, or "
                      "every N-th layer)")
    if p.train.seq_len % (2 * s.tp * s.cp):
        raise _refuse(f"seq_len {p.train.seq_len} is not a multiple of 2*tp*cp = {2 * s.tp * s.cp}")
    if s.schedule in V_SCHEDULES and s.tp_comm_overlap:
        raise _refuse(f"schedule {V_SCHEDULES[s.schedule]} with async TP: async TP needs the model compiled and "
                      "PyTorch's V schedules refuse compiled stage modules (schedules.py "
                      "_check_torch_compile_compatibility)")
    replicate, shard, reshard = _dp_degrees(s, s.tp * s.pp * s.cp)
    m = s.num_microbatches(p.train.global_batch_size)
    local = s.mbs * m if s.pp > 1 else s.mbs
    parallelism = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                   "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": s.tp,
                   "context_parallel_degree": s.cp, "expert_parallel_degree": s.ep,
                   "expert_tensor_parallel_degree": s.expert_tp if s.ep > 1 else 1,
                   "enable_async_tensor_parallel": False, "pipeline_parallel_degree": s.pp, **_pipeline(p, s)}
    mode = {"none": "none", "selective": "selective", "full": "full"}[s.recompute]
    doc: dict[str, Any] = {
        "training": {"local_batch_size": local, "global_batch_size": p.train.global_batch_size,
                     "seq_len": p.train.seq_len, "mixed_precision_param": _DTYPE[p.train.precision],
                     "mixed_precision_reduce": "float32"},
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": mode, **({"selective_ac_option": "op"} if mode == "selective" else {})},
    }
    doc["model"] = {"converters": [_converter(p)] if p.train.precision == "fp8" else []}
    doc["compile"] = {"enable": False}
    if s.tp_comm_overlap:  # async TP (autopar.cost.tp_overlap); torchtitan's parallelize raises without compile
        parallelism["enable_async_tensor_parallel"] = True  # of the model: components must name it
        doc["compile"] = {"enable": True, "components": ["model", "loss"]}
    if p.train.precision == "fp8" and _recipe(p) == "mxfp8":
        doc["quantize"] = {"linear": {"mx": {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}}}
    elif p.train.precision == "fp8":
        doc["quantize"] = {"linear": {"float8": {"enable_fsdp_float8_all_gather": shard > 1,
                                                "precompute_float8_dynamic_scale_for_fsdp": shard > 1,
                                                "filter_fqns": ["output"]}}}
    return doc


#: ``TrainSpec.fp8_recipe`` -> torchtitan v0.2 converter: torchao's float8 linear (its default
#: recipe, ``recipe_name`` unset, is tensorwise dynamic scaling) or the MX linear (``recipe_name``
#: ``mxfp8_cublas``). Delayed scaling was removed from torchao; blockwise and NVFP4 have no
#: torchtitan linear converter.
TORCHTITAN_CONVERTERS = {"tensorwise": FLOAT8_SECTION, "mxfp8": "quantize.linear.mx"}


def _recipe(p: Problem) -> str:
    """The plan's fp8 recipe as torchtitan runs it: the one named, else torchao's own default
    (tensorwise), whatever framework the plan was costed for."""
    return p.train.fp8_recipe or "tensorwise"


def _converter(p: Problem) -> str:
    """The ``[model] converters`` entry of the fp8 recipe.

    Raises:
        AutoparError: a recipe torchtitan has no converter for (:data:`TORCHTITAN_CONVERTERS`).
    """
    recipe = _recipe(p)
    if recipe not in TORCHTITAN_CONVERTERS:
        raise _refuse(f"fp8 recipe {recipe}: torchtitan's float8 converters run tensorwise (float8) or "
                      "mxfp8 (mx) scaling; plan with --fp8-recipe tensorwise or mxfp8")
    return TORCHTITAN_CONVERTERS[recipe]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    """Serialise nested dicts of scalars/lists as TOML tables (dotted names for nesting)."""
    lines, tables = [], []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append((f"{prefix}{key}", value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    out = (f"[{prefix[:-1]}]\n" if prefix and lines else "") + "".join(line + "\n" for line in lines)
    for name, table in tables:
        out += ("\n" if out else "") + to_toml(table, name + ".")
    return out


# What the TOML leaves out: torchtitan reads the model from ``[model] name/flavor`` (defaulting to
# its debug model), so the file is a set of sections to merge, not a whole job config.
HEADER = ("# torchtitan v0.2 job config sections for {model}, written by autopar export --format torchtitan.\n"
          "# Merge them into the model's own TOML (its [model] name and flavor, [job], [optimizer],\n"
          "# [lr_scheduler], dataset, steps); every key here replaces that file's (on the command line\n"
          "# --section.field cannot give converters = [], the empty list that turns float8 off).\n")


def write(p: Problem, s: Strategy) -> str:
    """The ``torchtitan`` export format: TOML text, :data:`HEADER` (comments) then the sections.

    Raises:
        AutoparError: the layout cannot be expressed in torchtitan (:func:`config`).
    """
    return HEADER.format(model=p.model.name) + to_toml(config(p, s))


def check(doc: dict[str, Any], world_size: int, num_layers: int) -> list[str]:
    """torchtitan's rules (ecosystem.md 3.3, numbered) on a parsed TOML document."""
    par, tr = doc["parallelism"], doc["training"]
    rep, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    tp, cp, pp = par["tensor_parallel_degree"], par["context_parallel_degree"], par.get("pipeline_parallel_degree", 1)
    ep, etp = par["expert_parallel_degree"], par["expert_tensor_parallel_degree"]
    bad = []
    if rep * shard * cp * tp * pp != world_size:
        bad.append(f"2: dp_replicate*dp_shard*cp*tp*pp != WORLD_SIZE {world_size}")
    if ep > 1 and (etp not in (1, tp) or (shard * cp * tp) % (etp * ep)):
        bad.append("3: expert grid")
    if tr["seq_len"] % (tp * 2 * cp):
        bad.append("4: seq_len % (tp*2*cp)")
    if tr["global_batch_size"] % (tr["local_batch_size"] * rep * shard):
        bad.append("5: global batch")
    if pp > 1:
        if tr["local_batch_size"] % par["pipeline_parallel_microbatch_size"]:
            bad.append("6: local batch % pp microbatch")
        k = par.get("pipeline_parallel_layers_per_stage")
        weights = par.get("pipeline_parallel_first_stage_less_layers", 1) + par.get(
            "pipeline_parallel_last_stage_less_layers", 1)
        stages = -(-(num_layers + weights) // k) if k else len(par["module_fqns_per_model_part"])
        per_rank = stages // pp
        multi = par["pipeline_parallel_schedule"] != "1F1B"
        if stages % pp or (per_rank >= 2) != multi:
            bad.append(f"7: {stages} stages for pp={pp} and schedule {par['pipeline_parallel_schedule']}")
    if rep > 1 and max(tp, cp, pp, shard) > 1:
        bad.append("8: DDP with other parallelism")
    return bad


def read(text: str) -> dict[str, Any]:
    """Parse our TOML back (:mod:`tomllib`)."""
    return tomllib.loads(text)
