"""Draw a simulated pipeline step: one row per pipeline stage, one bar per op (matplotlib).

:func:`draw_timeline` draws the segments :func:`autopar.pipeline.window.timeline_window` picks
(the whole step, or fill | one steady-state period | drain with what was left out written in
the gaps) side by side on a shared stage axis. Colours: forward, backward, recompute, weight
gradient (zero-bubble W), and the p2p transfers as a thin strip under the receiving stage's
row (an activation or gradient on its way from the neighbouring stage; the simulation models
it as a delay on the dependency, overlapped with compute). With interleaving (vpp > 1) the
later model chunks are drawn in lighter shades of their colour. White is idle time: the fill and
drain, and faster stages waiting for slower ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from autopar.pipeline.placement import placement
from autopar.pipeline.simulate import SimulationResult, TimelineOp
from autopar.pipeline.window import TimelineWindow

KIND_COLOURS = {"forward": "#4C72B0", "backward": "#55A868", "recompute": "#DD8452", "weight_grad": "#8172B3"}
KIND_LABELS = {"forward": "forward", "backward": "backward", "recompute": "recompute",
               "weight_grad": "weight gradient (W)"}
P2P_COLOUR = "#C44E52"
GAP_SPACE = 0.16  # space between segments, a fraction of the mean panel width (matplotlib's wspace)
MIN_PANEL_SHARE = 0.22  # a drawn segment gets at least this share of the width (its own time scale)


@dataclass(frozen=True)
class TimeUnit:
    """Seconds -> the unit drawn (``scale`` times seconds, named ``name``)."""

    scale: float
    name: str

    @classmethod
    def for_span(cls, span_s: float) -> "TimeUnit":
        """ms below 10 s, else s."""
        return cls(1e3, "ms") if span_s < 10 else cls(1.0, "s")

    def text(self, seconds: float) -> str:
        """``seconds`` in this unit, e.g. ``195.1 s``."""
        return f"{seconds * self.scale:,.1f} {self.name}"


def inferred_p2p_s(timeline: list[TimelineOp]) -> float:
    """The p2p time of a simulated step, read off its timeline: rank 1's first forward waits,
    idle, for rank 0's first forward plus one transfer
    (:func:`autopar.pipeline.simulate.simulate`), so the transfer is the difference; 0 for one
    stage."""
    first = {op.stage: op for op in timeline if op.kind == "forward" and op.microbatch == 0 and op.chunk == 0}
    if 0 not in first or 1 not in first:
        return 0.0
    return max(0.0, first[1].start_s - first[0].end_s)


def p2p_transfers(timeline: list[TimelineOp], p2p_s: float, schedule: str = "1f1b") -> list[tuple[int, float, float]]:
    """``(receiving stage, start_s, end_s)`` of every p2p transfer of the step: the output of
    the forward of virtual stage ``j`` goes to the next stage of its chain, the input gradient of
    the backward of ``j`` to the previous one (virtual stages from ``schedule``'s placement,
    :mod:`autopar.pipeline.placement`; ``j = chunk * pp + stage`` but for the V and
    bidirectional schedules), each ``p2p_s`` long from the end of the op that produced it; none
    where both stages sit on one rank (the V's turn). Empty when ``p2p_s`` is 0."""
    if p2p_s <= 0 or not timeline:
        return []
    pp, vpp = 1 + max(op.stage for op in timeline), 1 + max(op.chunk for op in timeline)
    table = placement(schedule, pp, vpp)
    rank_of, _ = table.owner()
    out = []
    for op in timeline:
        j = int(table.stage[op.stage, op.chunk])
        to = table.next(j) if op.kind == "forward" else table.previous(j) if op.kind == "backward" else None
        if to is not None and rank_of[to] != op.stage:
            out.append((rank_of[to], op.end_s, op.end_s + p2p_s))
    return out


def _shade(colour: str, chunk: int, vpp: int) -> tuple[float, float, float]:
    """Chunk 0 in ``colour``, later chunks mixed up to 45% with white."""
    rgb = np.array(to_rgb(colour))
    mix = 0.45 * chunk / (vpp - 1) if vpp > 1 else 0.0
    return tuple(rgb + (1 - rgb) * mix)


def _width_ratios(spans_s: list[float]) -> list[float]:
    """Panel widths proportional to their durations, each at least :data:`MIN_PANEL_SHARE`."""
    total = sum(spans_s) or 1.0
    shares = [max(s / total, MIN_PANEL_SHARE) for s in spans_s]
    return [s / sum(shares) for s in shares]


def draw_timeline(fig, spec, sim: SimulationResult, window: TimelineWindow, stage_labels: list[str],
                  p2p_s: float | None = None, width_in: float = 12.0) -> list:
    """Draw ``sim``'s timeline, the segments of ``window``, into the subplot spec ``spec`` of
    ``fig``; returns ``(axes, handles)``: one axes per segment and the legend entries of what
    was drawn (the caller places the legend).

    Args:
        stage_labels: one y label per pipeline stage (``len == pp``).
        p2p_s: seconds per p2p transfer (default: :func:`inferred_p2p_s`).
        width_in: the figure's width in inches (sizes the micro-batch numbers written in bars).
    """
    timeline = sim.timeline
    pp = len(stage_labels)
    vpp = 1 + max((op.chunk for op in timeline), default=0)
    p2p_s = inferred_p2p_s(timeline) if p2p_s is None else p2p_s
    segments = window.segments
    unit = TimeUnit.for_span(sim.makespan_s)
    ratios = _width_ratios([s.end_s - s.start_s for s in segments])
    grid = spec.subgridspec(1, len(segments), width_ratios=ratios, wspace=GAP_SPACE if window.elided else 0.0)
    axes = [fig.add_subplot(grid[0, i]) for i in range(len(segments))]
    bars: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for op in timeline:
        bars.setdefault((op.kind, op.stage, op.chunk), []).append((op.start_s, op.end_s - op.start_s))
    transfers = p2p_transfers(timeline, p2p_s, sim.schedule)
    for ax, seg, share in zip(axes, segments, ratios):
        px_per_s = share * width_in * 0.8 * 110 / max(seg.end_s - seg.start_s, 1e-30)
        for (kind, stage, chunk), spans in bars.items():
            shown = [(a, w) for a, w in spans if a < seg.end_s and a + w > seg.start_s]
            if shown:
                ax.broken_barh([((a + seg.shift_s) * unit.scale, w * unit.scale) for a, w in shown], (stage - 0.4, 0.7),
                               facecolors=[_shade(KIND_COLOURS[kind], chunk, vpp)], edgecolor="white", linewidth=0.4)
        for op in timeline:  # micro-batch numbers where a bar is wide enough
            if op.kind == "forward" or op.kind == "backward":
                if (op.end_s - op.start_s) * px_per_s >= 22 and seg.start_s <= op.start_s and op.end_s <= seg.end_s:
                    ax.text((0.5 * (op.start_s + op.end_s) + seg.shift_s) * unit.scale, op.stage - 0.05,
                            str(op.microbatch + seg.shift_microbatches), ha="center", va="center", fontsize=6,
                            color="white")
        by_stage: dict[int, list[tuple[float, float]]] = {}
        for stage, a, b in transfers:
            if a < seg.end_s and b > seg.start_s:
                by_stage.setdefault(stage, []).append(((a + seg.shift_s) * unit.scale, (b - a) * unit.scale))
        for stage, spans in by_stage.items():
            ax.broken_barh(spans, (stage + 0.3, 0.12), facecolors=P2P_COLOUR, linewidth=0)
        ax.set_xlim((seg.start_s + seg.shift_s) * unit.scale, (seg.end_s + seg.shift_s) * unit.scale)
        ax.set_ylim(pp - 0.5, -0.5)
        if window.elided:
            ax.set_title(seg.name + ("" if seg.name != "steady state" or window.period_microbatches is None else
                                     f"\n(one period: {window.period_microbatches} micro-batch"
                                     f"{'es' if window.period_microbatches > 1 else ''}, {unit.text(window.period_s)})"),
                         fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.locator_params(axis="x", nbins=max(3, round(10 * share)))
        ax.set_yticks(range(pp))
        ax.set_yticklabels(stage_labels if ax is axes[0] else [], fontsize=8)
        if ax is not axes[0]:
            ax.tick_params(axis="y", length=0)
    for left, right, gap in zip(axes, axes[1:], window.gaps):  # say what is not drawn, in the gap
        for ax, x in ((left, 1.0), (right, 0.0)):
            ax.plot([x - 0.012, x + 0.012], [-0.02, 0.02], transform=ax.transAxes, color="black", clip_on=False, lw=1)
            ax.plot([x - 0.012, x + 0.012], [0.98, 1.02], transform=ax.transAxes, color="black", clip_on=False, lw=1)
        gap_x = -0.5 * GAP_SPACE * float(np.mean(ratios)) / ratios[axes.index(right)]  # right's axes units
        right.text(gap_x, 0.5, f"{gap.microbatches:,} micro-batches\n({unit.text(gap.seconds)}) not drawn",
                   transform=right.transAxes, rotation=90, ha="center", va="center", fontsize=7.5, color="#555555",
                   linespacing=1.1)
    axes[len(axes) // 2].set_xlabel(f"time in the step ({unit.name})" +
                                    ("; each panel has its own time scale" if window.elided else ""), fontsize=9)
    used = [k for k in KIND_COLOURS if any(key[0] == k for key in bars)]
    handles = [Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in used]
    if transfers:
        handles.append(Patch(color=P2P_COLOUR, label=f"p2p ({TimeUnit.for_span(p2p_s).text(p2p_s)} each)"))
    handles.append(Patch(facecolor="white", edgecolor="grey", label="idle"))
    if vpp > 1:
        handles.append(Patch(facecolor=_shade(KIND_COLOURS["forward"], vpp - 1, vpp), label="later chunks lighter"))
    return axes, handles


ELIDED_NOTE = "drawn: the fill, one steady-state period and the drain (the micro-batches between repeat the period)"


def head_room_in(window: TimelineWindow) -> float:
    """Inches above the timeline for the title: two lines more when part of the step is left out."""
    return 1.0 if window.elided else 0.5


def draw_titled_timeline(fig, spec, sim: SimulationResult, window: TimelineWindow, stage_labels: list[str],
                         title: str, p2p_s: float | None = None, width_in: float = 12.0) -> list:
    """:func:`draw_timeline` with ``title`` (and :data:`ELIDED_NOTE` when part of the step is
    left out) as the figure's title and the legend to the right of the last panel; returns the
    axes."""
    axes, handles = draw_timeline(fig, spec, sim, window, stage_labels, p2p_s, width_in)
    fig.suptitle(title + ("\n" + ELIDED_NOTE if window.elided else ""), fontsize=10,
                 y=1 - 0.1 / fig.get_size_inches()[1])
    axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return axes


def timeline_png(sim: SimulationResult, stage_labels: list[str], title: str, p2p_s: float | None = None) -> bytes:
    """PNG of one simulated step (:func:`draw_titled_timeline` of
    :func:`autopar.pipeline.window.timeline_window` of ``sim``)."""
    import matplotlib.pyplot as plt

    from autopar.pipeline.window import timeline_window
    from autopar.report.plots import _png

    window = timeline_window(sim)
    width_in, rows_in, head_in = 11.0, max(1.6, 0.34 * len(stage_labels)), head_room_in(window)
    height_in = rows_in + head_in + 0.7
    fig = plt.figure(figsize=(width_in, height_in))
    spec = fig.add_gridspec(1, 1, left=0.16, right=0.8, top=1 - head_in / height_in, bottom=0.55 / height_in)
    draw_titled_timeline(fig, spec[0], sim, window, stage_labels, title, p2p_s, width_in)
    return _png(fig)
