"""The batch-size search's output: a rich table, the JSON document and a matplotlib PNG
(tokens/s per device and peak memory of each gbs's best layout)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.report.plots import GIB, _png, plt
from autopar.report.table import layout_label, mfu_note, recompute_label
from autopar.schemas import versioned
from autopar.search.batch import BatchPoint, BatchSearch, batch_search, parse_gbs_range
from autopar.search.constraints import Constraint
from autopar.space import SpaceOptions


def batch_table(sweep: BatchSearch, band_pct: float | None = None) -> Table:
    """One row per gbs: its best layout, memory, step time, tokens/s per device and MFU; the gbs
    with the most tokens/s per device is marked ``best``, the smallest within ``band_pct`` % of it
    ``saturates`` (:meth:`BatchSearch.saturating`), the largest that fits ``largest`` (only where
    memory limits the batch: not the range's top)."""
    table = Table(title="Best layout per global batch size (GiB = peak per device)", header_style="bold")
    for name, justify in [("gbs", "right"), ("layout", "left"), ("mbs", "right"), ("zero", "right"),
                          ("recompute", "left"), ("GiB", "right"), ("step s", "right"), ("tok/s/dev", "right"),
                          ("MFU", "right"), ("note", "left")]:
        table.add_column(name, justify=justify, no_wrap=name != "note")
    best, largest, saturating = sweep.best_throughput, sweep.largest_fitting, sweep.saturating(band_pct)
    for pt in sweep.points:
        e = pt.best
        if e is None:
            table.add_row(f"{pt.gbs:,}", "[red]none[/]", *[""] * 7, pt.reason or "")
            continue
        notes = [n for n, p in (("best tok/s/dev", best), ("saturates", saturating if saturating is not best else None),
                                ("largest that fits", largest if sweep.memory_limits_gbs else None)) if p is pt]
        notes += ["marginal"] if e.marginal else []
        table.add_row(f"{pt.gbs:,}", layout_label(e), str(e.strategy.mbs), str(e.strategy.zero), recompute_label(e),
                      f"{e.peak_memory_bytes / GIB:.1f}", f"{e.step_time_s:.2f}", f"{e.tokens_per_s_per_device:,.0f}",
                      f"{e.mfu:.1%}", ", ".join(notes))
    return table


def chart_marks(sweep: BatchSearch, band_pct: float | None) -> list[tuple[BatchPoint, str]]:
    """The points :func:`batch_chart` marks, with their legend text, as :func:`sweep_summary`
    names them: the gbs with the most tokens/s per device, then, where it is another, the gbs
    where throughput saturates (:meth:`BatchSearch.saturating`)."""
    best, saturating = sweep.best_throughput, sweep.saturating(band_pct)
    marks = [(best, f"most tokens/s: gbs {best.gbs:,} ({layout_label(best.best)})")]
    if saturating is not None and saturating is not best:
        marks.append((saturating, f"saturates: gbs {saturating.gbs:,} (within ±{band_pct:g}% of the most, "
                                  "autopar's step-time band)"))
    return marks


def batch_chart(sweep: BatchSearch, title: str, band_pct: float | None = None) -> bytes:
    """PNG: tokens/s per device (top) and peak memory against the device's (bottom) of each gbs's
    best layout, gbs on a log-2 axis; the best-throughput gbs is circled and, as the text under the
    table says (:func:`sweep_summary`), the gbs where throughput saturates (the smallest within
    ``band_pct`` % of the best, :meth:`BatchSearch.saturating`) is marked with a diamond."""
    fitting = sweep.fitting
    if not fitting:
        raise AutoparError("--plot: no batch size of --gbs-range has a layout that fits; nothing to draw")
    gbs = [pt.gbs for pt in fitting]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(2, 1))
    top.plot(gbs, [pt.best.tokens_per_s_per_device for pt in fitting], "o-", color="#4c72b0")
    for (pt, label), (marker, colour) in zip(chart_marks(sweep, band_pct), (("o", "#c44e52"), ("D", "#55a868"))):
        top.plot([pt.gbs], [pt.best.tokens_per_s_per_device], marker, ms=13, mfc="none", mec=colour, mew=2,
                 label=label)
    previous = None
    for pt in fitting:  # the layout is named where it changes
        label = layout_label(pt.best)
        if label != previous:
            top.annotate(label, (pt.gbs, pt.best.tokens_per_s_per_device), fontsize=7, xytext=(4, 6),
                         textcoords="offset points")
        previous = label
    top.set_ylim(0, max(pt.best.tokens_per_s_per_device for pt in fitting) * 1.15)  # from zero: a 0.1% change looks
    top.set_ylabel("tokens/s per device")                                               # like one, not like a trend
    top.set_title(title, fontsize=10, pad=10)
    top.legend(fontsize=8, loc="lower right")
    bottom.plot(gbs, [pt.best.peak_memory_bytes / GIB for pt in fitting], "s-", color="#dd8452", label="peak")
    capacity = fitting[0].best.device_memory_bytes / GIB
    bottom.axhline(capacity, color="#8c8c8c", ls="--", label=f"device memory {capacity:.1f} GiB")
    bottom.set_ylim(0, max(fitting[0].best.device_memory_bytes, *(pt.best.peak_memory_bytes for pt in fitting)) / GIB * 1.1)
    bottom.set_ylabel("peak GiB per device")
    bottom.set_xlabel("global batch size (sequences)")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(gbs, [f"{g:,}" for g in gbs], fontsize=8, rotation=45 if len(gbs) > 8 else 0)
    bottom.legend(fontsize=8, loc="center right")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return _png(fig)


