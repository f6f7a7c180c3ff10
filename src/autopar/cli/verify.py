"""``autopar verify`` and ``autopar calibrate`` (registered on :data:`autopar.cli.app`).

``verify`` writes one short-run job per layout (the top ``--top`` of a search, or of ``--from``'s
result), runs them (``--launcher local|slurm``; ``none`` only writes them), reads their logs and
prints predicted vs measured, re-ranked by the measurement (:mod:`autopar.verify`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from autopar.cli.app import app, console, err_console, progress_shown, user_errors
from autopar.cli.inputs import positive, problem_from_options
from autopar.cli.json_output import print_json
from autopar.cli.options import (
    Device,
    DeviceFile,
    DeviceSet,
    Flash,
    Gbs,
    Json,
    Model,
    Nodes,
    PerNode,
    Precision,
    Quiet,
    SeqLen,
    VocabPad,
    VocabSize,
)
from autopar.errors import AutoparError

LAUNCHERS = ("local", "slurm", "none")


def _layouts(p, from_result: str | None, top: int, target: str, max_devices: int | None):
    """[(rank, estimate)] of the layouts to run, the problem they run on, and the full plans the
    small runs stand for (rank -> dict)."""
    from autopar.estimate import estimate
    from autopar.export.result import strategy_from_result
    from autopar.search import search as run_search
    from autopar.verify.shrink import shrink

    if from_result:
        doc_layouts = []
        for rank in range(1, top + 1):
            try:
                doc_layouts.append((rank, estimate(p, strategy_from_result(from_result, rank, p))))
            except AutoparError as err:
                if rank > 1 and str(err).startswith("--rank="):
                    break  # fewer layouts than --top
                raise
    else:
        doc_layouts = list(enumerate(run_search(p, top, target=target).layouts, 1))
    if max_devices is None or p.world_size <= max_devices:
        return p, doc_layouts, {}
    runs, stands_for, small_p = [], {}, None
    for rank, e in doc_layouts:
        small = shrink(p, e.strategy, max_devices)
        if target == "torchtitan" and small.problem.model.num_layers != p.model.num_layers:
            raise AutoparError(f"--max-devices={max_devices}: layout #{rank} runs small with "
                               f"{small.problem.model.num_layers} of {p.model.num_layers} layers, and a torchtitan "
                               "flavor fixes the layer count; allow more devices or verify with --script")
        if small_p is not None and small.problem.world_size != small_p.world_size:
            raise AutoparError(f"--max-devices={max_devices}: layout #{rank} shrinks to {small.problem.world_size} "
                               f"devices, the others to {small_p.world_size}; verify it in a separate run")
        small_p = small.problem
        runs.append((rank, estimate(small.problem, small.strategy)))
        stands_for[rank] = small.stands_for(p, e)
    return small_p, runs, stands_for


@app.command()
@user_errors
def verify(
    model: Model = None, device: Device = None, nodes: Nodes = None, devices_per_node: PerNode = None,
    gbs: Gbs = None, seq_len: SeqLen = None, precision: Precision = None, device_file: DeviceFile = None,
    device_set: DeviceSet = None, flash_attention: Flash = None, vocab_pad: VocabPad = None,
    vocab_size: VocabSize = None,
    script: Annotated[Optional[str], typer.Option(help="Megatron-LM/MindSpeed-LLM launch script: the problem's "
                                                  "defaults and the job each layout rewrites (never changed)")] = None,
    toml: Annotated[Optional[str], typer.Option(help="torchtitan job TOML (model name/flavor, optimizer, ...) the "
                                                "layout's sections are merged into (never changed)")] = None,
    from_result: Annotated[Optional[str], typer.Option("--from", help="search result JSON (autopar search --json or "
                                                       "--report's result.json); default: search now")] = None,
    top: Annotated[int, typer.Option(help="verify the top K layouts (up to 100: a black-box search over what the "
                                     "model keeps, bounded by --budget-s)")] = 3,
    budget_s: Annotated[Optional[float], typer.Option("--budget-s", help="start no job after this many seconds "
                                                      "(the rest are reported as not run)")] = None,
    out: Annotated[str, typer.Option(help="folder of the job folders (one per layout)")] = "out/verify",
    iters: Annotated[int, typer.Option(help="training iterations (steps) per job")] = 10,
    warmup: Annotated[int, typer.Option(help="iterations left out of the measured step time")] = 2,
    time_limit_s: Annotated[float, typer.Option("--time-limit-s", help="per job; killed (local) or Slurm's "
                                                "--time")] = 900.0,
    launcher: Annotated[str, typer.Option(help="local (torchrun here) | slurm (sbatch/srun) | none (write the "
                                          "jobs only)")] = "local",
    workdir: Annotated[Optional[str], typer.Option(help="folder the jobs run in (where you run the script) "
                                                   "[default: the current folder]")] = None,
    data: Annotated[str, typer.Option(help="mock (--mock-data) | script (the script's own data paths)")] = "mock",
    max_devices: Annotated[Optional[int], typer.Option(help="run smaller: fewer layers, pp stages and dp ranks, "
                                                       "the same tp/cp/ep/mbs/seq (at most this many devices)")] = None,
    account: Annotated[Optional[str], typer.Option(help="Slurm --account")] = None,
    partition: Annotated[Optional[str], typer.Option(help="Slurm --partition")] = None,
    container_image: Annotated[Optional[str], typer.Option(help="srun --container-image (pyxis)")] = None,
    container_mounts: Annotated[Optional[str], typer.Option(help="srun --container-mounts (pyxis)")] = None,
    sbatch_option: Annotated[Optional[list[str]], typer.Option(help="extra #SBATCH option, e.g. "
                                                               "--qos=high (repeatable)")] = None,
    record: Annotated[Optional[str], typer.Option(help="store the measured runs in this profile DB (for "
                                                  "autopar calibrate)")] = None,
    report_only: Annotated[bool, typer.Option("--report-only", help="write and run nothing: read the jobs and logs "
                                              "already in --out (e.g. run by hand after --launcher none)")] = False,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Run the top layouts for a few iterations in your framework; predicted vs measured, re-ranked."""
    from autopar.cli.paths import refuse_overwriting_inputs
    from autopar.search.grid import for_target
    from autopar.specs.targets import check_target
    from autopar.verify.jobs import write_jobs
    from autopar.verify.launch import SlurmOptions, check_sbatch_options
    from autopar.verify.run import run_jobs

    if record is not None:  # first: refused before any other check, any job or a --report-only reading
        if report_only:
            raise AutoparError(f"--record={record!r} with --report-only: --report-only reads the logs in --out and "
                               "stores nothing; drop --record, or run verify without --report-only to store the runs")
        from autopar.profile.opdb import refuse_unusable_db

        refuse_unusable_db(record, "--record")
    if report_only:
        from autopar.verify.run import stored_results

        _report(*stored_results(out, warmup), as_json)
        return
    if launcher not in LAUNCHERS:
        raise AutoparError(f"--launcher={launcher!r}: allowed {', '.join(LAUNCHERS)}")
    slurm_given = {"--account": account, "--partition": partition, "--container-image": container_image,
                   "--container-mounts": container_mounts, "--sbatch-option": sbatch_option or None}
    if launcher != "slurm" and any(v is not None for v in slurm_given.values()):
        name = next(k for k, v in slurm_given.items() if v is not None)
        raise AutoparError(f"{name} is a Slurm option and --launcher is {launcher!r}: add --launcher slurm or drop "
                           f"{name} (it would be ignored)")
    extra = check_sbatch_options(sbatch_option or ())
    if data not in ("mock", "script"):
        raise AutoparError(f"--data={data!r}: allowed mock, script")
    if script and toml:
        raise AutoparError("--script and --toml: give one (Megatron-LM/MindSpeed-LLM script or torchtitan TOML)")
    positive("--top", top, upper=100)
    if not 0 <= warmup < iters:
        raise AutoparError(f"--warmup={warmup}: must be in [0, --iters={iters})")
    if not 0 < time_limit_s <= 7 * 86400:
        raise AutoparError(f"--time-limit-s={time_limit_s}: allowed (0, 604800] (a week)")
    if max_devices is not None:
        positive("--max-devices", max_devices)
    if budget_s is not None and not budget_s > 0:
        raise AutoparError(f"--budget-s={budget_s:g}: must be > 0 seconds")
    refuse_overwriting_inputs({"--script": script, "--toml": toml, "--from": from_result, "--model": model,
                               "--device-file": device_file, "--record": record}, {"--out": (out, [Path(out)])})
    if from_result:  # the result carries its problem: options left out take its values, given ones must match
        from autopar.export.result import result_problem

        p = result_problem(from_result, model, script, vocab_size, device, device_file, device_set, nodes=nodes,
                           devices_per_node=devices_per_node, gbs=gbs, seq_len=seq_len, precision=precision,
                           flash=flash_attention, vocab_pad=vocab_pad)
    else:
        p = problem_from_options(model, device, nodes, devices_per_node, gbs, seq_len, precision, device_file,
                                 device_set, flash_attention, vocab_pad, script, vocab_size)
    if workdir is not None and not Path(workdir).expanduser().is_dir():
        raise AutoparError(f"--workdir={workdir!r}: not an existing folder (the jobs run there, e.g. your "
                           "Megatron-LM checkout)")
    if toml:
        framework = "torchtitan"
    else:
        from autopar.specs.script import read_script

        framework = read_script(script).framework if script else "megatron"
    check_target(p.cluster.device, framework, "--script" if script else "--toml")
    p = for_target(p, framework)
    run_p, layouts, stands_for = _layouts(p, from_result, top, framework, max_devices)
    jobs = write_jobs(run_p, layouts, out, framework, script=script, toml=toml, iters=iters, mock_data=data == "mock",
                      workdir=workdir, stands_for=stands_for)
    for job in jobs:
        err_console.print(f"wrote {job.folder}", highlight=False)
    if launcher == "none":
        return
    slurm = SlurmOptions(account=account, partition=partition, container_image=container_image,
                         container_mounts=container_mounts, extra=extra)
    with progress_shown(quiet):
        results = run_jobs(jobs, launcher, time_limit_s, slurm, warmup,
                           on_done=lambda j, r: err_console.print(f"ran {j.name}: {r.failure or 'ok'}", highlight=False),
                           budget_s=budget_s)
    if record:
        from autopar.verify.calibrate import record_runs

        stored = record_runs(record, run_p, jobs, results)
        failed = sum(r.failure is not None for r in results)
        err_console.print(f"stored {stored} runs in {record} ({stored - failed} measured, {failed} failed: calibrate "
                          "uses the measured ones)", highlight=False)
    _report(jobs, results, as_json)


