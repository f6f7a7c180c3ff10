"""Run written jobs one after another and read each log into a result (``result.json`` per job)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from autopar.errors import AutoparError
from autopar.progress import advance, phase
from autopar.verify.jobs import JOB_FILE, Job
from autopar.verify.launch import Outcome, SlurmOptions, run_local, run_slurm
from autopar.verify.logs import RunResult, parse_log

RESULT_FILE = "result.json"


def result_of(job: Job, outcome: Outcome | None, warmup: int) -> RunResult:
    """Parse ``job``'s log (an absent log reads as empty); ``outcome`` None: the job was not run."""
    text = job.log_path.read_text(errors="replace") if job.log_path.exists() else ""
    if outcome is None:
        return parse_log(text, job.framework, seq_len=job.seq_len, global_batch_size=job.global_batch_size,
                         world_size=job.world_size, exit_code=0 if text else None, warmup=warmup)
    return parse_log(text, job.framework, seq_len=job.seq_len, global_batch_size=job.global_batch_size,
                     world_size=job.world_size, exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                     warmup=warmup)


def run_jobs(jobs: list[Job], launcher: str, time_limit_s: float, slurm: SlurmOptions | None = None,
             warmup: int = 2, on_done: Callable[[Job, RunResult], None] | None = None,
             budget_s: float | None = None) -> list[RunResult]:
    """Run each job (``launcher``: ``local`` or ``slurm``), parse its log, save ``result.json``.

    A failed job is a result (its ``failure`` and ``cause``), never an exception. With
    ``budget_s`` (black-box search over many layouts), no job starts once that many seconds
    have passed; the rest are results with failure ``not_run``."""
    results = []
    start = time.monotonic()
    with phase("verify", total=len(jobs), description="running the verify jobs"):
        for job in jobs:
            results.append(_run_one(job, launcher, time_limit_s, slurm, warmup, budget_s, start))
            if on_done:
                on_done(job, results[-1])
            advance()
    return results


def _run_one(job: Job, launcher: str, time_limit_s: float, slurm: SlurmOptions | None, warmup: int,
             budget_s: float | None, start: float) -> RunResult:
    """One job of :func:`run_jobs` (``start``: its ``time.monotonic`` start, for ``budget_s``)."""
    if budget_s is not None and time.monotonic() - start >= budget_s:
        return RunResult(failure="not_run", cause=f"the --budget-s {budget_s:g} s was spent before it started")
    if launcher == "slurm":
        outcome = run_slurm(job, time_limit_s, slurm or SlurmOptions())
    else:
        outcome = run_local(job, time_limit_s)
    result = result_of(job, outcome, warmup)
    doc = {"outcome": {"exit_code": outcome.exit_code, "timed_out": outcome.timed_out, "wall_s": outcome.wall_s,
                       "slurm_job_id": outcome.slurm_job_id}, **result.to_dict()}
    (Path(job.folder) / RESULT_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return result


def stored_results(out: str | Path, warmup: int) -> tuple[list[Job], list[RunResult]]:
    """The jobs written under ``out`` and their results read from their logs (a job without a
    log is ``not_run``), in search order.

    Raises:
        AutoparError: ``out`` holds no job folder (names ``--out``).
    """
    folders = sorted(d for d in Path(out).glob("*") if (d / JOB_FILE).is_file())
    if not folders:
        raise AutoparError(f"--out={str(out)!r}: holds no jobs autopar verify wrote (no */{JOB_FILE})")
    jobs = sorted((Job.load(d) for d in folders), key=lambda j: j.rank)
    results = [result_of(j, None, warmup) if j.log_path.exists() else
               RunResult(failure="not_run", cause=f"no {j.log_path.name} in {j.folder}") for j in jobs]
    return jobs, results
