"""memory.png's limit line carries the same figure as the text (a new user saw "device 80 GiB"
on the chart and 79.6 GiB in the table: the H100's 85.5 GB is 79.6 GiB, the label rounded it)."""

from __future__ import annotations

from conftest import make_problem

from autopar.estimate import estimate
from autopar.report.plots import GIB, draw_stage_memory, plt
from autopar.strategy import Strategy


def test_the_limit_label_is_the_texts_one_decimal_gib():
    p = make_problem("llama3-8b")
    e = estimate(p, Strategy(dp=8, tp=1, pp=1, mbs=1))
    fig, ax = plt.subplots()
    draw_stage_memory(ax, e, "t")
    _, labels = ax.get_legend_handles_labels()
    plt.close(fig)
    assert f"device {e.device_memory_bytes / GIB:.1f} GiB" in labels
    assert "device 79.6 GiB" in labels  # h100-80gb: 85,520,809,984 B / 2^30
