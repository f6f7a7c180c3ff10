"""The two pipeline-waste numbers are named for what they measure: the tables' ``bubble`` is
``pp_bubble / step`` (the fill and drain beyond the slowest stage's work), a timeline's or the
balancer's ``ranks idle`` is the idle share of all ranks over the simulated pipeline part (faster
stages waiting included). They differ for uneven stages, and the outputs say which is which."""

from __future__ import annotations

from types import SimpleNamespace

from typer.testing import CliRunner

from autopar.cli import app
from autopar.report.layout_plot import timeline_title
from autopar.report.table import BUBBLE_NOTE

runner = CliRunner()


def test_timeline_title_names_the_bubble_and_the_idle_share():
    """pp_bubble 0.85 s of a 113.0 s step is 0.75% (printed 0.8%); the simulation's ranks are idle
    2.1% of their 2 x 112.8 s."""
    e = SimpleNamespace(strategy=SimpleNamespace(schedule="1f1b", vpp=1), num_microbatches=128, step_time_s=113.0,
                        time_breakdown_s={"pp_bubble": 0.85})
    sim = SimpleNamespace(makespan_s=112.8, bubble_fraction=0.021)
    assert timeline_title("tp8 pp2", e, sim) == (
        "tp8 pp2: 1F1B, 128 micro-batches; pipeline part 112.80 s of the 113.00 s step; bubble 0.8% of the step, "
        "ranks idle 2.1% of the pipeline part")


def _caption(args: list[str]) -> str:
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--top", "3", *args])
    assert res.exit_code == 0, res.output
    return " ".join(res.stdout.split())


def test_search_caption_defines_the_bubble_column_when_a_row_is_pipelined():
    assert " ".join(BUBBLE_NOTE.split()) in _caption(["--pp", "2"])
    assert "bubble: pp_bubble / step" not in _caption(["--pp", "1"])


def test_balance_says_ranks_idle_not_bubble():
    res = runner.invoke(app, ["balance", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--tp", "2",
                              "--pp", "2"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if "idle" in x)
    assert line.startswith("Ranks idle ") and "% of the simulated pipeline part (fill, drain and waits for slower " \
        "stages); balanced in " in line
    assert "Bubble" not in res.stdout
