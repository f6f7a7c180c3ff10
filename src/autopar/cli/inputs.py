"""Command-line options into a :class:`~autopar.problem.Problem` and a
:class:`~autopar.strategy.Strategy`, shared by every command (:mod:`autopar.cli`): each bad value is one :class:`~autopar.errors.AutoparError` line naming the option.
Warnings are queued (:func:`autopar.notices.warn_on_success`) and printed only when the command succeeds.
"""

from __future__ import annotations

import math
from typing import Any

from autopar.cost import offload
from autopar.errors import AutoparError
from autopar.notices import warn_on_success
from autopar.problem import Problem
from autopar.specs import TrainSpec, load_device, make_cluster
from autopar.specs.model import MAX_SIZE
from autopar.strategy import Strategy


def positive(name: str, value: int, upper: int = MAX_SIZE) -> int:
    """``value`` if it lies in 1..upper, else one error line naming the option."""
    if not 0 < value <= upper:
        raise AutoparError(f"{name}={value}: must be an integer in 1..{upper}")
    return value


def recompute_modules_option(p: Problem, text: str | None) -> tuple[str, ...] | None:
    """``--recompute-modules`` as a module tuple (None when not given).

    Raises:
        AutoparError: an unknown name, a module the model lacks (Megatron-LM rule: ecosystem.md
            1.3 rule 25; also modules that would change nothing: ``mlp`` on a model whose every
            layer is MoE (Megatron-LM's ``TransformerLayer`` recomputes only a dense MLP), and
            ``layernorm`` without MLA or MoE layers (a dense GQA layer's norms are fused into
            ``LayerNormLinear``; :func:`autopar.cost.recompute.separate_norms`)),
            or modules other than ``core_attn`` for a framework without a module list.
    """
    from autopar.cost.recompute import separate_norms
    from autopar.rules import missing_modules
    from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_MODULES, parse_recompute_modules

    if text is None:
        return None
    modules = parse_recompute_modules(text, "--recompute-modules")
    missing = missing_modules(p)
    if p.model.num_layers and p.model.num_moe_layers == p.model.num_layers:
        missing = dict(missing, mlp="dense (non-MoE) layers")
    if not separate_norms(p, p.model.is_moe):
        missing = dict(missing, layernorm="MLA or MoE layers (dense GQA layers fuse their norms into the linears)")
    bad = [f"{n} needs {missing[n]}" for n in modules if n in missing]
    if bad:
        allowed = ", ".join(m for m in RECOMPUTE_MODULES if m not in missing)
        raise AutoparError(f"--recompute-modules={text!r}: {'; '.join(bad)}; model {p.model.name} has none "
                           f"(allowed for it: {allowed})")
    if p.train.framework != "megatron" and modules != DEFAULT_RECOMPUTE_MODULES:
        raise AutoparError(f"--recompute-modules={text!r} is Megatron-LM's; {p.train.framework} recomputes its own "
                           "way (leave the default core_attn)")
    return modules


# TrainSpec fields a launch script sets: the MoE run switches (autopar.specs.script_moe), optimizer-state dtypes
# and offload (autopar.specs.script_optimizer), fp8 weight storage (--fp8-param-gather) and recipe (--fp8-recipe,
# also an option), CUDA graphs and activation offloading (autopar.specs.script_precision).
SCRIPT_STATE_FIELDS = ("moe", "grad_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                       "optimizer_offload_fraction", "optimizer_offload_overlap", "fp8_param_storage", "fp8_recipe",
                       "cuda_graph_impl", "cuda_graph_scope", "activation_offload_layers", "fp8_bf16_layers",
                       "overlap_grad_reduce", "grad_accumulation_fusion")


def script_state_fields(plan, precision: str) -> dict[str, Any]:
    """The :data:`SCRIPT_STATE_FIELDS` a script set (``plan`` a ScriptPlan or None); its
    ``--fp8-param-gather`` and fp8 recipe only when the planned ``precision`` is still fp8, its fp16
    gradients only when it is still fp16."""
    fields = {k: v for k, v in (plan.train_fields.items() if plan else ()) if k in SCRIPT_STATE_FIELDS}
    if precision != "fp16" and fields.get("grad_dtype") == "fp16":  # an fp16 script's own gradient dtype
        fields.pop("grad_dtype")
    if precision != "fp8":
        fields.pop("fp8_param_storage", None)
        fields.pop("fp8_recipe", None)
        fields.pop("fp8_bf16_layers", None)
    return fields


