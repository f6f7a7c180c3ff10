"""``autopar search --layerwise``: the layer-wise search (:mod:`autopar.layerwise`) and its
Galvatron JSON, in a table or as ``--json``.

The constraint options of ``search`` steer it where they have a per-layer meaning: ``--pp`` (the
pipeline degrees), ``--tp`` (the tp degrees a layer may take), ``--num-microbatches`` (Galvatron's
``chunks``), ``--zero`` (0 / 2: the default data-parallel type, 3: per-layer ZeRO-3; ``--no-fsdp``
drops it), ``--recompute none`` / ``--no-recompute`` (no checkpointing), ``--sp`` / ``--no-sp``
(Megatron sequence parallelism, Galvatron's runtime ``--sequence-parallel``; both are tried
unless one is given; with it on, each tp > 1 layer may also be a Ulysses layer, Galvatron's
``use_sp``). The others pin
what a layer-wise plan does not have (cp, ep, vpp, mbs, ...) and are refused with it.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autopar.cli.json_output import print_json
from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.search.constraints import Constraint

Layerwise = Annotated[bool, typer.Option(
    "--layerwise", help="per-layer tp, data-parallel type (ZeRO-3 or the default) and checkpointing by dynamic "
    "programming over the layers of each stage (Galvatron's search); prints the plan and its Galvatron JSON; "
    "needs --target galvatron (the default with it)")]
_RECOMPUTE_NONE, _RECOMPUTE_FULL = 0, 2
_HARMLESS = {"cp", "ep", "etp", "vpp", "interleaved", "tp_comm_overlap"}  # allowed where the plan's value (1/0) passes


def search_options(constraints: list[Constraint]) -> dict:
    """``search_layerwise`` keyword arguments from ``search``'s constraints.

    Raises:
        AutoparError: a constraint the layer-wise search cannot honour, naming the option.
    """
    kwargs: dict = {"sp": None}  # Megatron SP on and off unless --sp / --no-sp pins it
    for c in constraints:
        allowed = set(c.allowed)
        if c.column == "pp":
            kwargs["pp_options"] = sorted(allowed)
        elif c.column == "tp":
            kwargs["tp_options"] = sorted(allowed)
        elif c.column == "num_microbatches":
            kwargs["microbatch_options"] = sorted(allowed)
        elif c.column == "zero":
            defaults = tuple(sorted(allowed & {0, 2}))
            if not defaults:
                raise AutoparError(f"{c.text} with --layerwise: a layer-wise plan needs 0 (ddp) or 2 (zero2) as "
                                   "Galvatron's default data-parallel type, with or without 3 (ZeRO-3 per layer)")
            kwargs.update(default_zeros=defaults, zero3=3 in allowed)
        elif c.column == "recompute":
            if not allowed <= {_RECOMPUTE_NONE, _RECOMPUTE_FULL} or _RECOMPUTE_NONE not in allowed:
                raise AutoparError(f"{c.text} with --layerwise: Galvatron checkpoints whole layers, chosen layer by "
                                   "layer; allowed --recompute none (no checkpointing) or none,full")
            kwargs["recompute"] = _RECOMPUTE_FULL in allowed
        elif c.column == "sp":
            kwargs["sp"] = None if len(allowed) > 1 else 1 in allowed
        elif c.column in _HARMLESS and (1 in allowed if c.column not in ("interleaved", "tp_comm_overlap")
                                        else 0 in allowed):
            continue
        else:
            raise AutoparError(f"{c.text} with --layerwise: the layer-wise search has no such choice (it chooses pp, "
                               "tp per layer, chunks, the data-parallel type and checkpointing; --tp, --pp, "
                               "--num-microbatches, --zero, --recompute, --sp steer it)")
    return kwargs


def refuse_modes(target: str | None, others: dict[str, object]) -> None:
    """Refuse ``--layerwise`` with a target that runs one layout for all layers, or with a
    ``search`` option that works on ranked uniform layouts.

    Raises:
        AutoparError: naming the target's reason or the option.
    """
    from autopar.export.galvatron_layerwise import layerwise_refusal

    if target is not None:
        why = layerwise_refusal(target)
        if why:
            raise AutoparError(f"--target {target} with --layerwise: {why}")
    given = [name for name, value in others.items() if value]
    if given:
        raise AutoparError(f"--layerwise writes one layer-wise plan; {', '.join(given)}: options of the ranked "
                           "uniform layouts: drop them or --layerwise")


def run_layerwise(console: Console, p: Problem, constraints: list[Constraint], as_json: bool,
                  memory_margin: float) -> None:
    """Search within ``1 - memory_margin`` of the device memory (``search --memory-margin``: the
    uniform search ranks layouts above it last), then print the plan (a table of runs of equal
    layers and the cost per stage) and its Galvatron JSON, or all of it as JSON.

    Raises:
        AutoparError: a refused constraint, a MoE model, or no plan that fits.
    """
    from autopar.export import galvatron_layerwise
    from autopar.layerwise import search_layerwise, uniform_plan

    why = galvatron_layerwise.refusal(p)  # before searching
    if why:
        raise AutoparError(f"Galvatron cannot run a layer-wise plan of this problem: {why}")
    limit = (1 - memory_margin) * p.cluster.device.memory_bytes
    result = search_layerwise(p, memory_limit_bytes=limit, **search_options(constraints))
    if result.plan is None:
        raise AutoparError(f"no layer-wise plan of {p.model.name} fits {1 - memory_margin:.0%} of "
                           f"{p.cluster.device.name} memory ({result.cells} (pp, chunks, dp type) cells searched)")
    plan, cost = result.plan, result.cost
    uniform = best_uniform(p, constraints, memory_margin)
    adopted = uniform_plan(p, uniform[2], limit) if uniform is not None else None
    if adopted is not None and adopted[1].step_time_s >= cost.step_time_s:
        adopted = None  # the dynamic programme's plan is at least as fast
    if adopted:
        plan, cost = adopted
    doc = galvatron_layerwise.config(p, plan)
    if as_json:
        print_json("search-layerwise", {
            "plan": plan.model_dump(mode="json"), "step_time_s": cost.step_time_s,
            "tokens_per_s_per_device": cost.tokens_per_s_per_device, "peak_memory_bytes": cost.peak_memory_bytes,
            "stage_memory_bytes": cost.stage_memory_bytes, "search_seconds": result.seconds,
            "galvatron": doc, "galvatron_runtime_flags": ["--sequence-parallel"] if plan.sp else [],
            "uniform_best": None if uniform is None else {"layout": uniform[0], "step_time_s": uniform[1]},
            "uniform_adopted": bool(adopted),
        })
        return
    console.print(f"[bold]{escape(p.model.name)}[/] on {p.cluster.num_nodes} x {p.cluster.devices_per_node} "
                  f"{p.cluster.device.name}, gbs {p.train.global_batch_size}, seq {p.train.seq_len}: layer-wise plan, "
                  f"pp {plan.pp}, {plan.num_microbatches} micro-batches, default data parallel "
                  f"{'ddp' if plan.default_zero == 0 else 'zero2'}, vocabulary tp {plan.vocab_tp}"
                  f"{' + ZeRO-3' if plan.vocab_zero3 else ''}{', ' + sp_text(plan) if plan.sp else ''}",
                  highlight=False, soft_wrap=True)
    if adopted:
        console.print(f"the best uniform layout ({uniform[0]}) is faster than the dynamic programme's layer-wise plan "
                      f"({result.cost.step_time_s:.3f} s, ranked by the closed-form 1F1B makespan): it is the plan "
                      "below, every layer alike", highlight=False, soft_wrap=True)
    console.print(_runs_table(p, plan, cost))
    if any(plan.ulysses):
        console.print(TP_LEGEND, highlight=False, soft_wrap=True)
    console.print(f"step {cost.step_time_s:.3f} s, {cost.tokens_per_s_per_device:,.0f} tokens/s per device; "
                  f"{result.cells} cells, {result.cells_solved} solved by dynamic programming, "
                  f"{result.plans_costed} plans costed in {result.seconds:.2f} s", highlight=False)
    if uniform is not None:
        from autopar.report.ties import problem_certainty

        band_pct = problem_certainty(p).step_time.band_pct
        console.print(escape(uniform_line(cost.step_time_s, uniform, band_pct)), highlight=False, soft_wrap=True)
    console.print("\n[bold]Galvatron JSON[/] (--galvatron_config_path"
                  f"{'; add the runtime flag --sequence-parallel' if plan.sp else ''}):")
    console.print(json.dumps(doc, indent=2), highlight=False, markup=False, soft_wrap=True)


TP_LEGEND = ("tp: the size of each layer's group; 'u': a Ulysses layer (DeepSpeed-Ulysses, Galvatron's use_sp): "
             "its group holds whole weights and splits the sequence, exchanging attention heads by all-to-all, "
             "instead of splitting the weights (Megatron TP)")


def sp_text(plan) -> str:
    """What Galvatron's runtime ``--sequence-parallel`` does in ``plan`` (``plan.sp``): Megatron
    sequence parallelism on its Megatron-TP layers (tp > 1, not Ulysses) and the sequence-sharded
    activations its Ulysses layers need (:mod:`autopar.layerwise.plan`), counted in layers."""
    ulysses = sum(plan.ulysses)
    megatron = sum(1 for t, u in zip(plan.tp, plan.ulysses) if t > 1 and not u)
    parts = ([f"Megatron sp on {megatron} tp layer{'s' * (megatron != 1)}"] if megatron else []) + (
        [f"Ulysses on {ulysses} layer{'s' * (ulysses != 1)}"] if ulysses else [])
    return "sequence parallel (" + (", ".join(parts) or "no tp > 1 layer") + ")"


def best_uniform(p: Problem, constraints: list[Constraint], memory_margin: float) -> tuple[str, float, object] | None:
    """The best uniform layout ``search --target galvatron`` ranks for the same problem (its label,
    step time (s) and :class:`~autopar.strategy.Strategy`), the layer-wise constraints (``--tp``,
    ``--pp``, ...) applied; None when none fits or a constraint has no uniform meaning."""
    from autopar.report.table import layout_label
    from autopar.search import search
    from autopar.search.grid import for_target

    try:
        best = search(for_target(p, "galvatron"), 1, memory_margin, target="galvatron",
                      constraints=constraints).layouts[0]
    except AutoparError:
        return None
    s = best.strategy
    return f"{layout_label(best)} mbs {s.mbs} zero {s.zero} recompute {s.recompute}", best.step_time_s, s


def uniform_line(layerwise_s: float, uniform: tuple[str, float], band_pct: float | None = None) -> str:
    """The layer-wise step against the best uniform layout's, for the same Galvatron target, and
    whether the difference is within autopar's step-time band ``band_pct`` (%; the ``≈1`` ties) or beyond it;
    the pipeline marks of the label (``pp4~``, ``+el``: :data:`autopar.report.table.SPLIT_MARKS`)
    are said after it, as the search table's legend says them."""
    from autopar.report.table import SPLIT_MARKS
    from autopar.report.ties import band_verdict

    label, step_s = uniform[:2]
    pp_part = next((word for word in label.split() if word.startswith("pp")), "")
    legend = [text for mark, text in SPLIT_MARKS.items() if mark in pp_part]
    verdict = "" if band_pct is None else f", {band_verdict(layerwise_s, step_s, band_pct)}"
    return (f"best uniform layout for --target galvatron: {label}, step {step_s:.3f} s; the layer-wise plan is "
            f"{layerwise_s / step_s - 1:+.1%} against it{verdict}" + (f" ({'; '.join(legend)})" if legend else ""))


