"""``--report``: JSON, two PNGs and a self-contained HTML page (its behaviour in a browser:
``tests/report/test_report_browser.py``)."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

from conftest import make_problem

from autopar.report.html import write_report
from autopar.report.plots import memory_chart, ranking_chart
from autopar.search import search
from autopar.search.constraints import parse_constraints

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


def test_page_says_what_a_new_user_asked(tmp_path):
    """A new user's report: the header said "autopar plan" for a search; "5 layouts ranked" hid how
    many fit; there was no command to reproduce it or to export a row; MFU's denominator and
    ZeRO-3 = FSDP were unsaid; the step-time parts were only in the PNG. Llama-3-8B on 16 H100,
    gbs 256, --no-cp: 43,328 enumerated, 33,888 removed by --no-cp, 1,120 + 288 by rule, 872 out of
    memory: 7,160 fit. MFU divides by the H100's dense bf16 peak, 989 TFLOP/s."""
    import html as html_lib
    import re

    from autopar.report.html import fitting_count

    p = make_problem("llama3-8b", nodes=2, gbs=256)
    result = search(p, top_k=5, constraints=parse_constraints({}, {"--no-cp": True}))
    assert (result.enumerated, sum(result.constraints.values()), result.out_of_memory) == (43_328, 33_888, 872)
    assert sum(result.rejected.values()) == 1_120 + 288 and fitting_count(result) == 7_160
    command = "autopar search --model llama3-8b --device h100-80gb --nodes 2 --gbs 256 --top 5 --no-cp --report rep"
    text = html_lib.unescape(write_report(p, result, tmp_path / "rep", command).read_text())
    assert "<h1>autopar search</h1>" in text and "autopar plan" not in text
    assert f"top 5 of {fitting_count(result):,}" in text and "fitting layouts ranked" in text
    assert f"Reproduce: <code>{command}</code>" in text
    for rank in range(1, 6):
        assert f"autopar export --format megatron --from result.json --rank {rank}" in text
    assert "989 TFLOP/s per h100-80gb" in text and "dense (no 2:4 sparsity) peak" in text
    assert "3 also the parameters, i.e. FSDP" in text
    parts = text[text.index("<table class=parts>"):]
    first = result.layouts[0]
    row = re.search(r"<tr><td>1</td>.*?</tr>", parts).group(0)
    assert f"<td>{first.time_breakdown_s['compute']:,.3f}</td>" in row and f"<td>{first.step_time_s:,.3f}</td>" in row


def test_search_report_shows_the_command_that_reproduces_it(tmp_path):
    """search --report writes the command line it was given (options from the command line, flags
    as flags) into the page."""
    from typer.testing import CliRunner

    from autopar.cli import app

    out = tmp_path / "rep"
    args = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64", "--top", "2",
            "--no-cp", "--report", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (f"Reproduce: <code>autopar search --model llama3-8b --device h100-80gb --nodes 1 --gbs 64 --top 2 "
            f"--report {out} --no-cp</code>") in (out / "report.html").read_text()
