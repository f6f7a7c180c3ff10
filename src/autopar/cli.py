"""The ``autopar`` command line (typer + rich): ``search``, ``estimate``, ``devices``.

User errors print one line (``error: ...``) on stderr and exit with code 2; they never show a
traceback. ``--json`` prints one stable JSON document (see the README) on stdout.
"""

from __future__ import annotations

import json
import sys
import typing
from functools import wraps
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from typer.rich_utils import rich_format_error
from rich.markup import escape

from autopar.cli_inputs import (positive, problem_from_options, recompute_modules_option, strategy_from_options,
                                take_warnings)
from autopar.cli_config import Config
from autopar.cli_options import (Model, Script, VocabSize, Device, Nodes, PerNode, Gbs, SeqLen, Precision, DeviceFile,
                                 DeviceSet, Flash, VocabPad, Json, MoeImbalance, Fp8ParamStorage, RecomputeModules,
                                 Margin, ProfileDb, ProfileDevice, ProfileStandsFor, Tp, Pp, Dp, Cp, Vpp, Ep, Etp,
                                 Mbs, Zero, Sp, TpCommOverlap, CpCommType, CpA2a, RecomputeOpt, RecomputeLayers,
                                 ScheduleOpt, LayersPerStage, RecomputePerStage, PipelineLayoutOpt, EmbeddingLoss)
from autopar.cli_paths import refuse_empty, refuse_overwriting_inputs
from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.search import options as S
from autopar.specs import device_names, load_device

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Plan the parallel layout of LLM training before spending GPU hours.")
# Pipes and CI logs get a wide console so the tables are not squeezed to 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


@app.callback()
def _options_file(config: Config = None) -> None:
    """Plan the parallel layout of LLM training before spending GPU hours."""


