"""``--report``: JSON, two PNGs and a self-contained HTML page (its behaviour in a browser:
``tests/report/test_report_browser.py``)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

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
    # the step-time chart, and the memory of each of the 5 layouts (DETAIL_LAYOUTS >= 5) and the
    # timeline of those with a pipeline
    pipelined = sum(e.strategy.pp > 1 for e in result.layouts)
    assert text.count("data:image/png;base64,") == 1 + 5 + pipelined
    assert text.count("pp 1: no pipeline") == 5 - pipelined
    assert "<script src" not in text and 'src="http' not in text and "<link" not in text  # nothing fetched
    assert text.count('<tr class="row') == 5 and text.count("<tr class=detail") == 5
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
    assert page.read_text().count('<tr class="row') == 5


def test_details_for_the_first_detail_layouts_only(tmp_path, monkeypatch):
    """Each detail draws two charts: beyond DETAIL_LAYOUTS the rows have none, and the page says so."""
    import autopar.report.html as report

    monkeypatch.setattr(report, "DETAIL_LAYOUTS", 2)
    p = make_problem("llama3-8b", nodes=2, gbs=256)
    text = report.write_report(p, search(p, top_k=5), tmp_path / "rep").read_text()
    assert text.count('<tr class="row has-detail"') == 2 and text.count("<tr class=detail") == 2
    assert "(the first 2; the other 3 are in the table and result.json)" in text


def test_a_layout_without_pipeline_says_so_instead_of_a_timeline(tmp_path):
    from autopar.report.html import _detail

    p = make_problem("llama3-8b", nodes=1, gbs=64)
    e = next(e for e in search(p, top_k=20).layouts if e.strategy.pp == 1)
    text = _detail(p, 1, e)
    assert "pp 1: no pipeline" in text and text.count("data:image/png;base64,") == 1


def test_sort_values_are_the_numbers_behind_the_cells(tmp_path):
    """The script sorts by data-v: the raw number (a step of 10.5 s sorts after 9.9 s, not
    before as the text would)."""
    from autopar.report.html import _row

    p = make_problem("llama3-8b", nodes=2, gbs=256)
    e = search(p, top_k=1).layouts[0]
    row = _row(7, e, False)
    assert '<td data-v="7">7</td>' in row
    assert f'data-v="{e.step_time_s:.17g}">{e.step_time_s:.2f}</td>' in row
    assert 'class="row"' in row and "has-detail" not in row


def test_ties_with_the_first_are_marked_and_the_band_named():
    """Step times 100, 103, 105, 105.1 s with a 5% band: ranks 1, ≈1, ≈1, 4 (as the search table
    marks them) and the note names the band; the # column still sorts by the rank (data-v)."""
    from autopar.report.html import _certainty, _table
    from autopar.validate.bands import Band, Certainty

    p = make_problem("llama3-8b", nodes=2, gbs=256)
    layouts = search(p, top_k=4).layouts
    result = SimpleNamespace(layouts=[replace(e, step_time_s=t) for e, t in zip(layouts, (100.0, 103.0, 105.0, 105.1))])
    bands = Certainty(Band("step_time", 5.0, "dense bf16/fp16 H100-class rows", ("a", "b")),
                      Band("memory", None, "no similar rows", ()))
    page = _table(result, None, bands)
    for cell in ('<td data-v="1">1</td>', '<td data-v="2">≈1</td>', '<td data-v="3">≈1</td>', '<td data-v="4">4</td>'):
        assert cell in page
    assert "≈1: step time within ±5% of #1" in page
    assert "step time ±5% (MAPE on 2 dense bf16/fp16 H100-class rows)" in _certainty(bands)
    assert "no similar measured row" in _certainty(Certainty(Band("step_time", None, "", ()), bands.memory))
