"""``autopar search --report DIR``: ``result.json``, ``ranking.png``, ``memory.png`` and one
self-contained ``report.html`` (images embedded as base64, style and script inline: it opens
with no network and no file beside it).

The page: the problem and the best layout in a few numbers, with autopar's error band on them
(:mod:`autopar.validate.bands`: its error on similar validation rows); the ranking as a table
that sorts by any column (click its header), layouts within the band of #1 ranked ``≈1``; under each of the first :data:`DETAIL_LAYOUTS` layouts, one
click away, its memory per pipeline stage against the device and its simulated pipeline step
(:mod:`autopar.report.timeline`) and the command that exports it; the notes the table needs
(marks, short forms, ZeRO stages, marginal layouts); what MFU is measured against; the step time by
part of the first :data:`CHART_LAYOUTS` (chart and numbers); what the search dropped; the command
line that reproduces the search.

Bounded work: ``ranking.png`` draws the first :data:`CHART_LAYOUTS` layouts (a bar each; with
``--top 1000`` the chart was a 50,000-pixel-tall, 5.6 MB image that took 40 s and 500 MB to
draw), the details the first :data:`DETAIL_LAYOUTS` (two charts each, ~0.5 s), while
``result.json`` and the HTML table hold all of them (``search --top`` is at most 1,000)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from autopar.errors import AutoparError
from autopar.estimate import Estimate
from autopar.pipeline.layout_timeline import layout_simulation
from autopar.problem import Problem
from autopar.report.layout_plot import stage_labels, timeline_title
from autopar.report.page_assets import SCRIPT, STYLE
from autopar.report.plots import GIB, TIME_PARTS, memory_chart, ranking_chart
from autopar.report.table import FEW_ROWS_MARK, layout_label, recompute_label, search_summary, table_notes
from autopar.report.ties import model_note, problem_certainty, rank_marks, search_document, sharding_note, ties_note
from autopar.report.timeline import timeline_png
from autopar.schemas import versioned
from autopar.search import SearchResult
from autopar.validate.bands import Certainty

CHART_LAYOUTS = 30  # bars in ranking.png: the first 30 layouts
DETAIL_LAYOUTS = 10  # layouts with their memory and timeline charts one click away

# (header, left-aligned) of the ranking table, in order.
COLUMNS = (("#", False), ("layout", True), ("mbs", False), ("zero", False), ("recompute", True),
           ("peak GiB", False), ("step s", False), ("tok/s/dev", False), ("MFU", False), ("bubble", False),
           ("note", True))


def _cell(text: str, value: float | None = None, left: bool = False) -> str:
    """One ``<td>``: ``value`` (a number) is what the column sorts by."""
    attrs = (" class=l" if left else "") + ("" if value is None else f' data-v="{float(value):.17g}"')
    return f"<td{attrs}>{html.escape(text)}</td>"


def _row(rank: int, e: Estimate, has_detail: bool, mark: str | None = None, few_rows: bool = False) -> str:
    """One layout's row; ``mark`` is what the # column shows (``≈1`` for a tie with #1,
    :func:`autopar.report.ties.rank_marks`; default the rank), the column sorts by the rank;
    ``few_rows``: a ZeRO 2/3 layout whose sharding few measured rows back (the note column says so)."""
    s = e.strategy
    bubble = e.time_breakdown_s["pp_bubble"] / e.step_time_s
    toggle = "<span class=toggle>&#9656;</span>" if has_detail else "<span class=toggle></span>"
    cells = [_cell(mark or str(rank), rank),
             f"<td class=l>{toggle}{html.escape(layout_label(e))}</td>",
             _cell(str(s.mbs), s.mbs), _cell(str(s.zero), s.zero), _cell(recompute_label(e), left=True),
             _cell(f"{e.peak_memory_bytes / GIB:.1f}", e.peak_memory_bytes / GIB),
             _cell(f"{e.step_time_s:.2f}", e.step_time_s),
             _cell(f"{e.tokens_per_s_per_device:,.0f}", e.tokens_per_s_per_device),
             _cell(f"{e.mfu:.1%}", e.mfu), _cell(f"{bubble:.1%}", bubble),
             "<td class=l>" + " ".join(["<span class=marginal>marginal</span>"] * e.marginal
                                       + [FEW_ROWS_MARK] * (few_rows and s.zero >= 2)) + "</td>"]
    classes = "row has-detail" if has_detail else "row"
    return f'<tr class="{classes}" data-detail="detail-{rank}">{"".join(cells)}</tr>'


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _timeline(p: Problem, rank: int, e: Estimate) -> str:
    """The layout's simulated pipeline step as an ``<img>``, or a line saying why there is none."""
    s = e.strategy
    if s.pp == 1:
        return "<p class=note>pp 1: no pipeline, every device runs the whole model.</p>"
    try:
        sim, p2p_s = layout_simulation(p, s)
    except AutoparError as err:  # a step too long to simulate op by op
        return f"<p class=note>pipeline timeline not drawn: {html.escape(str(err))}</p>"
    title = timeline_title(f"#{rank} {layout_label(e)}", e, sim)
    return _img(timeline_png(sim, stage_labels(p, e), title, p2p_s), f"pipeline timeline of #{rank}")


