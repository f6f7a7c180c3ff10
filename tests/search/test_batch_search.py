"""Batch-size search (``search --gbs-range``, issue 19 item 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.search.batch import parse_gbs_range

runner = CliRunner()
TOY = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--seq-len", "4096"]


@pytest.mark.parametrize("text, values", [
    ("256:4096", [256, 512, 1024, 2048, 4096]),
    ("256:1000", [256, 512]),
    ("256:1024:256", [256, 512, 768, 1024]),
    ("512,256,256", [256, 512]),
    ("8", [8]),
])
def test_gbs_range_forms(text, values):
    assert parse_gbs_range(text) == values


@pytest.mark.parametrize("text", ["4096:256", "0:8", "a:b", "1:2:0", "1:2:3:4", "1:100000:1", "8,,16", "2:2147483648"])
def test_bad_gbs_ranges(text):
    with pytest.raises(AutoparError, match="--gbs-range"):
        parse_gbs_range(text)


def test_sweep_best_per_gbs_matches_a_plain_search(tmp_path):
    """Each point's layout is the plain search's #1 at that gbs; the best gbs is the point with the
    most tokens/s per device; with 8 devices gbs 4 leaves fewer sequences than some dp x mbs need."""
    png = tmp_path / "sweep.png"
    out = runner.invoke(app, [*TOY, "--gbs-range", "4:16", "--json", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [pt["gbs"] for pt in doc["points"]] == [4, 8, 16]
    fitting = [pt for pt in doc["points"] if pt["best"]]
    best = max(fitting, key=lambda pt: pt["best"]["tokens_per_s_per_device"])
    assert doc["best_tokens_per_s_per_device_gbs"] == best["gbs"] and doc["largest_fitting_gbs"] == 16
    plain = json.loads(runner.invoke(app, [*TOY, "--gbs", "8", "--top", "1", "--json"]).stdout)["layouts"][0]
    assert doc["points"][1]["best"]["strategy"] == plain["strategy"]
    assert doc["points"][1]["best"]["step_time_s"] == pytest.approx(plain["step_time_s"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_constraints_apply_to_every_point_and_the_table():
    out = runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--tp", "2", "--no-pp"])
    assert out.exit_code == 0, out.output
    assert "Best layout per global batch size" in out.output and "tp2+sp+ov pp1" in out.output
    assert "largest that fits: gbs 16" in out.output


def test_a_gbs_with_no_layout_gets_its_reason():
    """--dp 8 --mbs 2 needs gbs to be a multiple of 16: gbs 8 has no layout, 16 has."""
    doc = json.loads(runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--dp", "8", "--mbs", "2", "--json"]).stdout)
    assert doc["points"][0]["best"] is None and doc["points"][0]["reason"]
    assert doc["points"][1]["best"]["strategy"]["dp"] == 8


def test_plot_needs_gbs_range():
    out = runner.invoke(app, [*TOY, "--plot", "x.png"])
    assert out.exit_code == 2 and "add --gbs-range" in out.output


def test_first_last_doubles_first_as_the_help_says():
    """``100:200`` ran 100 and 200 while the help said "powers of two": the help now says what
    runs (FIRST doubled up to LAST), with its own example checked here."""
    import typer

    from autopar.cli.search_options import GbsRange
    from autopar.search.batch import parse_gbs_range

    help_text = next(m for m in GbsRange.__metadata__ if isinstance(m, typer.models.OptionInfo)).help
    assert "powers of two" not in help_text and "100:400 is 100, 200, 400" in help_text
    assert parse_gbs_range("100:400") == [100, 200, 400] and parse_gbs_range("100:399") == [100, 200]
