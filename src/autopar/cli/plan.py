"""``autopar plan``: profile (where a GPU is present), search and write the target's configs, in one command.

Tinker's one-shot mode: what ``autopar profile ops``, ``autopar search --target`` and ``autopar
export`` do one after the other, with the files in one folder (:mod:`autopar.oneshot`). The
``plan`` section of ``--config FILE`` holds its options like any other command's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from autopar.cli.app import app, console, err_console, user_errors
from autopar.cli.config import Config
from autopar.cli.inputs import positive, problem_from_options
from autopar.cli.json_output import print_json
from autopar.cli.options import (
    Device,
    DeviceFile,
    DeviceSet,
    Flash,
    Fp8ParamStorage,
    Gbs,
    Json,
    Margin,
    Model,
    MoeImbalance,
    Nodes,
    PerNode,
    Precision,
    Script,
    SeqLen,
    VocabPad,
    VocabSize,
)
from autopar.cli.paths import refuse_overwriting_inputs
from autopar.errors import AutoparError
from autopar.problem import Problem

PROFILE_MODES = ("auto", "on", "off")


def _profile_status(p: Problem, mode: str) -> str | None:
    """Why ``plan`` does not profile (None: it does). ``auto`` skips without a usable GPU or on
    another GPU than ``--device`` (its rows would not stand for the planned device); ``off`` skips.

    Raises:
        AutoparError: ``--profile`` not one of :data:`PROFILE_MODES`, or ``on`` where the
            machine cannot profile (with the reason).
    """
    from autopar.oneshot import no_accelerator_reason

    if mode not in PROFILE_MODES:
        raise AutoparError(f"--profile={mode!r}: allowed {', '.join(PROFILE_MODES)}")
    if mode == "off":
        return "--profile off"
    why = no_accelerator_reason()
    if why is None:
        from autopar.profile.ops import measured_on

        local = measured_on(None)
        if local.preset != p.cluster.device.name:
            why = (f"this machine's GPU is {local.name!r}, the plan is for {p.cluster.device.name} (its timings would "
                   "not stand for it; profile on that device or plan with --device for this one)")
    if why and mode == "on":
        raise AutoparError(f"--profile on: cannot profile here: {why}")
    return why


def _profile(p: Problem, db: Path, top: int, margin: float, target: str, repeats: int, out=console) -> None:
    """Measure into ``db`` the operator shapes of the ``top`` layouts of an analytic search
    (``autopar profile ops``'s selection); progress on the rich console ``out``."""
    from autopar.cli.profile import _measure_all
    from autopar.profile.opdb import OpDB
    from autopar.profile.shapes import strategy_ops, unique
    from autopar.search import search as run_search

    layouts = [e.strategy for e in run_search(p, top, margin, target=target).layouts]
    wanted = unique([op for s in layouts for op in strategy_ops(p, s)])
    dtype = "bf16" if p.train.precision == "fp8" else p.train.precision
    _measure_all(OpDB(str(db), "--out"), wanted, dtype, repeats, p.cluster.device.name, out)


@app.command()
@user_errors
def plan(
    out: Annotated[str, typer.Option("--out", help="folder for result.json, one config per layout (rank1...) and "
                                     "profile.db")],
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    script: Script = None, vocab_size: VocabSize = None, moe_token_imbalance: MoeImbalance = None,
    fp8_param_storage: Fp8ParamStorage = None,
    target: Annotated[Optional[str], typer.Option(help="export format to write: megatron | megatron-bridge | "
                                                  "mindspeed | torchtitan | deepspeed | galvatron | sapp [default: "
                                                  "megatron; mindspeed on Ascend]")] = None,
    top: Annotated[int, typer.Option(help="how many layouts to write")] = 3,
    profile: Annotated[str, typer.Option("--profile", help="auto: measure the operators first where this machine "
                                         "has the planned GPU, else say why not and plan analytically | on: "
                                         "refuse without one | off")] = "auto",
    repeats: Annotated[int, typer.Option(help="timed repeats per profiled operator")] = 5,
    memory_margin: Margin = 0.10, config: Config = None, as_json: Json = False,
) -> None:
    """Profile where a GPU is present, search, and write the target's configs into one folder."""
    from autopar.cli.profile import print_coverage, profiled
    from autopar.oneshot import PROFILE_NAME, plan_paths, write_plan
    from autopar.pipeline.rebalance import TARGETS
    from autopar.report.table import problem_title, search_summary, search_table
    from autopar.report.ties import problem_certainty
    from autopar.search import search as run_search
    from autopar.search.grid import for_target
    from autopar.specs.targets import check_target, default_target

    positive("--top", top, upper=1000)
    positive("--repeats", repeats, upper=1000)
    if target is not None and target not in TARGETS:
        raise AutoparError(f"--target={target!r}: allowed {', '.join(TARGETS)}")
    if Path(out).exists() and not Path(out).is_dir():
        raise AutoparError(f"--out={out!r}: is a file; give a folder (plan writes result.json and one config per "
                           "layout into it)")
    if not 0 <= memory_margin < 1:
        raise AutoparError(f"--memory-margin={memory_margin}: must be in [0, 1)")
    p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file, device_set,
                             flash_attention, vocab_pad, script, vocab_size, moe_token_imbalance, fp8_param_storage)
    target = target or default_target(p.cluster.device)
    check_target(p.cluster.device, target, "--target")
    p = for_target(p, target)
    folder = Path(out)
    refuse_overwriting_inputs({"--model": model, "--script": script, "--device-file": device_file},
                              {"--out": (out, plan_paths(folder, target, top))})
    skipped_why = _profile_status(p, profile)
    db = folder / PROFILE_NAME
    if skipped_why:
        err_console.print(f"profiling skipped: {escape(skipped_why)}; planning with the analytic model",
                          highlight=False, soft_wrap=True)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        _profile(p, db, top, memory_margin, target, repeats, err_console if as_json else console)
    with profiled(p, None if skipped_why else str(db), None) as coverage:
        result = run_search(p, top, memory_margin, target=target)
        measured = coverage and coverage([e.strategy for e in result.layouts])
    written, refused = write_plan(p, result, folder)
    if as_json:
        for line in refused:
            err_console.print(f"[yellow]not written:[/] {escape(line)}", highlight=False, soft_wrap=True)
        print_json("plan", {"out": str(folder), "target": target, "profiled": skipped_why is None,
                            "profile_skipped": skipped_why, "written": [str(w) for w in written],
                            "refused": refused, "profile": measured or None})
        return
    console.print(f"{problem_title(p)}, --target {target}")
    console.print(search_table(result, problem_certainty(p), p))
    console.print(search_summary(result), highlight=False, soft_wrap=True)
    if measured:
        print_coverage(measured)
    for line in refused:
        err_console.print(f"[yellow]not written:[/] {escape(line)}", highlight=False, soft_wrap=True)
    err_console.print(f"wrote {', '.join(map(str, written))}", highlight=False, soft_wrap=True)
