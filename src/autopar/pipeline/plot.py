"""Figure of a balanced pipeline: simulated timeline per stage and memory per stage.

Top: the balanced split's simulated step (:func:`autopar.report.timeline.draw_timeline`): the
whole step when it is short, else the fill, one steady-state period and the drain with what lies
between them written in the gaps (:func:`autopar.pipeline.window.timeline_window`). Bottom: peak
memory per stage of the balanced and the even split against the memory limit; the axis reaches
the tallest bar (never clipped) and bars over the limit are hatched and labelled. Both titles say
which split fits. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autopar.pipeline.balance import BalancePlan, PlanCost
from autopar.pipeline.window import timeline_window

GIB = 2.0**30
BALANCED_COLOUR, EVEN_COLOUR, LIMIT_COLOUR = "#4C72B0", "#BBBBBB", "#C44E52"


def _fits(cost: PlanCost, limit_bytes: float) -> bool:
    return float(np.max(cost.stage_memory_bytes)) <= limit_bytes


def fit_title(plan: BalancePlan) -> str:
    """Which split fits, with the peaks, e.g. ``balanced split fits (78.0 of 79.6 GiB); even
    split does not (117.5 GiB)``."""
    limit = plan.memory_limit_bytes
    peak = float(np.max(plan.best.stage_memory_bytes))
    text = (f"balanced split fits ({peak / GIB:.1f} of {limit / GIB:.1f} GiB)" if peak <= limit else
            f"balanced split does not fit ({peak / GIB:.1f} GiB, limit {limit / GIB:.1f})")
    if plan.even is None:
        return text + "; no even split to compare (the layers do not split evenly)"
    even = float(np.max(plan.even.stage_memory_bytes))
    return text + (f"; even split fits too ({even / GIB:.1f} GiB)" if even <= limit else
                   f"; even split does not ({even / GIB:.1f} GiB)")


def _time_title(plan: BalancePlan, title: str) -> str:
    """Step times of both splits, the ranks' idle share of the balanced one's and how the picture was drawn."""
    sim = plan.best.simulation
    unit = 1e3 if sim.makespan_s < 10 else 1.0
    name = "ms" if unit == 1e3 else "s"
    line = f"{title + ': ' if title else ''}balanced split, {plan.schedule}, step {sim.makespan_s * unit:,.1f} {name}, " \
           f"ranks idle {sim.bubble_fraction:.1%}"
    if plan.even is not None:
        fits = _fits(plan.even, plan.memory_limit_bytes)
        line += f"; even split {plan.even.makespan_s * unit:,.1f} {name}" + ("" if fits else " (does not fit)")
    return line


def _stage_labels(best: PlanCost) -> list[str]:
    labels = []
    for i, row in enumerate(best.layers_per_chunk):
        layers = "+".join(str(int(n)) for n in row) if len(row) > 1 else str(int(row[0]))
        labels.append(f"stage {i} ({layers} L, {best.recompute[i]})")
    return labels


def _memory_panel(ax, plan: BalancePlan) -> None:
    """Bars per stage; the axis reaches above the tallest bar; bars over the limit hatched."""
    best, even, limit = plan.best, plan.even, plan.memory_limit_bytes / GIB
    pp = len(best.stage_memory_bytes)
    x = np.arange(pp)
    series = [("balanced", best, BALANCED_COLOUR)] + ([("even split", even, EVEN_COLOUR)] if even is not None else [])
    width = 0.8 / len(series)
    tallest = limit
    over_any = False
    for i, (name, cost, colour) in enumerate(series):
        gib = cost.stage_memory_bytes / GIB
        over = gib > limit
        over_any |= bool(over.any())
        pos = x + (i - (len(series) - 1) / 2) * width
        ax.bar(pos, gib, width, color=colour, label=name, hatch=["//" if o else "" for o in over],
               edgecolor=[LIMIT_COLOUR if o else colour for o in over])
        for p, g in zip(pos[over], gib[over]):
            ax.text(p, g, f"{g:.0f}", ha="center", va="bottom", fontsize=6, color=LIMIT_COLOUR)
        tallest = max(tallest, float(gib.max()))
    ax.axhline(limit, color=LIMIT_COLOUR, linestyle="--", label=f"limit {limit:.1f} GiB")
    if over_any:
        ax.bar([0], [0], color="white", edgecolor=LIMIT_COLOUR, hatch="//", label="over the limit")
    ax.set_ylim(0, tallest * 1.12)
    ax.set_xticks(x)
    ax.set_xticklabels([str(i) for i in x], fontsize=8)
    ax.set_xlim(-0.6, pp - 0.4)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_title(f"peak memory per stage: {fit_title(plan)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def balance_figure(plan: BalancePlan, title: str = ""):
    """The matplotlib figure of ``plan`` (timeline on top, memory per stage below); the caller
    saves and closes it (:func:`plot_plan`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autopar.report.timeline import draw_titled_timeline, head_room_in

    best = plan.best
    pp = len(best.layers_per_stage)
    timeline_in, memory_in, width_in = max(2.2, 0.36 * pp), 2.6, 14.0
    window = timeline_window(best.simulation)
    head_in = head_room_in(window)
    height_in = timeline_in + memory_in + head_in + 1.6
    fig = plt.figure(figsize=(width_in, height_in))
    outer = fig.add_gridspec(2, 1, height_ratios=[timeline_in, memory_in],
                             hspace=1.0 / ((timeline_in + memory_in) / 2),
                             left=0.13, right=0.85, top=1 - head_in / height_in, bottom=0.5 / height_in)
    draw_titled_timeline(fig, outer[0], best.simulation, window, _stage_labels(best), _time_title(plan, title),
                         width_in=width_in)
    _memory_panel(fig.add_subplot(outer[1]), plan)
    return fig


def plot_plan(plan: BalancePlan, path: str | Path, title: str = "") -> Path:
    """Write :func:`balance_figure` of ``plan`` to ``path`` (PNG, SVG or PDF by its suffix)
    and return the path.

    Raises:
        AutoparError: the file cannot be written.
    """
    from autopar.report.plots import save_figure

    return save_figure(balance_figure(plan, title), path)
