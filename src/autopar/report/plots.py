"""Matplotlib charts of a search result (Agg backend, PNG bytes, no display needed).

* :func:`ranking_chart`: the top layouts as horizontal bars of step time split into the parts
  of ``Estimate.time_breakdown_s`` (compute, TP, CP, EP, PP bubble, PP p2p, DP, optimizer).
* :func:`memory_chart`: per-pipeline-stage memory of one layout (weights, gradients, optimizer,
  activations, other; from ``Estimate.memory_per_stage``) against the device limit.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from autopar.estimate import Estimate  # noqa: E402
from autopar.report.table import layout_label  # noqa: E402

GIB = 2**30
# (breakdown key, legend label, colour) in stacking order.
TIME_PARTS = (("compute", "compute", "#4c72b0"), ("tp_comm", "TP comm", "#dd8452"), ("cp_comm", "CP comm", "#8172b3"),
              ("ep_comm", "EP comm", "#937860"), ("pp_bubble", "PP bubble", "#c44e52"),
              ("pp_comm", "PP p2p", "#da8bc3"), ("dp_comm", "DP comm", "#55a868"), ("optimizer", "optimizer", "#8c8c8c"))
MEMORY_PARTS = (("weights_bytes", "weights", "#4c72b0"), ("grads_bytes", "gradients", "#55a868"),
                ("optimizer_bytes", "optimizer", "#8172b3"), ("activations_bytes", "activations", "#dd8452"),
                ("other_bytes", "other", "#8c8c8c"))


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def save_figure(fig, path, option: str = "--plot"):
    """Save ``fig`` to ``path`` (PNG, SVG or PDF by its suffix), close it, return the path.

    Raises:
        AutoparError: the file cannot be written (``option='path': cannot write (reason)``).
    """
    from pathlib import Path

    from autopar.errors import AutoparError

    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise AutoparError(f"{option}={str(path)!r}: cannot write ({err.strerror or err})") from None
    finally:
        plt.close(fig)
    return Path(path)


def ranking_chart(layouts: list[Estimate], title: str) -> bytes:
    """PNG: one bar per layout (best at the top), step time (s) stacked by part."""
    n = len(layouts)
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.45 * n))
    labels = [f"#{i} {layout_label(e)} mbs{e.strategy.mbs} z{e.strategy.zero} {e.strategy.recompute}"
              for i, e in enumerate(layouts, 1)]
    rows = list(range(n))[::-1]
    left = [0.0] * n
    for key, name, colour in TIME_PARTS:
        widths = [e.time_breakdown_s.get(key, 0.0) for e in layouts]
        if any(widths):
            ax.barh(rows, widths, left=left, color=colour, label=name, height=0.7)
            left = [a + b for a, b in zip(left, widths)]
    for row, e in zip(rows, layouts):
        ax.text(e.step_time_s, row, f" {e.step_time_s:.2f} s, MFU {e.mfu:.0%}", va="center", fontsize=8)
    ax.set_yticks(rows, labels, fontsize=8)
    ax.set_xlabel("predicted step time (s)")
    ax.set_xlim(0, max(e.step_time_s for e in layouts) * 1.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="part", title_fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def draw_stage_memory(ax, e: Estimate, title: str) -> None:
    """Stacked memory per pipeline stage of ``e`` (GiB) on ``ax``, the device capacity as a
    dashed line; the axis reaches above the tallest bar and the capacity, so nothing is cut off."""
    stages = e.memory_per_stage
    xs = [m.stage for m in stages]
    bottom = [0.0] * len(stages)
    for key, name, colour in MEMORY_PARTS:
        heights = [getattr(m, key) / GIB for m in stages]
        ax.bar(xs, heights, bottom=bottom, color=colour, label=name, width=0.7)
        bottom = [a + b for a, b in zip(bottom, heights)]
    limit = e.device_memory_bytes / GIB
    ax.axhline(limit, color="#c44e52", linestyle="--", linewidth=1.5, label=f"device {limit:.1f} GiB")
    ax.set_xticks(xs, [f"{m.stage}\n({m.layers} L)" for m in stages], fontsize=8)
    ax.set_xlabel("pipeline stage (layers)")
    ax.set_ylabel("memory per device (GiB)")
    ax.set_ylim(0, max(limit, max(bottom)) * 1.15)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)


def memory_chart(e: Estimate, title: str) -> bytes:
    """PNG: :func:`draw_stage_memory` of ``e``."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.0 + 0.55 * len(e.memory_per_stage)) + 1.2, 3.8))
    draw_stage_memory(ax, e, title)
    return _png(fig)