def fp8_recipe_option(value: str, precision: str, device) -> str:
    """``--fp8-recipe``, checked: a recipe name, with ``--precision fp8``, that the device runs.

    Raises:
        AutoparError: another name, another precision, or a device without the recipe's tensor cores
            (:func:`autopar.cost.fp8_recipe.check_device`).
    """
    from autopar.cost.fp8_recipe import check_device
    from autopar.specs.train import FP8_RECIPES

    if value not in FP8_RECIPES:
        raise AutoparError(f"--fp8-recipe={value!r}: allowed {', '.join(FP8_RECIPES)}")
    if precision != "fp8":
        raise AutoparError(f"--fp8-recipe {value} with --precision={precision}: a recipe applies to --precision fp8")
    check_device(device, value)
    return value


def problem_from_options(model: str | None, device: str | None, nodes: int | None, devices_per_node: int | None,
                         gbs: int | None, seq_len: int | None, precision: str | None, device_file: str | None,
                         device_set: list[str] | None, flash: bool | None, vocab_pad: int | None,
                         script: str | None = None, vocab_size: int | None = None,
                         moe_token_imbalance: float | None = None, fp8_param_storage: bool | None = None,
                         fp8_recipe: str | None = None, knobs: dict[str, Any] | None = None) -> Problem:
    """The problem the options describe: explicit options, else the ``--script``'s values, else
    the documented defaults (:data:`autopar.specs.script_cli.CLI_FALLBACKS`). ``knobs``: the
    ``TrainSpec`` fields of the CUDA-graph, activation-offload and bf16-layer options
    (:func:`autopar.cli.knob_options.given_knobs`), replacing the script's.

    Raises:
        AutoparError: an option outside what it allows (named, with the allowed values), an
            unreadable script, model or device file, or an option the model cannot use
            (``--moe-token-imbalance`` without routed experts, ``--fp8-param-storage`` or ``--fp8-recipe``
            without fp8, a recipe the device cannot run).
    """
    from autopar.specs.cluster import MAX_DEVICES_PER_NODE, MAX_NODES
    from autopar.specs.script_cli import cli_defaults, model_for, option_name

    plan = None
    if script:  # the script reader (its flag tables) only where a script is given
        from autopar.specs.script import read_script

        plan = read_script(script)
    given = dict(nodes=nodes, devices_per_node=devices_per_node, gbs=gbs, seq_len=seq_len, precision=precision,
                 flash=flash, vocab_pad=vocab_pad)
    v = cli_defaults(plan, given)
    nodes, devices_per_node, gbs, seq_len = v["nodes"], v["devices_per_node"], v["gbs"], v["seq_len"]
    precision, flash, vocab_pad = v["precision"], v["flash"], v["vocab_pad"]
    if precision not in ("bf16", "fp16", "fp8"):
        raise AutoparError(f"--precision={precision!r}: allowed bf16, fp16, fp8")
    positive(option_name("--gbs", given["gbs"], plan), gbs, upper=2**30)
    positive(option_name("--seq-len", given["seq_len"], plan), seq_len, upper=2**24)
    positive(option_name("--make-vocab-size-divisible-by", given["vocab_pad"], plan), vocab_pad)
    if plan is not None:  # the script's cluster, named by its launcher flags (make_cluster names the options)
        if given["nodes"] is None:
            positive(option_name("--nodes", None, plan), nodes, upper=MAX_NODES)
        if given["devices_per_node"] is None:
            positive(option_name("--devices-per-node", None, plan), devices_per_node, upper=MAX_DEVICES_PER_NODE)
    spec = model_for(model, plan, vocab_size)
    dev = load_device(device, device_file, device_set)
    dev.peak(precision)  # unknown precision for this device: one clear error now
    imbalance = 1.0 if moe_token_imbalance is None else moe_token_imbalance
    if not (math.isfinite(imbalance) and 1.0 <= imbalance <= 1e3):
        raise AutoparError(f"--moe-token-imbalance={imbalance}: must be a number in 1..1000 "
                           "(1 = balanced routing; the capacity factor with token dropping/padding)")
    if imbalance != 1.0 and spec.num_experts == 0:  # would be ignored: no routed tokens to imbalance
        raise AutoparError(f"--moe-token-imbalance={imbalance}: model {spec.name} has no routed experts; the "
                           "option applies to MoE models only")
    if fp8_param_storage and precision != "fp8":
        raise AutoparError(f"--fp8-param-storage with --precision={precision}: fp8 parameter storage needs "
                           "--precision fp8")
    cluster = make_cluster(dev, nodes, devices_per_node)
    state = script_state_fields(plan, precision)
    if fp8_param_storage is not None:
        state["fp8_param_storage"] = bool(fp8_param_storage)
    if fp8_recipe is not None:
        state["fp8_recipe"] = fp8_recipe_option(fp8_recipe, precision, dev)
    if knobs:
        from autopar.cli.knob_options import check_knobs

        state.update(knobs)
        if "cuda_graph_impl" in knobs and knobs["cuda_graph_impl"] == "none" and "cuda_graph_scope" not in knobs:
            state.pop("cuda_graph_scope", None)  # --cuda-graph-impl none drops the script's scope with its graphs
        check_knobs(knobs, state, precision, spec.num_layers, moe=spec.num_experts > 0)
    train = TrainSpec(global_batch_size=gbs, seq_len=seq_len, precision=precision, flash_attention=flash,
                      make_vocab_size_divisible_by=vocab_pad, moe_token_imbalance=imbalance, **state)
    if train.optimizer_offload_fraction:
        offload.host_bandwidth_bytes_per_s(Problem(spec, cluster, train))  # a device without the number: one error
    if spec.max_position_embeddings and seq_len > spec.max_position_embeddings:
        warn_on_success(f"--seq-len {seq_len} exceeds the model's max_position_embeddings "
                        f"{spec.max_position_embeddings}; planning anyway (Megatron needs it raised)")
    return Problem(spec, cluster, train)


