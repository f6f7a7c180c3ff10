"""``autopar estimate --plot FILE``: one layout's simulated pipeline step and memory per stage."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.estimate import estimate
from autopar.pipeline.layout_timeline import layout_simulation
from autopar.report.layout_plot import layout_figure, stage_labels
from autopar.strategy import Strategy

runner = CliRunner()
LLAMA8B = ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64",
           "--seq-len", "8192"]


def test_estimate_plot_writes_the_figure_and_keeps_the_table(tmp_path):
    png = tmp_path / "layout.png"
    result = runner.invoke(app, LLAMA8B + ["--pp", "4", "--vpp", "2", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "Memory per device by pipeline stage" in result.output and f"wrote {png}" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name, needle", [("layout.txt", "give a file name ending in .png, .svg, .pdf"),
                                          ("missing/layout.png", "cannot write (no directory")])
def test_estimate_plot_refuses_a_file_it_cannot_write_before_any_work(tmp_path, name, needle):
    result = runner.invoke(app, LLAMA8B + ["--plot", str(tmp_path / name)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --plot=") and needle in lines[0]


def test_estimate_plot_never_overwrites_the_model_file(tmp_path):
    config = tmp_path / "config.png"  # an HF config that happens to end in .png
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    result = runner.invoke(app, ["estimate", "--model", str(config), "--device", "h100-80gb", "--gbs", "8",
                                 "--plot", str(config)])
    assert result.exit_code == 2 and "error: --plot" in result.output
    assert json.loads(config.read_text()) == {"architectures": ["LlamaForCausalLM"]}


def test_layout_figure_draws_the_simulated_step_and_the_memory():
    """pp 4 with 32 micro-batches (gbs 64, dp 2): short enough to draw whole (one timeline
    panel), its stage labels from the layout (8 layers each, no recompute), and the memory panel."""
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    e = estimate(p, Strategy(dp=2, pp=4))
    assert stage_labels(p, e) == [f"stage {i} (8 L, none)" for i in range(4)]
    sim, p2p_s = layout_simulation(p, e.strategy)
    assert p2p_s > 0 and sim.makespan_s <= e.step_time_s
    fig = layout_figure(p, e)
    try:
        timeline, memory = fig.axes
        assert [t.get_text() for t in timeline.get_yticklabels()] == stage_labels(p, e)
        assert "pipeline part" in fig._suptitle.get_text() and "memory per device by stage" in memory.get_title()
    finally:
        plt.close(fig)


def test_layout_figure_without_pipeline_says_so():
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    fig = layout_figure(p, estimate(p, Strategy(dp=8)))
    try:
        assert len(fig.axes) == 1 and "pp 1: no pipeline to draw" in fig.axes[0].get_title()
    finally:
        plt.close(fig)
