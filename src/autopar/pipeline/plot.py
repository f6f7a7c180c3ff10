"""Figure of a balanced pipeline: simulated timeline per stage and memory per stage.

Top panel: one row per pipeline stage, each op of :func:`autopar.pipeline.simulate.simulate`'s
timeline as a bar (forward, recompute, backward, weight gradient in distinct colours), so the
bubbles show as white gaps. A step extrapolated from its steady state
(:mod:`autopar.pipeline.steady`) draws the step it was simulated with, and the title says so. Bottom panel: peak memory per stage of the balanced and the even
split against the device limit. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline.balance import BalancePlan

COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "recompute": "#DD8452", "weight_grad": "#8172B3"}
GIB = 2.0**30


def _time_unit(makespan_s: float) -> tuple[float, str]:
    return (1e3, "ms") if makespan_s < 10 else (1.0, "s")


def plot_plan(plan: BalancePlan, path: str | Path, title: str = "") -> Path:
    """Write the timeline + memory figure of ``plan`` to ``path`` (PNG) and return the path.

    Raises:
        AutoparError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    best = plan.best
    sim = best.simulation
    pp = len(best.layers_per_stage)
    scale, unit = _time_unit(sim.makespan_s)
    fig, (ax_t, ax_m) = plt.subplots(2, 1, figsize=(13, 2.6 + 0.42 * pp + 2.6),
                                     gridspec_kw={"height_ratios": [max(2.0, 0.42 * pp), 2.4]})
    by_kind: dict[str, list[list[tuple[float, float]]]] = {k: [[] for _ in range(pp)] for k in COLOURS}
    for op in sim.timeline:
        by_kind[op.kind][op.stage].append((op.start_s * scale, (op.end_s - op.start_s) * scale))
    for kind, rows in by_kind.items():
        for stage, bars in enumerate(rows):
            if bars:
                ax_t.broken_barh(bars, (stage - 0.4, 0.8), facecolors=COLOURS[kind], edgecolor="white",
                                 linewidth=0.3)
    ax_t.set_ylim(pp - 0.5, -0.5)
    ax_t.set_yticks(range(pp))
    ax_t.set_yticklabels([f"stage {i} ({n} L, {r})" for i, (n, r) in
                          enumerate(zip(best.layers_per_stage, best.recompute))], fontsize=8)
    shown_s = max((op.end_s for op in sim.timeline), default=sim.makespan_s)  # the step drawn
    ax_t.set_xlim(0, shown_s * scale * 1.01)
    ax_t.set_xlabel(f"time ({unit})")
    even = plan.even
    vs = f", even split {even.makespan_s * scale:.1f} {unit}" if even is not None else ""
    drawn = "" if sim.timeline_microbatches is None else \
        f"\n(drawn: the same schedule with {sim.timeline_microbatches} micro-batches; the step extrapolated from its steady state)"
    ax_t.set_title(f"{title + ': ' if title else ''}balanced timeline, step {sim.makespan_s * scale:.1f} {unit}{vs}, "
                   f"bubble {sim.bubble_fraction:.1%}{drawn}", fontsize=10)
    used = [k for k in COLOURS if any(by_kind[k][s] for s in range(pp))]
    ax_t.legend(handles=[Patch(color=COLOURS[k], label=k.replace("_", " ")) for k in used] +
                [Patch(facecolor="white", edgecolor="grey", label="bubble (idle)")],
                loc="upper center", bbox_to_anchor=(0.5, -0.18 if pp <= 8 else -0.08), ncol=len(used) + 1,
                fontsize=8, frameon=False)

    x = np.arange(pp)
    width = 0.4 if even is not None else 0.7
    ax_m.bar(x - (width / 2 if even is not None else 0), best.stage_memory_bytes / GIB, width,
             color="#4C72B0", label="balanced")
    if even is not None:
        ax_m.bar(x + width / 2, even.stage_memory_bytes / GIB, width, color="#BBBBBB", label="even split")
    ax_m.axhline(plan.memory_limit_bytes / GIB, color="#C44E52", linestyle="--",
                 label=f"limit {plan.memory_limit_bytes / GIB:.1f} GiB")
    ax_m.set_xticks(x)
    ax_m.set_xticklabels([str(i) for i in x], fontsize=8)
    ax_m.set_xlabel("pipeline stage")
    ax_m.set_ylabel("peak memory (GiB)")
    ax_m.set_title("peak memory per stage", fontsize=10)
    ax_m.set_ylim(0, plan.memory_limit_bytes / GIB * 1.25)
    ax_m.legend(fontsize=8, loc="upper right", ncol=3)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise AutoparError(f"--plot {path}: {err.strerror or err}") from None
    finally:
        plt.close(fig)
    return Path(path)
