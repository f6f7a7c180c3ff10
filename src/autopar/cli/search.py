"""``autopar search``: every valid layout, those that do not fit dropped, the rest ranked by step time."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.markup import escape

import autopar.cli.search_options as S
from autopar import STARTED_S
from autopar.cli.app import app, console, err_console, progress_shown, user_errors
from autopar.cli.config import Config
from autopar.cli.inputs import positive, problem_from_options, recompute_modules_option
from autopar.cli.json_output import print_json
from autopar.cli.knob_options import given_knobs
from autopar.cli.layerwise import Layerwise
from autopar.cli.options import (
    ActivationOffload,
    CudaGraphImpl,
    CudaGraphScope,
    Device,
    DeviceFile,
    DeviceSet,
    Flash,
    Fp8Bf16Layers,
    Fp8ParamStorage,
    Fp8Recipe,
    Gbs,
    Json,
    Margin,
    Model,
    MoeImbalance,
    Nodes,
    PerNode,
    Precision,
    ProfileDb,
    ProfileDevice,
    ProfileStandsFor,
    Quiet,
    RecomputeModules,
    Script,
    SeqLen,
    VocabPad,
    VocabSize,
)
from autopar.cli.paths import refuse_overwriting_inputs, refuse_unwritable_figure
from autopar.errors import AutoparError
from autopar.problem import Problem


def target_warning(p: Problem, layouts: list, target: str) -> str | None:
    """One line when ``--target``'s writer refuses the #1 layout, else None.

    The search skips layouts the target cannot write (:func:`autopar.search.grid.refusal`), but
    re-balancing the top k can still change #1 (e.g. an uneven split); this checks the final list.

    Args:
        p: the problem searched.
        layouts: the ranked layouts (``Estimate`` objects), best first.
        target: an ``autopar export`` format name.
    Returns:
        The refusal reason of #1 and the best rank the target can write (or that none can), or
        None when the target writes #1.
    """
    from autopar.search.grid import refusal

    first = refusal(p, target, layouts[0].strategy)
    if first is None:
        return None
    ok = next((i for i, e in enumerate(layouts[1:], 2) if refusal(p, target, e.strategy) is None), None)
    where = f"the best layout it can write is #{ok}" if ok else f"none of the top {len(layouts)} can be written"
    return f"--target {target} cannot run #1 unchanged ({first}); {where}"


def print_target_config(p: Problem, best, target: str) -> None:
    """Print, after a ``search --target T`` table (T not ``megatron``), #1's config in T's own form
    (:data:`autopar.export.WRITERS`) and the command that writes it from the search result, or
    T's reason for refusing it. For ``megatron-bridge`` also the recipe assumption
    (:func:`autopar.export.bridge_moe_recipes.note`).

    Args:
        p: the problem searched (already :func:`autopar.search.grid.for_target`'s).
        best: #1's ``Strategy``.
        target: an ``autopar export`` format name other than ``megatron``.
    """
    from autopar.export import WRITERS

    try:
        text = WRITERS[target](p, best)
    except AutoparError as err:
        console.print(f"\n--target {target} cannot write #1 ({escape(str(err))})", highlight=False, soft_wrap=True)
        return
    console.print(f"\n[bold]{target} config for #1:[/]")
    console.print(text.rstrip("\n"), highlight=False, markup=False, soft_wrap=True)
    console.print(f"\nthe same from this search's --json output (RESULT.json): autopar export --format {target} --from "
                  "RESULT.json [--rank N for row N]; the result holds the model and cluster", highlight=False,
                  markup=False, soft_wrap=True)
    if target == "megatron-bridge":
        from autopar.export.bridge_moe_recipes import note

        if (assumed := note(p)) is not None:
            console.print(f"\n--target megatron-bridge: {escape(assumed)}", highlight=False, soft_wrap=True)


def script_layout(p: Problem, script: str | None):
    """The ``--script``'s own layout on ``p`` (``ScriptPlan.strategy``), whose values fill the keys
    ``--explain`` leaves out; None without a script or when its layout cannot be built here
    (e.g. its tp * pp * cp does not divide this world: the keys are then left free)."""
    if script is None:
        return None
    from autopar.specs.script import read_script

    try:
        return read_script(script).strategy(p.world_size, p.model.num_layers)
    except AutoparError:
        return None


def _search_outputs(model: str | None, script: str | None, device_file: str | None, profile_db: str | None,
                    write_script: str | None, report: str | None, top: int, plot: str | None = None) -> None:
    """Refuse ``search`` outputs that would overwrite its inputs (``--write-script`` writes up to
    ``top`` scripts, ``--report`` four files, ``--plot`` one; :func:`autopar.cli.paths.refuse_overwriting_inputs`)
    and a ``--plot`` that is no ``.png`` file name in an existing folder."""
    from pathlib import Path

    written = []
    if write_script:
        from autopar.export.rewrite import script_paths

        written = script_paths(Path(write_script), top)  # top: the scripts asked for (1 without --top)
    refuse_unwritable_figure("--plot", plot, (".png",))  # the batch chart is PNG bytes
    reported = []
    if report:  # the report module loads matplotlib: only when a report is asked for
        from autopar.report.html import report_paths

        reported = report_paths(report)
    refuse_overwriting_inputs(
        {"--model": model, "--script": script, "--device-file": device_file, "--profile-db": profile_db},
        {"--write-script": (write_script, written), "--report": (report, reported),
         "--plot": (plot, [Path(plot)] if plot else [])})


@app.command()
@user_errors
def search(
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    top: Annotated[int, typer.Option(help="how many layouts to show")] = 10,
    memory_margin: Margin = 0.10, as_json: Json = False, script: Script = None, vocab_size: VocabSize = None,
    write_script: Annotated[Optional[str], typer.Option(help="with --script: write it back with the best layout "
                                                        "(--top N writes OUT.sh, OUT.2.sh, ... up to N; an "
                                                        "existing file there is replaced)")] = None,
    min_gain_pct: Annotated[Optional[float], typer.Option(help=S.MIN_GAIN_HELP)] = None,
    report: Annotated[Optional[str], typer.Option(help="write result.json, PNG charts and report.html here")] = None,
    profile_db: ProfileDb = None, profile_device: ProfileDevice = None, profile_stands_for: ProfileStandsFor = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    fp8_recipe: Fp8Recipe = None,
    cuda_graph_impl: CudaGraphImpl = None, cuda_graph_scope: CudaGraphScope = None,
    activation_offload_layers: ActivationOffload = None, fp8_bf16_layers: Fp8Bf16Layers = None,
    recompute_modules: RecomputeModules = None,
    target: Annotated[Optional[str], typer.Option(help="export format the layouts must run on unchanged: megatron | "
                                                  "megatron-bridge | mindspeed | torchtitan | deepspeed (one recompute "
                                                  "for all stages) | sapp | galvatron (recompute per stage); one that "
                                                  "does not run on --device is refused [default: megatron; mindspeed "
                                                  "on Ascend]")] = None,
    tp: S.Tp = None, pp: S.Pp = None, dp: S.Dp = None, cp: S.Cp = None, vpp: S.Vpp = None, ep: S.Ep = None,
    etp: S.Etp = None, mbs: S.Mbs = None, num_microbatches: S.Microbatches = None, zero: S.Zero = None,
    recompute: S.Recompute = None, schedule: S.Schedule = None, sp: S.Sp = None,
    tp_comm_overlap: S.TpCommOverlap = None, cp_comm_type: S.CpCommType = None, vocab_tp: S.VocabTp = None,
    vocab_sp: S.VocabSp = None, tp_consecutive: S.TpConsecutive = None, moe_dispatcher: S.MoeDispatcher = None,
    moe_ep_overlap: S.MoeEpOverlap = None, no_tp: S.NoTp = False,
    no_pp: S.NoPp = False, no_cp: S.NoCp = False, no_ep: S.NoEp = False, no_vpp: S.NoVpp = False,
    no_fsdp: S.NoFsdp = False, no_recompute: S.NoRecompute = False, explain: S.Explain = None,
    gbs_range: S.GbsRange = None, plot: S.Plot = None, config: Config = None,
    verify: Annotated[Optional[int], typer.Option("--verify", help="then run the top K layouts for a few iterations "
                                                  "with --script (autopar verify's defaults: local torchrun, 10 "
                                                  "iterations, jobs in out/verify)")] = None,
    layerwise: Layerwise = False,
    search_knobs: Annotated[bool, typer.Option(
        "--search-knobs", help="also search CUDA graphs (--cuda-graph-impl transformer_engine) and activation CPU "
        "offloading (--activation-offload-layers L/2 and L-1) where the options and the script leave them off: one "
        "search per setting, the setting whose #1 is fastest kept and said; --target megatron or megatron-bridge "
        "[default: off: the plan's own settings only]")] = False,
    quiet: Quiet = False,
) -> None:
    """Search every valid layout, drop those that do not fit, rank the rest by step time."""
    from autopar.export.megatron import megatron_args
    from autopar.report.table import problem_title, search_summary, search_table
    from autopar.search import search as run_search
    from autopar.search.explain import explain_layout
    from autopar.space import SpaceOptions

    S.check_modes(gbs_range, plot, explain, write_script, report)
    if search_knobs and (gbs_range or layerwise or write_script or verify is not None):
        raise AutoparError("--search-knobs may change the plan's CUDA graphs and offloading, which --write-script and "
                           "--verify (the script's layout flags only), --gbs-range and --layerwise do not carry; drop "
                           "them or --search-knobs")
    if layerwise:
        from autopar.cli.config import option_given
        from autopar.cli.layerwise import refuse_modes

        refuse_modes(target, {"--gbs-range": gbs_range, "--explain": explain, "--write-script": write_script,
                              "--report": report, "--verify": verify is not None, "--top": option_given("top")})
        target = target or "galvatron"
    S.refuse_gbs_with_range(gbs_range, gbs)
    from autopar.cli.config import option_given

    # --write-script without --top writes the best layout's script only, not one per row shown
    scripts_asked = positive("--top", top, upper=1000) if option_given("top") else 1
    _search_outputs(model, script, device_file, profile_db, write_script, report, scripts_asked, plot)
    constraints = S.constraints_from_options(
        tp, pp, dp, cp, vpp, ep, etp, mbs, num_microbatches, zero, recompute, schedule, sp,
        {"--no-tp": no_tp, "--no-pp": no_pp, "--no-cp": no_cp, "--no-ep": no_ep, "--no-vpp": no_vpp,
         "--no-fsdp": no_fsdp, "--no-recompute": no_recompute}, tp_comm_overlap, cp_comm_type,
        (vocab_tp, vocab_sp, tp_consecutive), (moe_dispatcher, moe_ep_overlap))
    p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance, fp8_param_storage,
                                 fp8_recipe=fp8_recipe, knobs=given_knobs(
                                     cuda_graph_impl, cuda_graph_scope, activation_offload_layers, fp8_bf16_layers))
    if etp is not None and p.model.num_experts == 0:  # estimate refuses it too (cli.inputs); it pinned tp to etp
        raise AutoparError(f"--etp={etp}: model {p.model.name} has no routed experts; expert tensor "
                           "parallelism applies to MoE models only (leave --etp unset)")
    S.refuse_moe_on_dense(p, moe_dispatcher, moe_ep_overlap)
    from autopar.search.grid import for_target
    from autopar.specs.targets import check_target, default_target

    target = target or default_target(p.cluster.device)
    check_target(p.cluster.device, target, "--target")
    p = for_target(p, target)
    from autopar.verify.calibrate import calibrated

    p, calibration = calibrated(p, profile_db, target)  # efficiency factors fitted to stored runs
    if not 0 <= memory_margin < 1:
        raise AutoparError(f"--memory-margin={memory_margin}: must be in [0, 1)")
    if write_script and not script:
        raise AutoparError("--write-script needs --script (the launch script to rewrite)")
    if min_gain_pct is not None and not write_script:
        raise AutoparError(f"--min-gain-pct={min_gain_pct:g} applies to --write-script only; add --write-script OUT.sh")
    from autopar.cli.profile import print_coverage, profiled

    ops_db = profile_db if calibration is None or calibration["operator_rows"] else None  # a DB of runs only
    with profiled(p, ops_db, profile_device, profile_stands_for) as coverage, progress_shown(quiet):
        modules = recompute_modules_option(p, recompute_modules)
        allowed = ["none"] if no_recompute else [w.strip() for w in recompute.split(",")] if recompute else None
        if modules and allowed is not None and "selective" not in allowed:  # was accepted and unused
            raise AutoparError(f"--recompute-modules={recompute_modules} with --recompute={','.join(allowed)}: the "
                               "modules are what selective recompute recomputes (Megatron-LM reads them under "
                               "selective granularity only); allow --recompute selective or drop --recompute-modules")
        options = SpaceOptions(recompute_modules=modules) if modules else None
        if layerwise:
            from autopar.cli.layerwise import run_layerwise

            return run_layerwise(console, p, constraints, as_json, memory_margin)
        if gbs_range:
            from autopar.report.batch import run_batch_search

            return run_batch_search(console, p, gbs_range, plot, memory_margin, options, target, constraints, as_json)
        knobs_line = None
        if search_knobs:  # one search per CUDA-graph / offload setting; the fastest #1 kept (autopar.search.knob_variants)
            from autopar.search.knob_variants import choose, summary

            chosen, result, tried = choose(p, target, lambda q: run_search(
                q, top, memory_margin, options=options, target=target, constraints=constraints))
            p, knobs_line = chosen.problem, summary(chosen, tried)
        else:
            result = run_search(p, top, memory_margin, options=options, target=target, constraints=constraints)
        explained = explain and explain_layout(p, explain, result, memory_margin, options, target, constraints,
                                               script_layout(p, script))
        measured = coverage and coverage([e.strategy for e in result.layouts])
    best = result.layouts[0]
    best_args_refused = ""
    try:
        best_args = megatron_args(p, best.strategy)
    except AutoparError as e:  # --target sapp/galvatron: recompute per stage or a free split
        best_args, best_args_refused = None, str(e)
    unwritable = target_warning(p, result.layouts, target)
    if unwritable:
        err_console.print(f"[yellow]warning:[/] {escape(unwritable)}", highlight=False, soft_wrap=True)
    if write_script:
        from autopar.export.rewrite import write_scripts

        for line in write_scripts(script, p, result, write_script, min_gain_pct, count=scripts_asked):
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    if report:
        from autopar.cli.config import given_command_line
        from autopar.report.html import write_report

        err_console.print(f"wrote {write_report(p, result, report, given_command_line())}", highlight=False)
    if verify is not None:
        from autopar.cli.verify import verify_search

        verified = verify_search(p, result.layouts, verify, script, target)
    from autopar.report.ties import problem_certainty, search_document

    flex_note = None if moe_dispatcher else _flex_note(p, target, result.layouts)  # pinned: the user's choice

    if as_json:
        doc = search_document(p, result)
        doc["megatron_args"] = best_args
        if verify is not None:
            doc["verify"] = verified
        if measured:
            doc["profile"] = measured
        if calibration:
            doc["calibration"] = calibration
        if explained:
            doc["explain"] = explained.to_dict()
        if knobs_line:
            doc["search_knobs"] = knobs_line
        if flex_note:
            doc["moe_dispatcher_note"] = flex_note
        if target == "megatron-bridge":
            from autopar.export.bridge_moe_recipes import note

            if (assumed := note(p)) is not None:
                doc["target_assumes"] = assumed
        doc["command_s"] = time.perf_counter() - STARTED_S  # wall time of the whole command, imports included
        print_json("search", doc)
        return
    console.print(problem_title(p))
    if explained:  # where it ranks first, the table and the Megatron arguments after; the reasons at the end
        console.print(explained.summary(), highlight=False, markup=False, soft_wrap=True)
    console.print(search_table(result, problem_certainty(p), p))
    console.print(search_summary(result), highlight=False, soft_wrap=True)
    if knobs_line:
        console.print(escape(knobs_line), highlight=False, soft_wrap=True)
    if flex_note:
        console.print(escape(flex_note), highlight=False, soft_wrap=True)
    if target != "megatron":  # the target's own config, not Megatron-LM flags it does not read
        print_target_config(p, best.strategy, target)
    elif best_args is None:
        console.print(f"\nMegatron-LM cannot run #1 ({escape(best_args_refused)})", highlight=False, soft_wrap=True)
    else:
        console.print("\n[bold]Megatron-LM arguments for #1:[/]")
        console.print(best_args, highlight=False, soft_wrap=True)
    if measured:
        print_coverage(measured)
    from autopar.cli.verify import print_calibration

    print_calibration(calibration)
    if explained:
        console.print("\n" + explained.text(), highlight=False, markup=False, soft_wrap=True)


def _flex_note(p: Problem, target: str, layouts: list) -> str | None:
    """:func:`autopar.export.comm_knobs.flex_tie_note` where a listed layout runs a flex dispatcher
    (deepep / hybridep), else None."""
    from autopar.export.comm_knobs import FLEX_BACKENDS, flex_tie_note

    if not any(e.strategy.ep > 1 and e.strategy.moe_dispatcher in FLEX_BACKENDS for e in layouts):
        return None
    return flex_tie_note(p, target)
