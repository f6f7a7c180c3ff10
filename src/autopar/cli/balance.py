"""``autopar balance``: balance the pipeline stages of one layout and compare with the even split.

Registered on :data:`autopar.cli.app` when :mod:`autopar.cli` imports this module. The layout
comes from the same options as ``autopar estimate`` (model, cluster, ``--tp --pp --vpp ...``),
or the per-layer costs from ``--layers FILE`` (see :mod:`autopar.pipeline.layers_file`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from autopar.cli.app import app, console, err_console, progress_shown, user_errors
from autopar.cli.inputs import problem_from_options, recompute_modules_option, strategy_from_options
from autopar.cli.json_output import print_json
from autopar.cli.options import (
    Cp,
    Device,
    DeviceFile,
    DeviceSet,
    Dp,
    Ep,
    Etp,
    Flash,
    Fp8ParamStorage,
    Fp8Recipe,
    Gbs,
    Json,
    Mbs,
    Model,
    MoeImbalance,
    Nodes,
    PerNode,
    Pp,
    Precision,
    Quiet,
    RecomputeLayers,
    RecomputeModules,
    RecomputeOpt,
    ScheduleOpt,
    Script,
    SeqLen,
    Sp,
    Tp,
    VocabPad,
    VocabSize,
    Vpp,
    Zero,
)
from autopar.cli.paths import refuse_overwriting_inputs, refuse_unwritable_figure
from autopar.errors import AutoparError
from autopar.estimate import DEFAULT_MEMORY_MARGIN
from autopar.pipeline.balance import FORMS, TIME_LIMIT_S, BalancePlan, NoFitError
from autopar.pipeline.balance_json import plan_document, sapp_arrays
from autopar.pipeline.layout import PipelineLayout, layout_of
from autopar.progress import phase
from autopar.specs.cluster import MAX_MEMORY_BYTES
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, parse_recompute_modules

GIB = 2.0**30
MAX_TIME_LIMIT_S = 3600.0  # SAPP-PPB's default is 90 s


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.2f} s"


def _layers_text(row: np.ndarray) -> str:
    return str(int(row.sum())) if len(row) == 1 else f"{int(row.sum())} ({'+'.join(str(int(n)) for n in row)})"


def _module_sets_in_order(names: tuple[str, ...], module_sets: tuple[tuple[str, ...], ...]) -> list:
    """``module_sets`` lined up with ``names`` (None where a name is not ``selective:...``)."""
    sets = iter(module_sets)
    return [next(sets) if n.startswith("selective:") else None for n in names]


def limit_text(limit_bytes: float, device_bytes: float | None, margin: float, marginal: bool) -> str:
    """The header's limit: ``limit 71.7 GiB (90% of 79.6 GiB: --memory-margin 0.1, as search)``, the
    whole memory where nothing fitted within the margin (the plan is marginal), or the limit as given
    (``device_bytes`` None: ``--memory-limit-gib``)."""
    text = f"limit {limit_bytes / GIB:.1f} GiB"
    if device_bytes is None:
        return text
    if marginal:
        return (f"{text} (the device's: no split fits within {1 - margin:.0%} of it, --memory-margin {margin:g}, so "
                "the plan is marginal, as search would call it)")
    return f"{text} ({1 - margin:.0%} of {device_bytes / GIB:.1f} GiB: --memory-margin {margin:g}, as search)"


def solver_text(plan: BalancePlan) -> str:
    """How the plan was solved, e.g. ``solver highs, proven optimal (MIP gap 0.01%)`` (within
    :data:`autopar.pipeline.chunk_ilp.MIP_REL_GAP`) or ``solver highs, MIP gap 0.3%, time limit
    0.3 s hit``."""
    text = f"solver {plan.solver}"
    if plan.optimal:
        return text + ", proven optimal" + ("" if plan.gap is None else f" (MIP gap {plan.gap:.2%})")
    if plan.gap is not None:
        text += f", MIP gap {plan.gap:.1%}"
    if plan.time_limit_hit:
        text += f", time limit {plan.time_limit_s:g} s hit"
    return text


def balance_table(plan: BalancePlan) -> Table:
    """Rich table: per stage the balanced layers (per chunk with vpp), recompute and memory,
    next to the even split's layers and memory."""
    best, even = plan.best, plan.even
    table = Table(title=f"Balanced pipeline ({plan.schedule}, {solver_text(plan)})")
    for name in ("stage", "layers", "recompute", "memory GiB", "even layers", "even memory GiB"):
        table.add_column(name, justify="left" if name == "recompute" else "right")
    for i, row in enumerate(best.layers_per_chunk):
        mem = best.stage_memory_bytes[i]
        over = "[red]" if mem > plan.memory_limit_bytes else ""
        table.add_row(str(i), _layers_text(row), best.recompute[i], f"{over}{mem / GIB:.1f}",
                      "-" if even is None else _layers_text(even.layers_per_chunk[i]),
                      "-" if even is None else f"{even.stage_memory_bytes[i] / GIB:.1f}")
    return table