def _report(jobs: list, results: list, as_json: bool) -> None:
    """Print the verify report (table and small-run notes, or ``--json``) and write
    ``report.png`` (predicted vs measured per layout) beside the job folders; when no job
    measured a step time, then one ``verify:`` line on stderr and exit code 3
    (:data:`autopar.verify.report.NO_MEASUREMENT_EXIT`), so a script does not take a run of
    failures for success."""
    from autopar.verify.report import NO_MEASUREMENT_EXIT, no_measurement, report_doc, report_png, report_table

    if jobs:
        png = Path(jobs[0].folder).parent / "report.png"
        png.write_bytes(report_png(jobs, results))
        err_console.print(f"wrote {png}", highlight=False)
    if as_json:
        print_json("verify", report_doc(jobs, results))
    else:
        console.print(report_table(jobs, results))
        for job in jobs:
            if job.stands_for:
                console.print(f"[bold]{escape(job.name)}[/] stands for {escape(job.stands_for['layout'])}: "
                              f"{escape(job.stands_for['note'])}", highlight=False, soft_wrap=True)
    failed = no_measurement(results) if jobs else None
    if failed:
        err_console.print(f"verify: {failed}; exit code {NO_MEASUREMENT_EXIT}", highlight=False)
        raise typer.Exit(code=NO_MEASUREMENT_EXIT)


