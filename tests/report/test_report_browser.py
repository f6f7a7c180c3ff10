"""``search --report``'s page in a real browser: headless Chromium (Debian's ``chromium``) opens
it, a small check script injected at the top of the page records every error (script errors,
``console.error``, resources that fail to load), sorts the ranking by step time, opens the first
layout's details, and writes what it found into the DOM, which ``--dump-dom`` prints. Skips,
saying why, where Chromium is not installed (``.ci/run`` installs it best effort)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from conftest import make_problem

from autopar.report.html import DETAIL_LAYOUTS, write_report
from autopar.search import search
from autopar.search.constraints import parse_constraints

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")

CHECK = """<script>
window.__errors = [];
window.addEventListener('error', function (e) {
  __errors.push(e.message || ('failed to load ' + (e.target && (e.target.alt || e.target.src || e.target.tagName))));
}, true);
var __consoleError = console.error;
console.error = function () { __errors.push(Array.prototype.join.call(arguments, ' ')); __consoleError.apply(console, arguments); };
window.addEventListener('load', function () {
  var out = {};
  try {
    var images = Array.prototype.slice.call(document.images);
    out.images = images.length;
    out.broken = images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) { return i.alt; });
    var table = document.getElementById('ranking');
    var headers = Array.prototype.map.call(table.tHead.rows[0].cells, function (h) { return h.textContent; });
    var step = table.tHead.rows[0].cells[headers.indexOf('step s')];
    step.click(); step.click();  // descending: the slowest first
    var rows = table.tBodies[0].rows;
    out.order = Array.prototype.map.call(rows, function (r) { return r.classList.contains('detail') ? 'd' + r.id.split('-')[1] : r.cells[0].getAttribute('data-v'); });
    out.sorted = step.getAttribute('aria-sort');
    var first = document.querySelector('tr.row.has-detail');
    var detail = document.getElementById(first.getAttribute('data-detail'));
    out.hidden_before = detail.hidden;
    first.click();
    out.hidden_after = detail.hidden;
    out.detail_images = detail.querySelectorAll('img').length;
  } catch (err) { __errors.push(String(err)); }
  out.errors = __errors;
  var pre = document.createElement('pre');
  pre.id = 'autopar-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Llama-3-8B on 2 nodes, pipelined layouts only (pp 2 or 4), the top 12."""
    p = make_problem("llama3-8b", nodes=2, gbs=256)
    result = search(p, top_k=12, constraints=parse_constraints({"--pp": "2,4"}, {}))
    return result, write_report(p, result, tmp_path_factory.mktemp("rep") / "rep")


@pytest.fixture(scope="module")
def check(report, tmp_path_factory) -> dict:
    """What the check script found in Chromium (one browser run for the tests below)."""
    page = report[1]
    checked = tmp_path_factory.mktemp("browser") / "checked.html"
    checked.write_text(page.read_text().replace("<head>", "<head>" + CHECK, 1))
    run = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                          "--dump-dom", checked.as_uri()], capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="autopar-check">(.*?)</pre>', run.stdout, re.S)
    assert found, f"no check output; chromium exit {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def test_report_renders_without_errors_and_every_image_loads(report, check):
    result = report[0]
    assert check["errors"] == []
    # step-time chart + two charts (memory, timeline) for each of the first DETAIL_LAYOUTS layouts
    assert check["images"] == 1 + 2 * min(DETAIL_LAYOUTS, len(result.layouts))
    assert check["broken"] == []


def test_ranking_sorts_and_keeps_each_layouts_details_under_it(report, check):
    result = report[0]
    assert check["sorted"] == "descending"
    ranks = [int(x) for x in check["order"] if not x.startswith("d")]
    steps = [result.layouts[r - 1].step_time_s for r in ranks]
    assert steps == sorted(steps, reverse=True) and sorted(ranks) == list(range(1, len(result.layouts) + 1))
    for i, x in enumerate(check["order"]):
        if x.startswith("d"):
            assert check["order"][i - 1] == x[1:]  # a detail row right under its layout
    assert (check["hidden_before"], check["hidden_after"], check["detail_images"]) == (True, False, 2)
