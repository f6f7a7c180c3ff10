"""Accuracy report: per-row table, MAPE/max error by metric, source and device, sweeps, and the
signed-error plot (:mod:`autopar.validate.error_plot`).

MAPE is the mean of ``|error %|`` over scored rows (Hyndman & Koehler 2006, "Another look at
measures of forecast accuracy"). A sweep is a set of runs of one model on one cluster that vary
the layout; Spearman's rank correlation (Spearman 1904) of predicted vs measured throughput
says whether autopar orders the layouts correctly, and we check that the measured-best layout
is also predicted best.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autopar.validate.error_plot import errors_png
from autopar.validate.score import THROUGHPUT, Result

TIME_METRICS = ("step_time", "layer_fwd_bwd_time")  # smaller is better; the rest: larger is better

# Sweeps: (name, id prefix, model name prefix, metric). Throughput of a time row is 1 / time.
SWEEPS = (
    ("BLOOM layout sweep (02-25, 181B, 384 A100)", "BLOOMPQ-0225", "BLOOM", "step_time"),
    ("SC'21 Table 2, GPT-3 175B (ZeRO-3 vs PTD-P)", "NAR21-T2", "GPT-3 174.6B", "tflops_per_gpu_incl_recompute"),
    ("SC'21 Table 2, 530B (ZeRO-3 vs PTD-P)", "NAR21-T2", "GPT-529.6B", "tflops_per_gpu_incl_recompute"),
    ("Korthikanti Table 4 (selective vs full recompute, one layer)", "KOR22-T4", "GPT-22B", "layer_fwd_bwd_time"),
)


def rank(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their mean rank (needed for Spearman with ties)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    for v in np.unique(values):
        tie = values == v
        ranks[tie] = ranks[tie].mean()
    return ranks


def spearman(x, y) -> float:
    """Spearman's rho: the Pearson correlation of the ranks; NaN when either side is constant."""
    rx, ry = rank(x), rank(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def mape(errors: list[float]) -> float:
    return float(np.mean(np.abs(errors))) if errors else float("nan")


@dataclass
class Group:
    """Error statistics of one group of scored rows."""

    name: str
    metric: str
    count: int
    mape: float
    max_abs: float


def groups(results: list[Result], key) -> list[Group]:
    """MAPE and max |error| per (key(result), metric) over rows with an error %."""
    buckets: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in results:
        if r.error_pct is not None:
            buckets[(key(r), r.metric)].append(r.error_pct)
    return [Group(k, m, len(e), mape(e), float(np.max(np.abs(e)))) for (k, m), e in sorted(buckets.items())]


def in_target(r: Result) -> bool:
    """The target set of issue 3: scored 16-bit (bf16/fp16) rows of dense models."""
    return r.case is not None and r.case.precision != "fp8" and not r.case.problem.model.is_moe


def in_moe_target(r: Result) -> bool:
    """The MoE target set of issue 4: scored rows of MoE models, any precision."""
    return r.case is not None and r.case.problem.model.is_moe


def in_fp8_target(r: Result) -> bool:
    """The fp8 target set of issue 4: scored fp8 rows of dense models (fp8 MoE rows are in the MoE set)."""
    return r.case is not None and r.case.precision == "fp8" and not r.case.problem.model.is_moe


@dataclass(frozen=True)
class Target:
    """An accuracy target of one set and kind: MAPE at most ``mape_pct`` and, where given, no
    row's ``|error|`` above ``max_pct`` (percent)."""

    mape_pct: float
    max_pct: float | None = None

    def text(self) -> str:
        return f"<= {self.mape_pct:g}" + ("" if self.max_pct is None else f", max {self.max_pct:g}")

    def met(self, errors: list[float]) -> bool:
        return mape(errors) <= self.mape_pct and (self.max_pct is None or max(map(abs, errors)) <= self.max_pct)


# (name, membership, throughput target, memory target): each set is reported on its own line, so
# MoE and fp8 rows never hide in the dense average. Throughput targets are the project's current
# ones (issue 15: dense bf16/fp16 MAPE <= 4.5 % and fp8 dense <= 5.5 %, no row beyond 20 %;
# issue 17: MoE <= 15 %, no row beyond 30 %); memory is held to issue 3's MAPE <= 10 %.
TARGET_SETS = (("bf16/fp16 dense", in_target, Target(4.5, 20.0), Target(10.0)),
               ("MoE (any precision)", in_moe_target, Target(15.0, 30.0), Target(10.0)),
               ("fp8 dense", in_fp8_target, Target(5.5, 20.0), Target(10.0)))


def target_lines(results: list[Result]) -> list[str]:
    """Markdown table: throughput and memory MAPE / max |error| of each of :data:`TARGET_SETS`,
    its target and whether it is met; a set without scored rows of a kind shows ``-``."""
    out = ["| target set | rows | MAPE % | max abs error % | target | met |",
           "| --- | ---: | ---: | ---: | --- | --- |"]
    for name, member, throughput, memory in TARGET_SETS:
        rows = [r for r in results if member(r) and r.error_pct is not None]
        for kind, metrics, target in (("step time / throughput", THROUGHPUT, throughput),
                                      ("peak memory", ("peak_mem_per_gpu",), memory)):
            errors = [r.error_pct for r in rows if r.metric in metrics]
            if errors:
                # two decimals: a set at 4.54 % misses a 4.5 % target, which one decimal would hide
                stats = f"{mape(errors):.2f} | {max(map(abs, errors)):.2f}"
                met = "yes" if target.met(errors) else "no"
            else:
                stats, met = "- | -", "-"
            out.append(f"| {name}: {kind} | {len(errors)} | {stats} | {target.text()} | {met} |")
    return out


def validation_doc(results: list[Result]) -> dict:
    """The ``autopar validate --json`` content: row counts, each :data:`TARGET_SETS` line (as
    :func:`target_lines`, with its target and whether it is met), and every row (predicted and error None where not scored, with the
    reason)."""
    sets = []
    for name, member, throughput, memory in TARGET_SETS:
        rows = [r for r in results if member(r) and r.error_pct is not None]
        for kind, metrics, target in (("step_time", THROUGHPUT, throughput), ("memory", ("peak_mem_per_gpu",), memory)):
            errors = [r.error_pct for r in rows if r.metric in metrics]
            sets.append({"set": name, "kind": kind, "rows": len(errors), "mape_pct": mape(errors) if errors else None,
                         "max_abs_error_pct": max(map(abs, errors)) if errors else None,
                         "target_mape_pct": target.mape_pct, "target_max_abs_error_pct": target.max_pct,
                         "met": target.met(errors) if errors else None})
    return {"rows": len(results), "scored": sum(r.predicted is not None for r in results), "target_sets": sets,
            "results": [{"id": r.row.id, "metric": r.metric, "predicted": r.predicted, "measured": r.measured,
                         "error_pct": r.error_pct, "assumed": list(r.case.assumed) if r.case else [],
                         "reason": r.reason or None} for r in results]}


@dataclass
class Sweep:
    name: str
    ids: list[str]
    rho: float
    best_measured: str
    best_predicted: str


def sweeps(results: list[Result]) -> list[Sweep]:
    out = []
    for name, prefix, model, metric in SWEEPS:
        rows = [r for r in results if r.row.id.startswith(prefix) and r.row["model"].startswith(model)
                and r.metric == metric and r.predicted is not None]
        if len(rows) < 2:
            continue
        sign = -1.0 if metric in TIME_METRICS else 1.0  # throughput: larger is better
        measured = np.array([sign * r.measured for r in rows])
        predicted = np.array([sign * r.predicted for r in rows])
        out.append(Sweep(name, [r.row.id for r in rows], spearman(predicted, measured),
                         rows[int(np.argmax(measured))].row.id, rows[int(np.argmax(predicted))].row.id))
    return out


def oom_check(results: list[Result]) -> list[str]:
    """Lines on memory feasibility: OOM rows predicted not to fit, and runs that ran predicted to fit."""
    lines = []
    for r in results:
        if r.predicted is None or r.case is None:
            continue
        if r.metric == "oom_observed":
            ok = r.predicted == 1.0
            lines.append(f"| {_cell(r.row.id)} | went OOM | {'does not fit' if ok else 'fits'} | {'ok' if ok else 'WRONG'} |")
        elif r.metric == "peak_mem_per_gpu":
            fits = r.predicted * 2**30 <= r.case.problem.cluster.device.memory_bytes
            lines.append(f"| {_cell(r.row.id)} | ran | {'fits' if fits else 'does not fit'} | {'ok' if fits else 'WRONG'} |")
    return lines


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}"