def export_command(target: str, rank: int) -> str:
    """The command that writes layout ``rank`` of the report's ``result.json`` in ``target``'s form."""
    return f"autopar export --format {target} --from result.json --rank {rank}"


def _detail(p: Problem, rank: int, e: Estimate, memory_png: bytes | None = None, target: str = "megatron") -> str:
    """The hidden row under layout ``rank``: the command that exports it, its memory per stage and
    its pipeline timeline."""
    memory = memory_png or memory_chart(e, f"#{rank} {layout_label(e)}: memory per device by stage")
    timeline = _timeline(p, rank, e)
    if e.strategy.pp > 1:
        timeline = (f"<figure><figcaption>Simulated pipeline step: forward, backward, recompute per stage; white is "
                    f"idle: the fill and drain (the table's bubble) and faster stages waiting for slower ones</figcaption>{timeline}</figure>")
    return (f'<tr class=detail id="detail-{rank}" hidden><td colspan={len(COLUMNS)}>'
            f"<p class=note>Its config: <code>{html.escape(export_command(target, rank))}</code> (in this report's "
            f"folder)</p><div class=detail-grid>{timeline}"
            f"<figure class=memory><figcaption>Memory per device by pipeline stage (weights, gradients, optimizer, "
            f"activations) against the device's {e.device_memory_bytes / GIB:.1f} GiB</figcaption>"
            f"{_img(memory, f'memory per stage of #{rank}')}</figure></div></td></tr>")


def _details(p: Problem, result: SearchResult, memory_png: bytes) -> dict[int, str]:
    """Rank -> detail row (:func:`_detail`) of the first :data:`DETAIL_LAYOUTS` layouts."""
    return {rank: _detail(p, rank, e, memory_png if rank == 1 else None, result.target)
            for rank, e in enumerate(result.layouts[:DETAIL_LAYOUTS], 1)}


