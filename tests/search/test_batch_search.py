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
    assert "Best layout per global batch size" in out.output and "tp2+sp pp1" in out.output
    assert "memory does not limit gbs in this range: its largest, 16, fits" in " ".join(out.output.split())


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


def _point(gbs, tokens_per_s, peak_bytes=1.0):
    from types import SimpleNamespace

    from autopar.search.batch import BatchPoint

    return BatchPoint(gbs, SimpleNamespace(tokens_per_s_per_device=tokens_per_s, peak_memory_bytes=peak_bytes,
                                           strategy=SimpleNamespace(zero=1), to_dict=lambda gbs: {}))


def test_saturation_is_the_smallest_gbs_within_the_band_of_the_best():
    """Tokens/s per device 900, 1,150, 1,170, 1,177 at gbs 16..128: the best is gbs 128; with a
    4.3 % band the floor is 1,177 x 0.957 = 1,126.4, so 1,150 (gbs 32) is the first within it; with
    a 1 % band (floor 1,165.2) gbs 64; without a band none."""
    from autopar.search.batch import BatchSearch

    sweep = BatchSearch([_point(16, 900), _point(32, 1150), _point(64, 1170), _point(128, 1177)], "megatron")
    assert sweep.best_throughput.gbs == 128
    assert sweep.saturating(4.3).gbs == 32 and sweep.saturating(1.0).gbs == 64 and sweep.saturating(None) is None
    assert sweep.memory_limits_gbs is False  # the range's top fits
    doc = sweep.to_dict(4.3)
    assert doc["saturating_gbs"] == 32 and doc["saturating_band_pct"] == 4.3 and doc["memory_limits_gbs"] is False


def test_a_flat_llama3_70b_sweep_saturates_early_and_says_memory_does_not_limit_gbs():
    """Llama-3-70B on 64 H100 at 8K: the best layout (tp1 cp4 dp16 ZeRO-3, mbs 1: tp 8 pays the SMs
    of TE's userbuffers kernels, autopar.cost.userbuffers_sm) is the same at every gbs, its peak
    (66.6 GiB) does not depend on gbs, and tokens/s per device only creeps up (1,117 at gbs 16 to
    1,127): "most tokens/s: gbs 65,536" used to be the only statement, with "largest
    that fits: gbs 65,536", the range's top. Now the sweep names the smallest gbs within the
    ±4.3 % band of the best and says memory does not limit gbs."""
    args = ["search", "--model", "llama3-70b", "--device", "h100-80gb", "--nodes", "8", "--seq-len", "8192",
            "--gbs-range", "16:1024"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    rates = {pt["gbs"]: pt["best"]["tokens_per_s_per_device"] for pt in doc["points"]}
    best = max(rates.values())
    assert doc["saturating_band_pct"] == pytest.approx(4.3, abs=0.05)
    floor = best * (1 - doc["saturating_band_pct"] / 100)
    assert doc["saturating_gbs"] == min(g for g, r in rates.items() if r >= floor) == 16
    assert doc["memory_limits_gbs"] is False and doc["largest_fitting_gbs"] == 1024
    text = " ".join(runner.invoke(app, args).stdout.split())
    assert "saturates at gbs 16 (" in text and "within 0.9% of the best" in text
    assert "memory does not limit gbs in this range: its largest, 1,024, fits with the same peak (66.6 GiB)" in text
    assert "largest that fits" not in text


def test_a_range_beyond_memory_names_the_largest_that_fits():
    """Where the range's top has no fitting layout, the sweep says memory limits the batch above
    the largest gbs that fits."""
    from autopar.report.batch import sweep_summary
    from autopar.search.batch import BatchPoint, BatchSearch

    sweep = BatchSearch([_point(16, 900), _point(32, 1000), BatchPoint(64, None, "out of memory")], "megatron")
    assert sweep.memory_limits_gbs is True

    assert sweep_summary(sweep, 4.3)[-1] == "largest that fits: gbs 32 (memory limits the batch above it)"


def test_the_chart_marks_where_the_text_says_throughput_saturates(monkeypatch):
    """The --plot chart circled only the most tokens/s (the range's largest gbs on a flat sweep)
    while the text says throughput saturates at the smallest gbs within the band: it marks both,
    as the text names them (gbs 128 most; gbs 32 first within 4.3 % of 1,177, floor 1,126.4)."""
    import autopar.report.batch as report_batch
    from autopar.search.batch import BatchSearch

    monkeypatch.setattr(report_batch, "layout_label", lambda e: "tp8")
    sweep = BatchSearch([_point(16, 900), _point(32, 1150), _point(64, 1170), _point(128, 1177)], "megatron")
    marks = report_batch.chart_marks(sweep, 4.3)
    assert [(pt.gbs, text) for pt, text in marks] == [
        (128, "most tokens/s: gbs 128 (tp8)"),
        (32, "saturates: gbs 32 (within ±4.3% of the most, autopar's step-time band)")]
    assert [pt.gbs for pt, _ in report_batch.chart_marks(sweep, None)] == [128]  # no band: no saturation point


def test_a_range_where_the_constraints_leave_nothing_is_one_error_line():
    """It had exited 0 with 'no batch size of --gbs-range has a layout that fits' although memory was not
    the cause; a plain search exits 2 with the constraints' counts."""
    out = runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--tp", "3"])
    assert out.exit_code == 2
    assert out.output.startswith("error: ") and out.output.count("\n") == 1, out.output


def test_a_sweep_of_sharded_layouts_carries_the_sharding_caveat():
    """Megatron-FSDP (zero 3) best layouts: one measured step-time row backs them (MBR-2511-H100-1),
    fewer than the band's 5, so the sweep says so as a plain search does; zero 1 layouts do not."""
    sharded = runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--zero", "3"])
    assert sharded.exit_code == 0, sharded.output
    assert "zero 2/3 layouts (Megatron-FSDP): 1 measured step-time row (MBR-2511-H100-1: llama3-8b fp8" in " ".join(sharded.output.split())
    doc = json.loads(runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--zero", "3", "--json"]).stdout)
    assert doc["sharding_note"].startswith("zero 2/3 layouts (Megatron-FSDP): 1 measured step-time row")
    plain = json.loads(runner.invoke(app, [*TOY, "--gbs-range", "8,16", "--zero", "1", "--json"]).stdout)
    assert plain["sharding_note"] is None