@app.command()
@user_errors
def calibrate(
    db: Annotated[Optional[str], typer.Option("--db", help="profile DB (SQLite file) holding the runs that autopar "
                                              "verify --record FILE stored")] = None,
    device: Annotated[Optional[str], typer.Option(help="the device name the runs are stored under (default: "
                                                  "every device in --db)")] = None,
    framework: Annotated[Optional[str], typer.Option(help="megatron | mindspeed | torchtitan (default: each "
                                                     "stored)")] = None,
    min_runs: Annotated[int, typer.Option(help="runs a factor needs (>= 5% of their step in its class) to be "
                                          "applied")] = 3,
    as_json: Json = False,
) -> None:
    """Fit the model's efficiency factors to the stored runs (NNLS); later searches with --profile-db use them."""
    from rich.table import Table

    from autopar.profile.opdb import FILL_WITH_RUNS, OpDB
    from autopar.verify.calibrate import CLASSES, FACTORS, fit, stored_rows

    if db is None:
        raise AutoparError("--db: required: the profile database (SQLite file) of the runs to fit; 'autopar verify "
                           "... --record FILE' stores runs in FILE, then give --db FILE")
    positive("--min-runs", min_runs, upper=10_000)
    handle = OpDB(db, "--db", write=False, fill=FILL_WITH_RUNS)
    keys = sorted({(r["device"], r["framework"]) for r in handle.runs(device)
                   if framework is None or r["framework"] == framework})
    if not keys:
        handle.close()
        raise AutoparError(f"--db={db!r}: holds no verify runs{f' of --device {device!r}' if device else ''}"
                           f"{f' and --framework {framework!r}' if framework else ''}; store some with 'autopar verify ... "
                           f"--record {db}'")
    fits = [fit(d, f, stored_rows(handle, d, f), min_runs) for d, f in keys]
    handle.close()
    writer = OpDB(db, "--db")
    for f in fits:
        writer.put_calibration(f.device, f.framework, {c: (f.multipliers[c], f.runs[c], f.applied[c]) for c in CLASSES})
    writer.close()
    if as_json:
        print_json("calibrate", {"fits": [f.to_dict() for f in fits]})
        return
    for f in fits:
        t = Table(title=f"{f.device}, {f.framework}: {f.runs_used} runs")
        for col in ("class", "efficiencies", "multiplier", "runs", "applied"):
            t.add_column(col)
        for c in CLASSES:
            t.add_row(c, ", ".join(FACTORS[c]), f"{f.multipliers[c]:.3f}", str(f.runs[c]),
                      "yes" if f.applied[c] else f"no (< {min_runs} runs)")
        console.print(t)
        console.print(f"step-time error on the stored runs: {f.error_before:.1%} before, {f.error_after:.1%} after "
                      f"(RMS residual {f.residual:.1%})", highlight=False)