def _table(result: SearchResult, details: dict[int, str] | None = None, certainty: Certainty | None = None,
           target: str = "megatron", sharded: str | None = None) -> str:
    """The ranking table, each layout's detail row (``details``: rank -> row) under it, and the
    notes the table needs (the export command of any row in ``target``'s form); with ``certainty`` (the problem's error bands) a layout within the
    step-time band of #1 is ranked ``≈1`` and a note names the band, as the search table does; ``sharded``: the
    caveat on ZeRO 2/3 layouts (:func:`autopar.report.ties.sharding_note`), marked on their rows and noted."""
    details = details or {}
    header = "".join(f'<th{" class=l" if left else ""}>{name}</th>' for name, left in COLUMNS)
    marks = (rank_marks([e.step_time_s for e in result.layouts], certainty.step_time.band_pct) if certainty
             else [str(i) for i in range(1, len(result.layouts) + 1)])
    rows = [_row(rank, e, rank in details, mark, sharded is not None) + details.get(rank, "")
            for rank, (mark, e) in enumerate(zip(marks, result.layouts), 1)]
    more = len(result.layouts) - len(details)
    hint = "Click a column header to sort"
    if details:
        hint += ("; click a layout to show its memory per stage and its pipeline timeline"
                 + (f" (the first {len(details)}; the other {more} are in the table and result.json)" if more else ""))
    legend = table_notes(result.layouts, getattr(result, "target", "megatron"))
    notes = legend.split("\n") if legend else []
    tie = certainty and ties_note(certainty, marks)
    if tie:
        notes.append(tie)
    if sharded is not None:
        notes.append(f"{FEW_ROWS_MARK}: {sharded}")
    if any(e.marginal for e in result.layouts):
        notes.append("marginal: fits, but above 90% of the device memory; real runs at that level often fail from "
                     "fragmentation, so these rank after the comfortable layouts.")
    keys = [f"Any row's config: {export_command(target, 1).replace('--rank 1', '--rank N')} (N: its rank; run in "
            "this report's folder).",
            "zero: 0 none; 1 optimizer states sharded over data parallelism (Megatron's distributed optimizer); "
            "2 also the gradients; 3 also the parameters, i.e. FSDP (Megatron-FSDP, torchtitan's FSDP2)."]
    return (f"<p class=hint>{html.escape(hint)}.</p>"
            + "".join(f"<p class=hint>{html.escape(line)}</p>" for line in keys) +
            f"<table id=ranking><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            + "".join(f"<p class=note>{html.escape(line)}</p>" for line in notes))


def _certainty(certainty: Certainty, sharded: str | None = None, same: str | None = None) -> str:
    """One paragraph: how far autopar's predictions for this problem can be off (its error on
    similar validation rows), or that no similar row was measured; ``sharded``: the caveat on the
    ranking's ZeRO 2/3 layouts (:func:`autopar.report.ties.sharding_note`), and ``same``: the
    measured runs of this model on this class of device (:func:`autopar.validate.bands.model_rows_note`),
    appended."""
    parts = []
    for name, band in (("step time", certainty.step_time), ("peak memory", certainty.memory)):
        if band.band_pct is not None:
            parts.append(f"{name} \u00b1{band.band_pct:g}% (MAPE on {len(band.rows)} {band.group})")
    text = ("Certainty: autopar's predictions for this problem are off by about " + "; ".join(parts)
            + " (the development set of autopar validate)." if parts else
            "Certainty: no similar measured row, so no error band is known for this problem.")
    if sharded is not None:
        text += f" But {sharded}."
    if same is not None:
        text += f" The {same}."
    return f"<p class=note>{html.escape(text)}</p>"


def fitting_count(result: SearchResult) -> int:
    """How many enumerated layouts fit: enumerated less those removed by a constraint, rejected by a
    rule or out of memory (the marginal ones fit; a ``--target`` writer's refusals count as fitting)."""
    return (result.enumerated - sum(result.constraints.values()) - sum(result.rejected.values())
            - result.out_of_memory)


def _mfu(p: Problem) -> str:
    """One paragraph: what MFU is measured against (:func:`autopar.cost.step.mfu_peak_flops_per_s`)."""
    from autopar.cost.step import mfu_peak_flops_per_s

    peak = mfu_peak_flops_per_s(p)
    return (f"<p class=note>MFU: the model's FLOPs per step (no recompute counted) over the step time, divided by "
            f"the devices' peak: {peak / 1e12:,.0f} TFLOP/s per {html.escape(p.cluster.device.name)}, its dense "
            f"(no 2:4 sparsity) peak at the training precision ({html.escape(p.train.precision)}).</p>")


def _parts_table(layouts: list[Estimate]) -> str:
    """The numbers behind the step-time chart: each layout's parts (s) and its step."""
    used = [(key, name) for key, name, _ in TIME_PARTS if any(e.time_breakdown_s.get(key, 0.0) for e in layouts)]
    header = "<th>#</th><th class=l>layout</th><th>mbs</th><th>zero</th>" + "".join(f"<th>{html.escape(n)} s</th>" for _, n in used) \
        + "<th>step s</th>"
    rows = "".join(
        f"<tr><td>{rank}</td><td class=l>{html.escape(layout_label(e))}</td><td>{e.strategy.mbs}</td>"
        f"<td>{e.strategy.zero}</td>"
        + "".join(f"<td>{e.time_breakdown_s.get(key, 0.0):,.3f}</td>" for key, _ in used)
        + f"<td>{e.step_time_s:,.3f}</td></tr>" for rank, e in enumerate(layouts, 1))
    return f"<table class=parts><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>"


def _cards(result: SearchResult, certainty: Certainty) -> str:
    best = result.layouts[0]
    step_band, memory_band = certainty.step_time.band_pct, certainty.memory.band_pct
    step = f"{best.step_time_s:,.2f} s" + (f" \u00b1{step_band:g}%" if step_band is not None else "")
    memory = (f"{best.peak_memory_bytes / GIB:.1f} of {best.device_memory_bytes / GIB:.1f} GiB"
              + (f" \u00b1{memory_band:g}%" if memory_band is not None else ""))
    cards = [(layout_label(best), "best layout"), (step, "step time"), (f"{best.mfu:.1%}", "MFU"),
             (f"{best.tokens_per_s_per_device:,.0f}", "tokens/s per device"), (memory, "peak memory"),
             (f"top {len(result.layouts):,} of {fitting_count(result):,}", "fitting layouts ranked")]
    return "<div class=cards>" + "".join(f"<div class=card><b>{html.escape(v)}</b><span>{k}</span></div>"
                                         for v, k in cards) + "</div>"


def render(p: Problem, result: SearchResult, ranking_png: bytes, memory_png: bytes, command: str | None = None) -> str:
    """The HTML page (see the module docstring); ``memory_png`` is #1's memory chart; ``command``
    the command line that reproduces the search (shown under the title when given)."""
    certainty, sharded = problem_certainty(p), sharding_note(p, result)
    same = model_note(p)
    title = (f"{p.model.name}: {p.model.num_params / 1e9:.1f} B params on {p.cluster.num_nodes} x "
             f"{p.cluster.devices_per_node} {p.cluster.device.name}, gbs {p.train.global_batch_size}, "
             f"seq {p.train.seq_len}, {p.train.precision}")
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>autopar: {html.escape(p.model.name)}</title>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{STYLE}</style></head><body>"
            f"<h1>autopar search</h1><p class=lead>{html.escape(title)}</p>"
            + (f"<p class=note>Reproduce: <code>{html.escape(command)}</code></p>" if command else "")
            + f"{_cards(result, certainty)}{_certainty(certainty, sharded, same)}{_mfu(p)}"
            f"<h2>Ranking</h2>{_table(result, _details(p, result, memory_png), certainty, result.target, sharded)}"
            f"<h2>Step time by part</h2>{_img(ranking_png, 'step time by part of the top layouts')}"
            f"{_parts_table(result.layouts[:CHART_LAYOUTS])}"
            f"<h2>What the search dropped</h2><p class=note>{html.escape(search_summary(result))}.</p>"
            f"<script>{SCRIPT}</script></body></html>\n")


