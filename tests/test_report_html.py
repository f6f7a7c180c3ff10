"""``--report``: JSON, two PNGs and a self-contained HTML page."""

from __future__ import annotations

import json

from autopar.report.html import write_report
from autopar.report.plots import memory_chart, ranking_chart
from autopar.search import search
from conftest import make_problem

PNG = b"\x89PNG\r\n\x1a\n"


def test_report_files(tmp_path):
    p = make_problem("llama3-8b", nodes=2, gbs=256)
    result = search(p, top_k=5)
    page = write_report(p, result, tmp_path / "rep")
    names = sorted(x.name for x in (tmp_path / "rep").iterdir())
    assert names == ["memory.png", "ranking.png", "report.html", "result.json"]
    assert len(json.loads((tmp_path / "rep" / "result.json").read_text())["layouts"]) == 5
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 2 and "<script" not in text and 'src="http' not in text
    assert text.count("<tr>") == 6  # header + 5 layouts
    assert (tmp_path / "rep" / "ranking.png").read_bytes().startswith(PNG)


def test_charts_are_pngs():
    p = make_problem("llama3-8b", nodes=1, gbs=64)
    layouts = search(p, top_k=3).layouts
    assert ranking_chart(layouts, "t").startswith(PNG) and memory_chart(layouts[0], "m").startswith(PNG)


def test_ranking_chart_draws_the_first_chart_layouts(tmp_path, monkeypatch):
    """--top 1000 drew a bar per layout (a 50,000-pixel-tall PNG, 40 s): the chart takes the first
    CHART_LAYOUTS, the table and result.json all of them."""
    import autopar.report.html as report

    drawn = []
    monkeypatch.setattr(report, "CHART_LAYOUTS", 2)
    monkeypatch.setattr(report, "ranking_chart", lambda layouts, title: drawn.append((len(layouts), title)) or PNG)
    p = make_problem("llama3-8b", nodes=2, gbs=256)
    page = report.write_report(p, search(p, top_k=5), tmp_path / "rep")
    assert drawn == [(2, "Top 2 of 5 layouts: predicted step time by part (the table and result.json list all)")]
    assert page.read_text().count("<tr>") == 6