def sweep_summary(sweep: BatchSearch, band_pct: float | None) -> list[str]:
    """The lines under the sweep's table: the gbs with the most tokens/s per device; the smallest
    gbs within ``band_pct`` % of it (:meth:`BatchSearch.saturating`: where throughput saturates);
    the largest gbs that fits, and whether memory limits the batch at all in the range (when the
    range's top fits it does not; with the same peak at every gbs, memory does not depend on gbs)."""
    best, largest, saturating = sweep.best_throughput, sweep.largest_fitting, sweep.saturating(band_pct)
    if best is None:
        return ["no batch size of --gbs-range has a layout that fits"]
    top = best.best.tokens_per_s_per_device
    lines = [f"most tokens/s per device: gbs {best.gbs:,} ({top:,.0f})"]
    if saturating is not None and saturating is not best:
        gap = 1 - saturating.best.tokens_per_s_per_device / top
        lines[0] += (f"; saturates at gbs {saturating.gbs:,} ({saturating.best.tokens_per_s_per_device:,.0f}, within "
                     f"{gap:.1%} of the best, inside autopar's ±{band_pct:g}% step-time band: a larger batch gains "
                     "less than it can resolve)")
    if sweep.memory_limits_gbs:
        lines.append(f"largest that fits: gbs {largest.gbs:,} (memory limits the batch above it)")
    else:
        peaks = [pt.best.peak_memory_bytes for pt in sweep.fitting]
        same = max(peaks) - min(peaks) <= 0.005 * max(peaks)  # the same layout's peak to 0.5 %: gbs-independent
        lines.append(f"memory does not limit gbs in this range: its largest, {largest.gbs:,}, fits"
                     + (f" with the same peak ({max(peaks) / GIB:.1f} GiB) as every gbs (a larger gbs adds "
                        "micro-batches, not memory)" if same else ""))
    return lines


def run_batch_search(console: Console, p: Problem, gbs_range: str, plot: str | None, memory_margin: float,
                     options: SpaceOptions | None, target: str, constraints: list[Constraint], as_json: bool) -> None:
    """``search --gbs-range``: sweep, then print the table (or the JSON) and write ``plot``.

    Raises:
        AutoparError: a bad ``--gbs-range`` (:func:`parse_gbs_range`), no batch size of the range
            with a layout (the first one's reason, as a plain search gives it), or an unwritable ``--plot``.
    """
    from autopar.report.ties import problem_certainty

    sweep = batch_search(p, parse_gbs_range(gbs_range), memory_margin, options, target, constraints)
    if all(point.best is None for point in sweep.points):  # as a plain search: one error line, exit 2
        first = sweep.points[0]
        raise AutoparError(f"--gbs-range {gbs_range}: no batch size in it has a layout; at gbs {first.gbs:,}: "
                           f"{first.reason}")
    band_pct = problem_certainty(p).step_time.band_pct
    if plot:
        png = batch_chart(sweep, f"{p.model.name} on {p.world_size} x {p.cluster.device.name}, seq {p.train.seq_len}",
                          band_pct)
        try:
            Path(plot).write_bytes(png)
        except OSError as err:
            raise AutoparError(f"--plot={plot!r}: cannot write ({err.strerror})") from None
    if as_json:
        from autopar.cost.step import mfu_peak_flops_per_s

        doc = {**sweep.to_dict(band_pct), "mfu_peak_flops_per_s": mfu_peak_flops_per_s(p)}
        sys.stdout.write(json.dumps(versioned("search-sweep", doc), indent=2) + "\n")
        return
    console.print(batch_table(sweep, band_pct))
    if (note := mfu_note(p)) is not None:
        console.print(note, highlight=False, soft_wrap=True)
    for line in sweep_summary(sweep, band_pct):
        console.print(line, highlight=False, soft_wrap=True)
    if sweep.sharding_note is not None:
        console.print(sweep.sharding_note, highlight=False, soft_wrap=True)
    if plot:
        console.print(f"wrote {plot}", highlight=False)
