"""``balance --plot``'s figure: titles say which split fits, memory bars are never clipped, a
long step is drawn as fill | period | drain and says what it left out."""

from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
import pytest
from conftest import make_problem

from autopar.pipeline.balance import balance
from autopar.pipeline.layers import layer_table
from autopar.pipeline.plot import balance_figure, fit_title, plot_plan
from autopar.strategy import Strategy

GIB = 2.0**30


@pytest.fixture(scope="module")
def plan():
    """Llama-3-8B, pp 4, 128 micro-batches (gbs 256, dp 2): long enough to elide the middle."""
    p = make_problem("llama3-8b", gbs=256, seq=8192)
    return balance(layer_table(p, Strategy(dp=2, pp=4, zero=1)), 1, 128, "1f1b")


def _texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(plt.Text)]


def _with_peaks(plan, best_gib, even_gib, limit_gib):
    """``plan`` with its stages' peaks replaced (GiB per stage) and the limit."""
    return replace(plan, memory_limit_bytes=limit_gib * GIB,
                   best=replace(plan.best, stage_memory_bytes=np.array(best_gib) * GIB),
                   even=replace(plan.even, stage_memory_bytes=np.array(even_gib) * GIB))


def test_fit_title_names_the_split_that_fits(plan):
    """The issue's example: balanced 71.2 of 80 GiB fits, the even split's 115 GiB does not."""
    assert fit_title(_with_peaks(plan, [60, 71.2, 70, 50], [115, 100, 90, 70], 80)) == \
        "balanced split fits (71.2 of 80.0 GiB); even split does not (115.0 GiB)"
    assert fit_title(_with_peaks(plan, [60, 71.2, 70, 50], [75, 70, 65, 60], 80)) == \
        "balanced split fits (71.2 of 80.0 GiB); even split fits too (75.0 GiB)"
    assert fit_title(_with_peaks(plan, [60, 81, 70, 50], [75, 70, 65, 60], 80)) == \
        "balanced split does not fit (81.0 GiB, limit 80.0); even split fits too (75.0 GiB)"
    assert fit_title(replace(plan, even=None)).endswith("; no even split to compare (the layers do not split evenly)")


def test_memory_bars_over_the_limit_are_drawn_whole_and_marked(plan):
    """A limit below every bar: the axis still reaches above the tallest bar, every bar is
    hatched and labelled with its GiB, and the legend says what the hatch means."""
    low = replace(plan, memory_limit_bytes=10 * GIB)
    fig = balance_figure(low, "t")
    try:
        memory = fig.axes[-1]
        tallest = max(float(np.max(plan.best.stage_memory_bytes)), float(np.max(plan.even.stage_memory_bytes))) / GIB
        assert memory.get_ylim()[1] > tallest
        hatched = [b for b in memory.patches if b.get_hatch() == "//" and b.get_height() > 0]
        assert len(hatched) == 2 * 4
        labels = [t.get_text() for t in memory.texts]
        assert len(labels) == 8 and all(label.isdigit() for label in labels)
        assert "over the limit" in [t.get_text() for t in memory.get_legend().get_texts()]
        assert "balanced split does not fit" in memory.get_title()
    finally:
        plt.close(fig)


def test_long_step_is_drawn_as_fill_period_drain_and_says_so(plan):
    fig = balance_figure(plan, "llama3-8b pp4")
    try:
        texts = _texts(fig)
        assert [t for t in texts if t.startswith("steady state\n(one period: ")]
        assert {"fill", "drain"} <= set(texts)
        gaps = [t for t in texts if t.endswith("not drawn") and "micro-batches\n(" in t]
        assert len(gaps) == 2
        assert "drawn: the fill, one steady-state period and the drain" in fig._suptitle.get_text()
        legend = [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
        assert legend[:2] == ["forward", "backward"] and "idle" in legend
        assert any(label.startswith("p2p (") for label in legend)
    finally:
        plt.close(fig)


def test_plot_plan_writes_the_file(plan, tmp_path):
    path = plot_plan(plan, tmp_path / "pipe.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zero_bubble_step_has_its_weight_gradient_colour_and_p2p_in_the_legend():
    """ZB-H1 splits each backward into B and W (Qi et al., ICLR 2024): W gets its own colour; the
    p2p strip is labelled with the transfer time read off the timeline (0.1 s)."""
    from autopar.pipeline.simulate import PipelineTimes, simulate
    from autopar.pipeline.window import timeline_window
    from autopar.report.timeline import KIND_COLOURS, draw_titled_timeline

    sim = simulate(PipelineTimes.uniform(4, 1, 1.0, 2.0, recompute_s=0.5, p2p_s=0.1), 12, "zb-h1")
    fig = plt.figure(figsize=(10, 3))
    try:
        axes = draw_titled_timeline(fig, fig.add_gridspec(1, 1)[0], sim, timeline_window(sim),
                                    [f"stage {i}" for i in range(4)], "zb")
        legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
        assert legend == ["forward", "backward", "recompute", "weight gradient (W)", "p2p (100.0 ms each)",
                          "idle"]
        colours = {tuple(np.round(c.get_facecolor()[0][:3], 3)) for c in axes[0].collections}
        assert tuple(np.round(to_rgb(KIND_COLOURS["weight_grad"]), 3)) in colours
    finally:
        plt.close(fig)
