"""Predicted vs measured per layout, re-ranked by the measurement (rich table, JSON and PNG)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from autopar.verify.jobs import Job
from autopar.verify.logs import GIB, RunResult


def ranked(jobs: list[Job], results: list[RunResult]) -> list[tuple[Job, RunResult]]:
    """(job, result) pairs, the measured fastest (most tokens/s) first, then runs without a
    throughput (failed or unparsed) in their search order."""
    pairs = list(zip(jobs, results))
    return sorted(pairs, key=lambda jr: (jr[1].tokens_per_s is None, -(jr[1].tokens_per_s or 0), jr[0].rank))


NO_MEASUREMENT_EXIT = 3
"""Exit code of ``autopar verify`` when no job measured a step time (0: at least one did; 2:
bad input, before any job)."""


def no_measurement(results: list[RunResult]) -> str | None:
    """None when at least one run measured a step time; else what became of the runs, e.g.
    ``no job produced a measurement (2 runs: command_not_found 2)``, for the line ``verify``
    prints before exiting with :data:`NO_MEASUREMENT_EXIT`."""
    if any(r.step_time_s is not None for r in results):
        return None
    counts: dict[str, int] = {}
    for r in results:
        counts[r.failure or "no_steps"] = counts.get(r.failure or "no_steps", 0) + 1
    what = ", ".join(f"{failure} {n}" for failure, n in sorted(counts.items()))
    return f"no job produced a measurement ({len(results)} run{'s' if len(results) != 1 else ''}: {what})"


def _error(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured, or None."""
    return (predicted - measured) / measured if predicted and measured else None


def report_doc(jobs: list[Job], results: list[RunResult]) -> dict[str, Any]:
    """The stable ``autopar verify --json`` document: one entry per layout, re-ranked."""
    rows = []
    for new_rank, (job, r) in enumerate(ranked(jobs, results), 1):
        rows.append({"measured_rank": new_rank if r.tokens_per_s else None, "search_rank": job.rank, "job": job.name,
                     "folder": job.folder, "layout": job.layout, "predicted": job.predicted, "measured": r.to_dict(),
                     "step_time_error": _error(job.predicted["step_time_s"], r.step_time_s),
                     "memory_error": _error(job.predicted["peak_memory_bytes"], r.peak_allocated_bytes),
                     "stands_for": job.stands_for, "notes": job.notes})
    return {"layouts": rows, "runs": len(rows), "failed": sum(1 for r in results if not r.ok)}


def _pct(x: float | None) -> str:
    return f"{x * 100:+.0f}%" if x is not None else "-"


def report_table(jobs: list[Job], results: list[RunResult]) -> Table:
    """The table: one row per layout; a failed job is one row with its failure and cause."""
    t = Table(title="predicted vs measured, ranked by measured tokens/s")
    for col in ("#", "search #", "layout", "step s pred", "step s meas", "err", "tok/s meas", "mem GiB pred",
                "max alloc GiB", "max resv GiB"):
        t.add_column(col, justify="left" if col == "layout" else "right")
    for new_rank, (job, r) in enumerate(ranked(jobs, results), 1):
        pred = job.predicted
        if not r.ok and r.step_time_s is None:
            t.add_row("-", str(job.rank), job.name, f"{pred['step_time_s']:.3f}",
                      f"[red]{r.failure}[/]: {r.cause}", "", "", "", "", "")
            continue
        gib = (lambda b: f"{b / GIB:.1f}" if b else "-")
        t.add_row(str(new_rank) if r.ok else "-", str(job.rank), job.name + ("" if r.ok else f" [red]({r.failure})[/]"),
                  f"{pred['step_time_s']:.3f}", f"{r.step_time_s:.3f}" if r.step_time_s else "-",
                  _pct(_error(pred["step_time_s"], r.step_time_s)),
                  f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "-", gib(pred["peak_memory_bytes"]),
                  gib(r.peak_allocated_bytes), gib(r.peak_reserved_bytes))
    return t


def report_png(jobs: list[Job], results: list[RunResult]) -> bytes:
    """The report as a PNG (:func:`autopar.report.verify_plot.verify_chart`), in the table's order."""
    from autopar.report.verify_plot import verify_chart

    return verify_chart([(job.name, job.predicted["step_time_s"], r.step_time_s, r.failure)
                         for job, r in ranked(jobs, results)])