def _runs_table(p: Problem, plan, cost) -> Table:
    """One row per run of consecutive layers with the same stage, tp (``u`` marks Ulysses), ZeRO-3
    and checkpoint."""
    table = Table(title="Layers (runs of equal layers)")
    for name in ("stage", "layers", "tp", "dp", "ZeRO-3", "checkpoint", "stage GiB", "stage ms/µbatch"):
        table.add_column(name, justify="right")
    for i, sl in enumerate(plan.stage_slices()):
        start = sl.start
        for j in range(sl.start, sl.stop + 1):
            if j == sl.stop or (plan.tp[j], plan.ulysses[j], plan.zero3[j], plan.recompute[j]) != (
                    plan.tp[start], plan.ulysses[start], plan.zero3[start], plan.recompute[start]):
                first = start == sl.start
                table.add_row(str(i) if first else "", f"{start}-{j - 1}",
                              f"{plan.tp[start]}{' u' if plan.ulysses[start] else ''}",
                              str(p.world_size // (plan.pp * plan.tp[start])), "yes" if plan.zero3[start] else "",
                              "yes" if plan.recompute[start] else "",
                              f"{cost.stage_memory_bytes[i] / 2 ** 30:.1f}" if first else "",
                              f"{cost.stage_microbatch_s[i] * 1e3:.1f}" if first else "")
                start = j
    return table