def option_names(fn: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> the long option a user types for it (``from_result`` -> ``--from``), read
    from the command's ``typer.Option`` declarations (``--`` + the name with dashes where none)."""
    names = {}
    for param, hint in typing.get_type_hints(fn, include_extras=True).items():
        decls = [d for meta in getattr(hint, "__metadata__", ()) if isinstance(meta, typer.models.OptionInfo)
                 for d in (meta.default, *meta.param_decls) if isinstance(d, str)]  # Annotated: default = "--x"
        names[param] = next((d.split("/")[0] for d in decls if d.startswith("--")), "--" + param.replace("_", "-"))
    return names


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn :class:`AutoparError` into one red line on stderr and exit code 2; on success print
    the queued :func:`autopar.cli_inputs.warn_on_success` lines. An option given as an empty
    string is refused before the command runs (:func:`autopar.cli_paths.refuse_empty`)."""
    names: dict[str, str] = {}

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        take_warnings()
        try:
            names.update(names or option_names(fn))
            refuse_empty({names.get(k, k): v for k, v in kwargs.items()})
            result = fn(*args, **kwargs)
        except AutoparError as err:
            err_console.print(f"[red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        finally:
            queued = take_warnings()
        for message in queued:
            err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)
        return result

    return wrapper


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


def _search_outputs(model: str | None, script: str | None, device_file: str | None, profile_db: str | None,
                    write_script: str | None, report: str | None, top: int, plot: str | None = None) -> None:
    """Refuse ``search`` outputs that would overwrite its inputs (``--write-script`` writes up to
    ``top`` scripts, ``--report`` four files, ``--plot`` one; :func:`autopar.cli_paths.refuse_overwriting_inputs`)."""
    from pathlib import Path

    from autopar.export.rewrite import script_paths
    from autopar.report.html import report_paths

    refuse_overwriting_inputs(
        {"--model": model, "--script": script, "--device-file": device_file, "--profile-db": profile_db},
        {"--write-script": (write_script, script_paths(Path(write_script), top) if write_script else []),
         "--report": (report, report_paths(report) if report else []), "--plot": (plot, [Path(plot)] if plot else [])})


@app.command()
@_user_errors
def search(
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    top: Annotated[int, typer.Option(help="how many layouts to show")] = 10,
    memory_margin: Margin = 0.10, as_json: Json = False, script: Script = None, vocab_size: VocabSize = None,
    write_script: Annotated[Optional[str], typer.Option(help="with --script: write it back with the best layout "
                                                        "(--top N writes OUT.sh, OUT.2.sh, ...)")] = None,
    min_gain_pct: Annotated[Optional[float], typer.Option(help="--write-script: least predicted gain over the "
                                                          "script's own layout, % [default: autopar's step-time "
                                                          "MAPE on similar validation rows: 4.6 dense, 6.5 fp8, "
                                                          "24.8 MoE]")] = None,
    report: Annotated[Optional[str], typer.Option(help="write result.json, PNG charts and report.html here")] = None,
    profile_db: ProfileDb = None, profile_device: ProfileDevice = None, profile_stands_for: ProfileStandsFor = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    recompute_modules: RecomputeModules = None,
    target: Annotated[Optional[str], typer.Option(help="export format the layouts must run on unchanged: megatron | "
                                                  "megatron-bridge | mindspeed | torchtitan | deepspeed (one recompute "
                                                  "for all stages) | sapp | galvatron (recompute per stage); one that "
                                                  "does not run on --device is refused [default: megatron; mindspeed "
                                                  "on Ascend]")] = None,
    tp: S.Tp = None, pp: S.Pp = None, dp: S.Dp = None, cp: S.Cp = None, vpp: S.Vpp = None, ep: S.Ep = None,
    etp: S.Etp = None, mbs: S.Mbs = None, num_microbatches: S.Microbatches = None, zero: S.Zero = None,
    recompute: S.Recompute = None, schedule: S.Schedule = None, sp: S.Sp = None,
    tp_comm_overlap: S.TpCommOverlap = None, cp_comm_type: S.CpCommType = None, no_tp: S.NoTp = False,
    no_pp: S.NoPp = False, no_cp: S.NoCp = False, no_ep: S.NoEp = False, no_vpp: S.NoVpp = False,
    no_fsdp: S.NoFsdp = False, no_recompute: S.NoRecompute = False, explain: S.Explain = None,
    gbs_range: S.GbsRange = None, plot: S.Plot = None, config: Config = None,
    verify: Annotated[Optional[int], typer.Option("--verify", help="then run the top K layouts for a few iterations "
                                                  "with --script (autopar verify's defaults: local torchrun, 10 "
                                                  "iterations, jobs in out/verify)")] = None,
) -> None:
    """Search every valid layout, drop those that do not fit, rank the rest by step time."""
    from autopar.export.megatron import megatron_args
    from autopar.report.table import search_summary, search_table
    from autopar.search import search as run_search
    from autopar.search.explain import explain_layout
    from autopar.space import SpaceOptions

    S.check_modes(gbs_range, plot, explain, write_script, report)
    _search_outputs(model, script, device_file, profile_db, write_script, report, positive("--top", top, upper=1000),
                    plot)
    constraints = S.constraints_from_options(
        tp, pp, dp, cp, vpp, ep, etp, mbs, num_microbatches, zero, recompute, schedule, sp,
        {"--no-tp": no_tp, "--no-pp": no_pp, "--no-cp": no_cp, "--no-ep": no_ep, "--no-vpp": no_vpp,
         "--no-fsdp": no_fsdp, "--no-recompute": no_recompute}, tp_comm_overlap, cp_comm_type)
    p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance, fp8_param_storage)
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
    from autopar.profile.cli import print_coverage, profiled

    ops_db = profile_db if calibration is None or calibration["operator_rows"] else None  # a DB of runs only
    with profiled(p, ops_db, profile_device, profile_stands_for) as coverage:
        modules = recompute_modules_option(p, recompute_modules)
        options = SpaceOptions(recompute_modules=modules) if modules else None
        if gbs_range:
            from autopar.report.batch import run_batch_search

            return run_batch_search(console, p, gbs_range, plot, memory_margin, options, target, constraints, as_json)
        result = run_search(p, top, memory_margin, options=options, target=target, constraints=constraints)
        explained = explain and explain_layout(p, explain, result, memory_margin, options, target, constraints)
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

        for line in write_scripts(script, p, result, write_script, min_gain_pct):
            err_console.print(line, highlight=False, markup=False, soft_wrap=True)
    if report:
        from autopar.report.html import write_report

        err_console.print(f"wrote {write_report(p, result, report)}", highlight=False)
    if verify is not None:
        from autopar.cli_verify import verify_search

        verified = verify_search(p, result.layouts, verify, script, target)
    if as_json:
        doc = result.to_dict()
        doc["megatron_args"] = best_args
        if verify is not None:
            doc["verify"] = verified
        if measured:
            doc["profile"] = measured
        if calibration:
            doc["calibration"] = calibration
        if explained:
            doc["explain"] = explained.to_dict()
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    console.print(f"[bold]{p.model.name}[/] ({p.model.num_params / 1e9:.1f} B params) on {p.cluster.num_nodes} x "
                  f"{p.cluster.devices_per_node} {p.cluster.device.name}, gbs {p.train.global_batch_size}, "
                  f"seq {p.train.seq_len}, {p.train.precision}")
    console.print(search_table(result))
    console.print(search_summary(result), highlight=False, soft_wrap=True)
    if best_args is None:
        console.print(f"\nMegatron-LM cannot run #1 ({escape(best_args_refused)}): write it with autopar export "
                      f"--format {target}", highlight=False, soft_wrap=True)
    else:
        console.print("\n[bold]Megatron-LM arguments for #1:[/]")
        console.print(best_args, highlight=False, soft_wrap=True)
        if target != "megatron":  # the Megatron flags above are not the target's config
            console.print(f"\n--target {target}: write #1's own config with autopar export --format {target} "
                          "--from RESULT.json (this search's --json output) and the same model/cluster options",
                          highlight=False, soft_wrap=True)
    if measured:
        print_coverage(measured)
    from autopar.cli_verify import print_calibration

    print_calibration(calibration)
    if explained:
        console.print("\n" + explained.text(), highlight=False, markup=False, soft_wrap=True)


@app.command()
@_user_errors
def estimate(
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    tp: Tp = None, pp: Pp = None, dp: Dp = None, cp: Cp = None, vpp: Vpp = None, ep: Ep = None, etp: Etp = None,
    mbs: Mbs = None, zero: Zero = None, sp: Sp = None, recompute: RecomputeOpt = None,
    tp_comm_overlap: TpCommOverlap = None, cp_comm_type: CpCommType = None, cp_a2a: CpA2a = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None, layers_per_stage: LayersPerStage = None,
    recompute_per_stage: RecomputePerStage = None, embedding_loss_split: EmbeddingLoss = None,
    pipeline_layout: PipelineLayoutOpt = None,
    memory_margin: Margin = 0.10, as_json: Json = False, script: Script = None, vocab_size: VocabSize = None,
    profile_db: ProfileDb = None, profile_device: ProfileDevice = None, profile_stands_for: ProfileStandsFor = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    recompute_modules: RecomputeModules = None, config: Config = None,
) -> None:
    """Estimate memory (per stage) and step time (with breakdown) of one explicit layout."""
    from autopar.estimate import estimate as run_estimate
    from autopar.report.table import print_estimate

    p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                 flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance, fp8_param_storage)
    layout = dict(tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, zero=zero, sp=sp, recompute=recompute,
                  recompute_layers=recompute_layers, layers_per_stage=layers_per_stage, pipeline_layout=pipeline_layout,
                  recompute_per_stage=recompute_per_stage, account_for_embedding=embedding_loss_split,
                  account_for_loss=embedding_loss_split, recompute_modules=recompute_modules_option(p, recompute_modules),
                  tp_comm_overlap=tp_comm_overlap, cp_comm_type=cp_comm_type, cp_a2a=cp_a2a)
    from autopar.profile.cli import print_coverage, profiled

    with profiled(p, profile_db, profile_device, profile_stands_for) as coverage:
        if not 0 <= memory_margin < 1:
            raise AutoparError(f"--memory-margin={memory_margin}: must be in [0, 1)")
        result = run_estimate(p, strategy_from_options(p, script, layout, dp, schedule), memory_margin)
        measured = coverage and coverage([result.strategy])
    if as_json:
        doc = result.to_dict(p.train.global_batch_size)
        if measured:
            doc["profile"] = measured
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    print_estimate(console, result)
    if measured:
        print_coverage(measured)


@app.command()
@_user_errors
def devices(as_json: Json = False) -> None:
    """List the device presets and their numbers (--json: every field, the names each preset
    answers to and the export formats that run on it)."""
    from autopar.report.table import devices_table
    from autopar.specs.cluster import preset_aliases
    from autopar.specs.targets import TARGETS_BY_VENDOR

    specs = [load_device(name) for name in device_names()]
    if as_json:
        docs = [{**d.model_dump(), "aliases": preset_aliases(d.name), "targets": list(TARGETS_BY_VENDOR[d.vendor])}
                for d in specs]
        sys.stdout.write(json.dumps(docs, indent=2) + "\n")
        return
    console.print(devices_table(specs))


# The files ``autopar validate`` writes into ``--out`` (autopar.validate.report.write_report).
VALIDATE_FILES = ("accuracy.md", "rows.md", "scatter.png")


@app.command()
@_user_errors
def validate(
    csv_path: Annotated[Optional[str], typer.Option("--csv", help="measurements CSV (default: "
                                                    "the published measurements shipped with autopar)")] = None,
    out: Annotated[str, typer.Option("--out", help="report directory")] = "out/validation",
) -> None:
    """Score autopar against published measurements; write accuracy.md, rows.md, scatter.png."""
    from pathlib import Path

    from autopar.validate import DEFAULT_CSV, run_validation

    refuse_overwriting_inputs({"--csv": csv_path or DEFAULT_CSV},
                              {"--out": (out, [Path(out) / name for name in VALIDATE_FILES])})
    try:
        results, paths = run_validation(csv_path or DEFAULT_CSV.resolve(), out)
    except OSError as err:
        raise AutoparError(f"--out={out!r}: cannot write the report ({err.strerror})") from None
    console.print(paths["accuracy"].read_text(), highlight=False, markup=False)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())}", highlight=False)


@app.command()
@_user_errors
def export(
    fmt: Annotated[str, typer.Option("--format", help="megatron | megatron-bridge | mindspeed | torchtitan | "
                                                 "deepspeed | galvatron | sapp")],
    from_result: Annotated[Optional[str], typer.Option("--from", help="search result JSON (autopar search --json "
                                                       "or --report's result.json)")] = None,
    rank: Annotated[int, typer.Option("--rank", help="which layout of --from, 1 = best")] = 1,
    out: Annotated[Optional[str], typer.Option("--out", help="write here instead of stdout (deepspeed: a directory or "
                                               "FILE.json; megatron_deepspeed_args.sh goes next to it)")] = None,
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    tp: Tp = None, pp: Pp = None, dp: Dp = None, cp: Cp = None, vpp: Vpp = None, ep: Ep = None, etp: Etp = None,
    mbs: Mbs = None, zero: Zero = None, sp: Sp = None, recompute: RecomputeOpt = None,
    tp_comm_overlap: TpCommOverlap = None, cp_comm_type: CpCommType = None, cp_a2a: CpA2a = None,
    recompute_layers: RecomputeLayers = None, schedule: ScheduleOpt = None, layers_per_stage: LayersPerStage = None,
    recompute_per_stage: RecomputePerStage = None, embedding_loss_split: EmbeddingLoss = None,
    pipeline_layout: PipelineLayoutOpt = None,
    script: Script = None, vocab_size: VocabSize = None,
    moe_token_imbalance: MoeImbalance = None, fp8_param_storage: Fp8ParamStorage = None,
    recompute_modules: RecomputeModules = None, config: Config = None,
) -> None:
    """Write one layout as a framework config: a search result's (--from, --rank) or an explicit one."""
    from pathlib import Path

    from autopar.export import FILE_PATHS, FILE_WRITERS, WRITERS
    from autopar.export.result import strategy_from_result
    from autopar.rules import check_strategy

    if fmt not in WRITERS:
        raise AutoparError(f"--format={fmt!r}: allowed {', '.join(WRITERS)}")
    if out is not None:
        refuse_overwriting_inputs(
            {"--from": from_result, "--model": model, "--script": script, "--device-file": device_file},
            {"--out": (out, FILE_PATHS[fmt](Path(out)) if fmt in FILE_PATHS else [Path(out)])})
    from autopar.search.grid import for_target

    if from_result:  # the result's own problem; options given must agree with it
        from autopar.export.result import result_problem

        p = for_target(result_problem(from_result, model, script, vocab_size, device, device_file, device_set,
                                      nodes=nodes, devices_per_node=devices_per_node, gbs=gbs, seq_len=seq_len,
                                      precision=precision, flash=flash_attention, vocab_pad=vocab_pad,
                                      moe_token_imbalance=moe_token_imbalance,
                                      fp8_param_storage=fp8_param_storage), fmt)
    else:
        p = for_target(problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision,
                                            device_file, device_set, flash_attention, vocab_pad, script, vocab_size,
                                            moe_token_imbalance, fp8_param_storage), fmt)
    from autopar.specs.targets import check_target

    check_target(p.cluster.device, fmt, "--format")
    layout = dict(tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp, mbs=mbs, zero=zero, sp=sp, recompute=recompute,
                  recompute_layers=recompute_layers, layers_per_stage=layers_per_stage, pipeline_layout=pipeline_layout,
                  recompute_per_stage=recompute_per_stage, account_for_embedding=embedding_loss_split,
                  account_for_loss=embedding_loss_split, recompute_modules=recompute_modules_option(p, recompute_modules),
                  tp_comm_overlap=tp_comm_overlap, cp_comm_type=cp_comm_type, cp_a2a=cp_a2a)
    if from_result:
        given = sorted(k for k, v in {**layout, "dp": dp, "schedule": schedule}.items() if v is not None)
        if given:
            raise AutoparError(f"--from with --{', --'.join(g.replace('_', '-') for g in given)}: the layout comes "
                               "from the search result; drop the layout options or --from")
        strategy = strategy_from_result(from_result, rank, p)
    else:
        strategy = strategy_from_options(p, script, layout, dp, schedule, target=fmt)
    check_strategy(p, strategy)
    text = WRITERS[fmt](p, strategy)
    if out and fmt in FILE_WRITERS:  # several files (deepspeed: the JSON and the script that reads it)
        written = FILE_WRITERS[fmt](p, strategy, Path(out))
        err_console.print(f"wrote {', '.join(map(str, written))}", highlight=False)
    elif out:
        try:
            Path(out).write_text(text)
        except OSError as err:
            raise AutoparError(f"--out={out!r}: cannot write ({err.strerror})") from None
        err_console.print(f"wrote {out}", highlight=False)
    else:
        sys.stdout.write(text)