def report_paths(directory: str | Path) -> list[Path]:
    """The files :func:`write_report` writes into ``directory``: ``result.json``, ``ranking.png``,
    ``memory.png``, ``report.html``."""
    return [Path(directory) / name for name in ("result.json", "ranking.png", "memory.png", "report.html")]


def write_report(p: Problem, result: SearchResult, directory: str | Path, command: str | None = None) -> Path:
    """Write the four report files into ``directory`` (created if needed); returns the HTML path.
    ``command``: the command line that reproduces the search, shown on the page.
    The ranking chart shows the first :data:`CHART_LAYOUTS` layouts, the details the first
    :data:`DETAIL_LAYOUTS`; the rest go to the table and ``result.json``.

    Raises:
        AutoparError: the directory cannot be created or written.
    """
    out = Path(directory)
    result_path, ranking_path, memory_path, page = report_paths(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        shown = result.layouts[:CHART_LAYOUTS]
        more = len(shown) < len(result.layouts)
        ranking = ranking_chart(shown, f"Top {len(shown)}{f' of {len(result.layouts)}' if more else ''} layouts: "
                                f"predicted step time by part{' (the table and result.json list all)' if more else ''}")
        memory = memory_chart(result.layouts[0], f"#1 {layout_label(result.layouts[0])}: memory per device by stage")
        result_path.write_text(json.dumps(versioned("search", search_document(p, result)), indent=2) + "\n")
        ranking_path.write_bytes(ranking)
        memory_path.write_bytes(memory)
        page.write_text(render(p, result, ranking, memory, command))
    except OSError as err:
        raise AutoparError(f"--report={str(directory)!r}: cannot write ({err.strerror})") from None
    return page
