"""``autopar search --report DIR``: ``result.json``, ``ranking.png``, ``memory.png`` and one
self-contained ``report.html`` (images embedded as base64, no external files or scripts).

Bounded work: ``ranking.png`` draws the first :data:`CHART_LAYOUTS` layouts (a bar each; with
``--top 1000`` the chart was a 50,000-pixel-tall, 5.6 MB image that took 40 s and 500 MB to
draw), while ``result.json`` and the HTML table hold all of them (``search --top`` is at most
1,000)."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.report.plots import GIB, memory_chart, ranking_chart
from autopar.report.table import layout_label, recompute_label, table_notes
from autopar.report.ties import search_document
from autopar.schemas import versioned
from autopar.search import SearchResult

CHART_LAYOUTS = 30  # bars in ranking.png: the first 30 layouts

_STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:14px;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #ddd;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}img{max-width:100%;height:auto}
.note{color:#666;font-size:13px}"""


def _table(result: SearchResult) -> str:
    head = ["#", "layout", "mbs", "zero", "recompute", "peak GiB", "step s", "tok/s/dev", "MFU", "bubble", "note"]
    rows = []
    for rank, e in enumerate(result.layouts, 1):
        s = e.strategy
        cells = [str(rank), layout_label(e), str(s.mbs), str(s.zero), recompute_label(e),
                 f"{e.peak_memory_bytes / GIB:.1f}", f"{e.step_time_s:.2f}", f"{e.tokens_per_s_per_device:,.0f}", f"{e.mfu:.1%}",
                 f"{e.time_breakdown_s['pp_bubble'] / e.step_time_s:.1%}", "marginal" if e.marginal else ""]
        rows.append("<tr>" + "".join(f'<td{" class=l" if i in (1, 4, 10) else ""}>{html.escape(c)}</td>'
                                     for i, c in enumerate(cells)) + "</tr>")
    header = "".join(f'<th{" class=l" if i in (1, 4, 10) else ""}>{h}</th>' for i, h in enumerate(head))
    legend = table_notes(result.layouts)
    note = "".join(f"<p class=note>{html.escape(line)}</p>" for line in legend.split("\n")) if legend else ""
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>{note}"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render(p: Problem, result: SearchResult, ranking_png: bytes, memory_png: bytes) -> str:
    """The HTML page: headline, ranking table, both charts."""
    best = result.layouts[0]
    title = (f"{p.model.name}: {p.model.num_params / 1e9:.1f} B params on {p.cluster.num_nodes} x "
             f"{p.cluster.devices_per_node} {p.cluster.device.name}, gbs {p.train.global_batch_size}, "
             f"seq {p.train.seq_len}, {p.train.precision}")
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(result.rejected.items(), key=lambda kv: -kv[1])) or "none"
    return (f"<!doctype html><html><head><meta charset=utf-8><title>autopar report</title>"
            f"<style>{_STYLE}</style></head><body><h1>autopar plan</h1><p>{html.escape(title)}</p>"
            f"<p>Best: <b>{html.escape(layout_label(best))}</b>, step {best.step_time_s:.2f} s, MFU {best.mfu:.1%}, "
            f"peak {best.peak_memory_bytes / GIB:.1f} of {best.device_memory_bytes / GIB:.1f} GiB.</p>"
            f"<h2>Ranking</h2>{_table(result)}<p class=note>{result.enumerated:,} layouts enumerated; rejected by "
            f"rule: {html.escape(rejected)}; out of memory: {result.out_of_memory:,}.</p>"
            f"<h2>Step time by part</h2>{_img(ranking_png, 'ranking')}"
            f"<h2>Memory per stage (best layout)</h2>{_img(memory_png, 'memory')}</body></html>\n")


def report_paths(directory: str | Path) -> list[Path]:
    """The files :func:`write_report` writes into ``directory``: ``result.json``, ``ranking.png``,
    ``memory.png``, ``report.html``."""
    return [Path(directory) / name for name in ("result.json", "ranking.png", "memory.png", "report.html")]


def write_report(p: Problem, result: SearchResult, directory: str | Path) -> Path:
    """Write the four report files into ``directory`` (created if needed); returns the HTML path.
    The ranking chart shows the first :data:`CHART_LAYOUTS` layouts, the rest go to the table
    and ``result.json``.

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
        page.write_text(render(p, result, ranking, memory))
    except OSError as err:
        raise AutoparError(f"--report={str(directory)!r}: cannot write ({err.strerror})") from None
    return page