def strategy_from_options(p: Problem, script: str | None, layout: dict[str, Any], dp: int | None,
                          schedule: str | None, target: str = "megatron") -> Strategy:
    """The explicit layout: options given, else the script's layout, else the defaults
    (:data:`autopar.specs.script_cli.LAYOUT_FALLBACKS`; sequence parallelism on with tp > 1 where
    the ``target`` export format runs it: :func:`autopar.specs.script_cli.sequence_parallel_default`);
    ``dp`` None = world / (tp * pp * cp). Galvatron's ``vocab_tp`` / ``vocab_sp`` / ``tp_consecutive``
    (``layout`` keys, optional) are set only where given (no script has them).

    Raises:
        AutoparError: a size outside 1..:data:`~autopar.specs.model.MAX_SIZE`, tp * pp * cp not
            dividing the world (with the tp values that would), ``--etp`` for a dense model,
            ``--embedding-loss-split`` with pp 1 (a no-op), a script's module set Megatron-LM
            refuses, or a layout the ``Strategy`` checks refuse.
    """
    from pydantic import ValidationError

    from autopar.errors import from_validation_error
    from autopar.specs.script import read_script
    from autopar.specs.script_cli import layout_defaults, option_name
    from autopar.strategy import DEFAULT_RECOMPUTE_MODULES

    split = layout.pop("layers_per_stage")
    per_stage = layout.pop("recompute_per_stage", None)
    galvatron = {k: v for k in ("vocab_tp", "vocab_sp", "tp_consecutive") if (v := layout.pop(k, None)) is not None}
    if "vocab_tp" in galvatron:
        positive("--vocab-tp", galvatron["vocab_tp"])
    if split:
        from autopar.integers import is_integer_text

        if not all(is_integer_text(x) for x in split.split(",")):
            raise AutoparError(f"--layers-per-stage={split!r}: expected integers like 7,8,8,7")
        layout["layers_per_stage"] = tuple(int(x) for x in split.split(","))
    else:
        layout["layers_per_stage"] = None
    plan = read_script(script) if script else None
    for name in ("tp_comm_overlap", "cp_comm_type", "cp_a2a", "moe_dispatcher", "moe_ep_overlap"):  # commands
        # without these options take the defaults
        layout.setdefault(name, None)
    overlap_given = layout["tp_comm_overlap"] is not None or (plan is not None and plan.layout.get("tp_comm_overlap"))
    recipe = {}
    if target == "megatron-bridge":  # the model's recipe defaults (dispatcher with ep > 1, recompute)
        from autopar.export.bridge_moe_recipes import layout_fallbacks

        recipe = layout_fallbacks(p)
        ep = layout["ep"] if layout["ep"] is not None else (plan.layout.get("ep") if plan is not None else None)
        if (ep or 1) == 1:
            recipe.pop("moe_dispatcher", None)
    lay = layout_defaults(plan, layout, target, recipe)
    if p.model.num_experts == 0 and layout["etp"] is None:  # a target's expert TP default is for MoE models
        lay["etp"] = None
    if not overlap_given and lay["tp"] > p.cluster.fast_domain_size:  # the default stays within one NVLink domain
        lay["tp_comm_overlap"] = False  # (rule tp_comm_overlap_in_node)
    if per_stage:
        lay["recompute_per_stage"] = tuple(x.strip() for x in per_stage.split(","))
        lay["recompute"] = layout.get("recompute")  # None: the heaviest per-stage option
    granularities = {lay.get("recompute"), *(lay.get("recompute_per_stage") or ())}
    if layout.get("recompute_modules") is not None and "selective" not in granularities:  # was accepted, unused
        raise AutoparError(f"--recompute-modules={','.join(layout['recompute_modules'])} with --recompute="
                           f"{lay.get('recompute')}: the modules are what selective recompute recomputes (Megatron-LM "
                           "reads them under selective granularity only); use --recompute selective or drop "
                           "--recompute-modules")
    if layout.get("recompute_modules") is None and "selective" not in {lay.get("recompute"),
                                                                      *(lay.get("recompute_per_stage") or ())}:
        # the script's selective modules, with --recompute none/full given: Megatron ignores them too
        lay["recompute_modules"] = DEFAULT_RECOMPUTE_MODULES
    elif layout.get("recompute_modules") is None and plan is not None:  # the layout takes the script's modules
        from autopar.export.checks import recompute_modules

        why = recompute_modules(plan)  # Megatron-Core TransformerConfig raises ValueError on these
        if why:
            raise AutoparError(f"--script={script!r}: {why}: Megatron-LM refuses this combination (ecosystem.md "
                               "1.3 rule 25); fix the script or give --recompute-modules")
    for name in ("tp", "pp", "cp", "vpp", "ep", "mbs"):
        positive(option_name(f"--{name}", layout[name], plan), lay[name])
    for name, value in (("dp", dp), ("etp", lay["etp"]), ("recompute_layers", lay["recompute_layers"])):
        if value is not None:  # 2^63 - 1 wrapped negative in the int64 rule arithmetic (or overflowed)
            option = "--" + name.replace("_", "-")
            positive(option_name(option, dp if name == "dp" else layout[name], plan), value)
    if layout.get("account_for_embedding") and lay["pp"] == 1:  # was accepted and changed nothing
        raise AutoparError("--embedding-loss-split with --pp=1: it counts the embedding and the loss as layers of the "
                           "pipeline split, and one stage has nothing to split; give --pp 2 or more, or drop it")
    if layout["etp"] is not None and p.model.num_experts == 0 and layout["etp"] != lay["tp"]:  # was ignored
        raise AutoparError(f"--etp={layout['etp']}: model {p.model.name} has no routed experts; expert tensor "
                           "parallelism applies to MoE models only (leave --etp unset)")
    model_size = lay["tp"] * lay["pp"] * lay["cp"]
    if dp is None:
        if p.world_size % model_size:
            from autopar.rules import model_tp_values
            from autopar.space import divisors

            pp_cp = lay["pp"] * lay["cp"]
            fit = model_tp_values(p, divisors(p.world_size // pp_cp) if p.world_size % pp_cp == 0 else [], lay["etp"])
            raise AutoparError(
                f"--tp={lay['tp']} --pp={lay['pp']} --cp={lay['cp']}: tp*pp*cp = {model_size} does not divide the "
                f"world size {p.world_size} (nodes x devices per node); with these pp and cp, --tp may be "
                f"{', '.join(map(str, fit)) or 'nothing (reduce --pp/--cp)'} (the divisors of world/(pp*cp) that "
                f"{p.model.name}'s heads, KV heads and FFN widths allow)")
        dp = p.world_size // model_size
    try:
        return Strategy(dp=dp, schedule=schedule or ("interleaved" if lay["vpp"] > 1 else "1f1b"), **lay, **galvatron)
    except ValidationError as err:
        raise from_validation_error(err, "layout", as_option=True) from None


#: The layout options ``estimate`` and ``export`` share, by their parameter names (and the
#: ``Strategy`` fields they set); ``--embedding-loss-split`` and ``--recompute-modules`` are
#: translated by :func:`layout_options`.
LAYOUT_OPTION_FIELDS = ("tp", "pp", "cp", "vpp", "ep", "etp", "mbs", "zero", "sp", "recompute", "recompute_layers",
                        "layers_per_stage", "pipeline_layout", "recompute_per_stage", "tp_comm_overlap",
                        "cp_comm_type", "cp_a2a", "moe_dispatcher", "moe_ep_overlap", "vocab_tp", "vocab_sp",
                        "tp_consecutive")


def layout_options(p: Problem, options: dict[str, Any]) -> dict[str, Any]:
    """The layout given on the command line: ``options`` (a command's parameters by name, e.g. its
    ``locals()``) reduced to :data:`LAYOUT_OPTION_FIELDS`, with ``embedding_loss_split`` setting
    both embedding and loss accounting and ``recompute_modules`` parsed
    (:func:`recompute_modules_option`). None = not given. Input to :func:`strategy_from_options`.

    Raises:
        AutoparError: bad ``--recompute-modules`` (see :func:`recompute_modules_option`).
    """
    layout = {name: options[name] for name in LAYOUT_OPTION_FIELDS}
    split = options["embedding_loss_split"]
    return {**layout, "account_for_embedding": split, "account_for_loss": split,
            "recompute_modules": recompute_modules_option(p, options["recompute_modules"])}