def _group_table(title: str, rows: list[Group]) -> list[str]:
    out = [f"### {title}", "", "| group | metric | rows | MAPE % | max abs error % |", "| --- | --- | ---: | ---: | ---: |"]
    out += [f"| {g.name} | {g.metric} | {g.count} | {g.mape:.1f} | {g.max_abs:.1f} |" for g in rows]
    return out + [""]


def summary_markdown(results: list[Result]) -> str:
    """The accuracy summary pasted into the README (target set, per metric, sweeps, OOM)."""
    scored = sum(r.predicted is not None for r in results)
    out = [f"Rows: {len(results)}, scored {scored}, not scored {len(results) - scored} (reasons in `rows.md`).", ""]
    out += target_lines(results) + [""]
    out += _group_table("Per metric (all scored rows)", groups(results, lambda r: "all"))
    out += _group_table("Per source", groups(results, lambda r: r.case.family.name))
    out += _group_table("Per device", groups(results, lambda r: r.case.problem.cluster.device.name))
    out += ["### Sweeps (rank correlation of throughput)", "",
            "| sweep | layouts | Spearman rho | measured best | predicted best |", "| --- | ---: | ---: | --- | --- |"]
    for s in sweeps(results):
        out.append(f"| {s.name} | {len(s.ids)} | {s.rho:.2f} | {_cell(s.best_measured)} | {_cell(s.best_predicted)} |")
    out += ["", "### Memory feasibility", "", "| row | observed | predicted | |", "| --- | --- | --- | --- |"]
    out += oom_check(results)
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell: ``|`` escaped, line breaks written as ``\\n``."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "\\r").replace("\n", "\\n")