def megatron_flags(plan: BalancePlan, accounted: bool = False,
                   modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES, mtp_num_layers: int = 0) -> str:
    """Megatron-LM arguments for the balanced split (first/last stage layers, or
    ``--pipeline-model-parallel-layout`` where those cannot say it: unequal middle stages; recompute),
    or a note when the per-stage recompute is not expressible. ``accounted``: the layout
    counts the embedding/loss as layers, which Megatron does not combine with first/last counts.
    ``modules``: what selective recompute re-runs (``--recompute-modules``, written when not
    Megatron's default ``core_attn``). ``mtp_num_layers``: MTP layers, placed before the loss."""
    first_last = plan.megatron_first_last
    split = plan.best.layers_per_stage
    flags = []
    if first_last is None:
        layout = PipelineLayout.from_chunks(plan.best.layers_per_chunk, mtp_num_layers)
        flags.append(f"--pipeline-model-parallel-layout {shlex.quote(layout.megatron())}")
        if accounted:
            flags.append("(instead of --account-for-embedding/loss-in-pipeline-split: Megatron-LM takes one or the other)")
    elif len(split) > 1 and len(set(split)) > 1:
        flags += [f"--decoder-first-pipeline-num-layers {first_last[0]}",
                  f"--decoder-last-pipeline-num-layers {first_last[1]}"]
        if accounted:
            flags.append("(instead of --account-for-embedding/loss-in-pipeline-split: Megatron-LM takes one or the other)")
    best = plan.best
    names = set(best.recompute)
    full = best.option_counts("full")
    mixed = len(names) > 1 or any(" + " in n for n in names)
    if mixed and set(best.options) - {"none", "full"} and not best.option_counts("selective").any() \
            and np.all(full == full.flat[0]) and np.all(best.recompute_counts.sum(axis=2) - full
                                                        == best.option_counts("none")):
        mixed = False  # the same number of fully recomputed layers in every chunk: Megatron's block method
    if mixed and "selective" in "".join(names) and tuple(modules) != DEFAULT_RECOMPUTE_MODULES:
        # SAPP and Galvatron (the per-stage writers) refuse a module set (export.per_stage)
        flags.append(f"(recompute differs per stage {list(best.recompute)}: Megatron has one setting, and no "
                     f"per-stage writer takes --recompute-modules {' '.join(modules)}; use --form megatron, or the "
                     "default core_attn for the SAPP arrays)")
    elif mixed:
        flags.append(f"(recompute differs per stage {list(best.recompute)}: Megatron has one setting; "
                     "use the SAPP arrays (MindFormers), or --form megatron)")
    elif names == {"selective"}:
        flags.append("--recompute-granularity selective")
        if tuple(modules) != DEFAULT_RECOMPUTE_MODULES:
            flags.append("--recompute-modules " + " ".join(modules))
    elif names == {"full"}:
        flags.append("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    elif full.any():
        flags.append(f"--recompute-granularity full --recompute-method block --recompute-num-layers {int(full.flat[0])}")
    return " ".join(flags) if flags else "(even split, no extra flags)"


def print_plan(plan: BalancePlan, accounted: bool = False,
               modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES, mtp_num_layers: int = 0) -> None:
    """Print the balanced plan: table, SAPP arrays, Megatron flags, step time vs even split
    (``accounted``, ``modules``: see :func:`megatron_flags`)."""
    console.print(balance_table(plan))
    arrays = sapp_arrays(plan)
    console.print(f"SAPP offset:    {arrays['offset']}", highlight=False)
    used = [n for n in plan.best.options if n.startswith("selective") and plan.best.option_counts(n).any()]
    sets = [n for n in used if ":" in n]  # selective:core_attn+mlp
    if "selective" in used and tuple(modules) != DEFAULT_RECOMPUTE_MODULES:
        sets.insert(0, "--recompute-modules " + ",".join(modules))
    other = "" if not sets else f" (SAPP's own selective recompute, not {', '.join(sets)})"
    console.print(f"SAPP recompute: {arrays['recompute']}, select_recompute: {arrays['select_recompute']}{other}",
                  highlight=False, soft_wrap=True)
    console.print(f"Megatron-LM:    {megatron_flags(plan, accounted, modules, mtp_num_layers)}", highlight=False,
                  soft_wrap=True)
    best, even = plan.best, plan.even
    line = f"Pipeline step time (simulated): balanced {_fmt_time(best.makespan_s)}"
    if even is not None:
        line += f", even split {_fmt_time(even.makespan_s)}"
        gain = plan.gain
        line += (f", gain {gain:+.1%}" if gain is not None else
                 f" (the even split does not fit the {plan.memory_limit_bytes / GIB:.1f} GiB limit)")
    else:
        line += " (no even split to compare with)"
    console.print(line, highlight=False)
    console.print(f"Ranks idle {best.bubble_fraction:.1%} of the simulated pipeline part (fill, drain and waits for "
                  f"slower stages); balanced in {plan.solve_time_s:.2f} s (the step time above is the simulated "
                  "pipeline part: compute, recompute, p2p, idle)", highlight=False, soft_wrap=True)


@app.command("balance")
@user_errors
def balance_command(
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    tp: Tp = None, pp: Pp = None, dp: Dp = None, cp: Cp = None, vpp: Vpp = None, ep: Ep = None, etp: Etp = None,
    mbs: Mbs = None, zero: Zero = None, sp: Sp = None, recompute: RecomputeOpt = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None,
    script: Script = None, vocab_size: VocabSize = None, recompute_modules: RecomputeModules = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    fp8_recipe: Fp8Recipe = None,
    layers: Annotated[Optional[str], typer.Option("--layers", help="JSON/YAML per-layer costs instead of the "
                                                  "model (see autopar.pipeline.layers_file)")] = None,
    form: Annotated[str, typer.Option(help="explicit (any split, per-stage recompute) | megatron "
                                      "(equal middle stages, one recompute)")] = "explicit",
    options: Annotated[Optional[str], typer.Option("--options", help="recompute options to choose from, e.g. "
                                                   "none,selective,full,selective:core_attn+mlp (selective "
                                                   "recompute of those --recompute-modules) [default: "
                                                   "none,selective,full]")] = None,
    memory_limit_gib: Annotated[Optional[float], typer.Option("--memory-limit-gib", help="usable memory per "
                                                              "device [default: the device's less "
                                                              "--memory-margin]")] = None,
    memory_margin: Annotated[Optional[float], typer.Option(
        "--memory-margin", help="memory margin, as search's: the stages are balanced within (1-margin) x device "
        "memory, and only where no split fits there within the whole memory (the plan is then 'marginal', as search "
        "calls a layout above it) [default: 0.1]")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="write the timeline + memory figure (PNG)")] = None,
    time_limit_s: Annotated[float, typer.Option("--time-limit", help="seconds the integer program may take "
                                                "(its MIP gap is reported)")] = TIME_LIMIT_S,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Balance pipeline stages: layers (per chunk) and recompute per stage vs the even split."""
    from autopar.pipeline.balance import balance

    if form not in FORMS:
        raise AutoparError(f"--form={form!r}: allowed {', '.join(FORMS)}")
    if not 0 < time_limit_s <= MAX_TIME_LIMIT_S:  # also nan
        raise AutoparError(f"--time-limit={time_limit_s}: must be a number of seconds in (0, {MAX_TIME_LIMIT_S:g}]")
    if memory_limit_gib is not None and not 0 < memory_limit_gib <= MAX_MEMORY_BYTES / GIB:  # also nan, inf
        raise AutoparError(f"--memory-limit-gib={memory_limit_gib}: must be a number in (0, {MAX_MEMORY_BYTES / GIB:.0f}]")
    limit = None if memory_limit_gib is None else memory_limit_gib * GIB
    if memory_margin is not None and (memory_limit_gib is not None or layers):
        given = "--memory-limit-gib" if memory_limit_gib is not None else "--layers (its memory_limit_bytes)"
        raise AutoparError(f"--memory-margin={memory_margin:g} with {given}: that limit is used as given; drop one")
    margin = DEFAULT_MEMORY_MARGIN if memory_margin is None else memory_margin
    if not 0 <= margin < 1:  # also nan
        raise AutoparError(f"--memory-margin={margin}: must be in [0, 1)")
    refuse_overwriting_inputs({"--model": model, "--script": script, "--device-file": device_file, "--layers": layers},
                              {"--plot": (plot, [Path(plot)] if plot else [])})
    refuse_unwritable_figure("--plot", plot)  # before the work, not after the table
    names = tuple(o.strip() for o in options.split(",") if o.strip()) if options else None
    if options is not None and not names:  # ",,," crashed with an IndexError
        raise AutoparError(f"--options={options!r}: name one or more recompute options, e.g. none,selective")
    even_split, even_chunks, accounted, modules, header = None, None, False, DEFAULT_RECOMPUTE_MODULES, ""
    device_bytes = None  # the device's memory, where the limit is its less the margin (no explicit limit)
    if layers:
        from autopar.pipeline.layers_file import load_layers_file

        given = {"model": model, "script": script, "device": device, "device-file": device_file, "tp": tp, "pp": pp,
                 "dp": dp, "cp": cp, "vpp": vpp, "ep": ep, "etp": etp, "mbs": mbs, "zero": zero, "sp": sp,
                 "recompute": recompute, "recompute-layers": recompute_layers, "gbs": gbs, "seq-len": seq_len,
                 "nodes": nodes, "recompute-modules": recompute_modules, "moe-token-imbalance": moe_token_imbalance,
                 "devices-per-node": devices_per_node, "precision": precision, "vocab-size": vocab_size,
                 "device-set": device_set, "make-vocab-size-divisible-by": vocab_pad,
                 "flash-attention" if flash_attention else "no-flash-attention": flash_attention,
                 "fp8-param-storage" if fp8_param_storage else "no-fp8-param-storage": fp8_param_storage,
                 "fp8-recipe": fp8_recipe}
        clash = [f"--{k}" for k, v in given.items() if v is not None]
        if clash:
            raise AutoparError(f"--layers with {', '.join(clash)}: the layer file gives the costs, sizes and "
                               "memory limit; drop those options or --layers")

        mtp_num_layers = 0  # a layer file has no MTP layers
        loaded = load_layers_file(layers)
        table, num_vpp, m, sched = loaded.table, loaded.vpp, loaded.num_microbatches, schedule or loaded.schedule
        if limit is not None:
            from dataclasses import replace

            table = replace(table, memory_limit_bytes=limit)
        baseline, title = (names or table.options)[0], f"{layers}"
        limit_name = f"--layers {layers}: memory_limit_bytes={table.memory_limit_bytes:g}"
    else:
        from autopar.pipeline.layers import layer_table, module_set_option
        from autopar.rules import check_strategy

        if model is None and script is None:
            raise AutoparError("give --model (or --script), or --layers FILE")
        p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file,
                                 device_set, flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance,
                                 fp8_param_storage, fp8_recipe=fp8_recipe)
        layout = dict(tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, zero=zero, sp=sp, recompute=recompute,
                      recompute_layers=recompute_layers, layers_per_stage=None,
                      recompute_modules=recompute_modules_option(p, recompute_modules))
        s = strategy_from_options(p, script, layout, dp, schedule)
        modules, mtp_num_layers = s.recompute_modules, p.model.mtp_num_layers
        check_strategy(p, s)
        if s.pp == 1:
            raise AutoparError("--pp=1: nothing to balance (give --pp 2 or more)")
        accounted = s.account_for_embedding or s.account_for_loss
        if accounted:  # compare against the chunks the layout runs, not Megatron's default ones
            even_chunks = layout_of(p, s).decoder
        module_sets = tuple(parse_recompute_modules(n.split(":", 1)[1].replace("+", ","), f"--options {n}")
                            for n in names or () if n.startswith("selective:"))
        names = names and tuple(module_set_option(m) if n.startswith("selective:") else n
                                for n, m in zip(names, _module_sets_in_order(names, module_sets)))
        if limit is None:
            device_bytes = p.cluster.device.memory_bytes
            limit = (1 - margin) * device_bytes
        elif limit > p.cluster.device.memory_bytes:  # a plan over the device's memory was printed as fitting
            raise AutoparError(f"--memory-limit-gib={memory_limit_gib:g}: above the {p.cluster.device.name}'s "
                               f"{p.cluster.device.memory_bytes / GIB:.1f} GiB; give at most that, or another "
                               "device memory with --device-set memory_bytes=...")
        table, num_vpp, sched = layer_table(p, s, limit, module_sets), s.vpp, s.schedule
        m = s.num_microbatches(p.train.global_batch_size)
        baseline = s.recompute if names is None or s.recompute in names else names[0]
        title = f"{p.model.name} tp{s.tp} pp{s.pp}" + (f" vpp{s.vpp}" if s.vpp > 1 else "")
        limit_name = (f"device {p.cluster.device.name} memory less --memory-margin {margin:g} "
                      f"({table.memory_limit_bytes / GIB:.1f} GiB)")
        header = (f"[bold]{escape(p.model.name)}[/] ({p.model.num_layers} layers) on {p.world_size} "
                  f"{p.cluster.device.name}: tp {s.tp}, pp {s.pp}, vpp {s.vpp}, dp {s.dp}, {m} micro-batches, ")
    unknown = [n for n in names or () if n not in table.options]
    if unknown:  # was "recompute='x': this layer table has ..."
        raise AutoparError(f"--options={options!r}: {', '.join(map(repr, unknown))} not among the recompute options "
                           f"{', '.join(table.options)}")
    if memory_limit_gib is not None:
        limit_name = f"--memory-limit-gib={memory_limit_gib:g}"
    run = lambda t, name: balance(t, num_vpp, m, sched, options=names, form=form, baseline=baseline,  # noqa: E731
                                  even_split=even_split, limit_name=name, time_limit_s=time_limit_s,
                                  even_chunks=even_chunks)
    marginal = False
    with progress_shown(quiet), phase("balance", description="balancing the pipeline stages (integer program)"):
        try:
            plan = run(table, limit_name)
        except NoFitError:
            if device_bytes is None or margin == 0:
                raise
            # as search ranks a layout above the margin after those within it: nothing fits within, so the whole
            # memory, and the plan is marginal
            from dataclasses import replace

            table, marginal = replace(table, memory_limit_bytes=device_bytes), True
            plan = run(table, f"device {p.cluster.device.name} memory ({device_bytes / GIB:.1f} GiB)")
    if header:
        header += limit_text(plan.memory_limit_bytes, device_bytes, margin, marginal)
    if as_json:
        print_json("balance", {**plan_document(plan, mtp_num_layers),
                               "memory_margin": None if device_bytes is None else margin, "marginal": marginal})
    if plot:
        from autopar.pipeline.plot import plot_plan

        err_console.print(f"wrote {plot_plan(plan, plot, title)}", highlight=False)
    if as_json:
        return
    if header:  # after the balancing, so a refusal is the one line printed
        console.print(header, soft_wrap=True)
    print_plan(plan, accounted, modules, mtp_num_layers)