def main(prog_name: str | None = None) -> None:
    """Console entry point (``autopar``; ``prog_name`` names it in usage lines): :data:`app`, with click's usage errors (unknown option,
    ``--gbs 1.5``, missing value) printed as one ``error:`` line naming the option, exit code 2.

    Typer's standalone mode would print them in a multi-line box; a bare ``autopar`` (or a group
    without a command) still shows the help. Exit codes: 0 success, 1 abort, 2 user error.
    """
    from pydantic import ValidationError

    try:
        code = app(standalone_mode=False, prog_name=prog_name)
    except typer.TyperException as err:  # typer's vendored click errors
        if type(err).__name__ == "NoArgsIsHelpError":
            rich_format_error(err)  # the help text, as standalone typer shows it
            sys.exit(err.exit_code)
        where = f" (see '{err.ctx.command_path} --help')" if getattr(err, "ctx", None) else ""
        cause = err.__cause__  # typer's value coercion: a pydantic error that holds the input
        got = f" (got {cause.errors()[0]['input']!r})" if isinstance(cause, ValidationError) else ""
        err_console.print(f"[red]error:[/] {escape(err.format_message())}{escape(got + where)}", highlight=False,
                          soft_wrap=True)
        sys.exit(err.exit_code)
    except typer.Abort:
        err_console.print("aborted", highlight=False)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


from autopar.profile.cli import profile_app  # noqa: E402  (the sub-app imports this module's options)

app.add_typer(profile_app, name="profile")

import autopar.pipeline.cli_balance  # noqa: E402,F401  (registers `autopar balance`)
import autopar.cli_verify  # noqa: E402,F401  (registers `autopar verify` and `autopar calibrate`)