def rows_markdown(results: list[Result]) -> str:
    """Every row: predicted, measured, error %, assumptions; unscored rows with their reason.
    Cells come from the user's CSV, so each is escaped (:func:`_cell`)."""
    out = ["| id | metric | predicted | measured | error % | assumed |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in results:
        if r.predicted is not None:
            err = "-" if r.error_pct is None else f"{r.error_pct:+.1f}"
            assumed = _cell("; ".join(r.case.assumed))
            out.append(f"| {_cell(r.row.id)} | {_cell(r.metric)} | {_fmt(r.predicted)} | {_fmt(r.measured)} | {err} "
                       f"| {assumed} |")
    out += ["", "### Not scored", "", "| id | reason |", "| --- | --- |"]
    out += [f"| {_cell(r.row.id)} | {_cell(r.reason)} |" for r in results if r.predicted is None]
    return "\n".join(out) + "\n"


def write_report(results: list[Result], out_dir: Path) -> dict[str, Path]:
    """Write ``accuracy.md`` (summary), ``rows.md`` (per row) and ``errors.png`` (the signed
    error of every row by source and device, :func:`autopar.validate.error_plot.errors_png`)
    into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"accuracy": out_dir / "accuracy.md", "rows": out_dir / "rows.md", "errors": out_dir / "errors.png"}
    paths["accuracy"].write_text(summary_markdown(results))
    paths["rows"].write_text(rows_markdown(results))
    errors_png(results, paths["errors"])
    return paths