def print_calibration(summary: dict | None) -> None:
    """One line naming the efficiency factors a search took from stored runs."""
    if summary:
        used = [f"{c} x{v['multiplier']:.3f} ({v['runs']} runs)" for c, v in summary["factors"].items() if v["applied"]]
        console.print(f"calibrated from runs: {', '.join(used) or 'no factor has enough runs'}", highlight=False)


def verify_search(p, layouts: list, k: int, script: str | None, target: str) -> dict:
    """``search --verify K``: the top ``k`` of ``layouts`` (estimates, best first) run as ``autopar
    verify`` runs them by default (local torchrun, 10 iterations, jobs under ``out/verify``);
    prints the table on stderr and returns the ``--json`` report.

    Raises:
        AutoparError: no ``--script`` (torchtitan jobs need ``autopar verify --toml``), ``k`` < 1.
    """
    from autopar.verify.jobs import write_jobs
    from autopar.verify.report import report_doc, report_table
    from autopar.verify.run import run_jobs

    positive("--verify", k, upper=100)
    if not script or target == "torchtitan":
        raise AutoparError("--verify needs --script (a Megatron-LM/MindSpeed-LLM launch script) and --target megatron "
                           "or mindspeed; for torchtitan run autopar verify --toml")
    jobs = write_jobs(p, list(enumerate(layouts[:k], 1)), "out/verify", target, script=script)
    results = run_jobs(jobs, "local", 900.0,
                       on_done=lambda j, r: err_console.print(f"ran {j.name}: {r.failure or 'ok'}", highlight=False))
    err_console.print(report_table(jobs, results))
    return report_doc(jobs, results)
