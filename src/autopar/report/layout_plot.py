"""Pictures of one costed layout: its simulated pipeline step and its memory per stage.

Used by ``autopar estimate --plot FILE`` (:func:`plot_layout`: both in one figure) and by the
``search --report`` page (:mod:`autopar.report.html`: each in its own PNG). The pipeline step is
:func:`autopar.pipeline.layout_timeline.layout_simulation`'s, drawn by
:func:`autopar.report.timeline.draw_timeline` (fill | one period | drain for a long step).
"""

from __future__ import annotations

from pathlib import Path

from autopar.estimate import Estimate
from autopar.pipeline.layout import layout_of
from autopar.pipeline.simulate import SimulationResult
from autopar.problem import Problem
from autopar.report.table import layout_label


def _layers_text(chunks: list[int]) -> str:
    """A stage's decoder layers by chunk: ``8``, ``4+5``, ``10 x 4`` (equal chunks), ``40 in 10
    chunks`` (more than 4 unequal ones)."""
    if len(chunks) == 1:
        return str(chunks[0])
    if len(set(chunks)) == 1:
        return f"{len(chunks)} x {chunks[0]}"
    return "+".join(map(str, chunks)) if len(chunks) <= 4 else f"{sum(chunks)} in {len(chunks)} chunks"


def stage_labels(p: Problem, e: Estimate) -> list[str]:
    """``stage i (4+5 L, none)`` per pipeline stage: decoder layers (by chunk) and recompute."""
    decoder = layout_of(p, e.strategy).decoder
    return [f"stage {m.stage} ({_layers_text([int(n) for n in decoder[m.stage]])} L, {m.recompute})"
            for m in e.memory_per_stage]


SCHEDULE_TITLES = {"zbv": "ZB-V (chunk 1 of rank r is stage 2pp-1-r)", "dualpipev": "DualPipeV (V placement)",
                   "gpipe": "GPipe"}


def timeline_title(name: str, e: Estimate, sim: SimulationResult) -> str:
    """``NAME: 1F1B, 128 micro-batches; pipeline part 112.84 s of the 113.06 s step; bubble 0.8%
    of the step, ranks idle 2.1% of the pipeline part``: the simulated makespan next to the
    estimate's whole step, the tables' bubble (``pp_bubble / step``: fill and drain beyond the
    slowest stage's work) and the simulation's idle share of all ranks
    (:attr:`~autopar.pipeline.simulate.SimulationResult.bubble_fraction`: the fill and drain
    plus faster stages waiting for slower ones), each named for what it measures."""
    schedule = SCHEDULE_TITLES.get(e.strategy.schedule) or ("interleaved 1F1B" if e.strategy.vpp > 1 else "1F1B")
    bubble = e.time_breakdown_s["pp_bubble"] / e.step_time_s
    return (f"{name}: {schedule}, {e.num_microbatches:,} micro-batches; pipeline part {sim.makespan_s:,.2f} s of "
            f"the {e.step_time_s:,.2f} s step; bubble {bubble:.1%} of the step, ranks idle {sim.bubble_fraction:.1%} "
            "of the pipeline part")


def layout_figure(p: Problem, e: Estimate):
    """One figure: the simulated pipeline step of ``e`` on top (none for pp 1: the title says
    so) and its memory per stage below; the caller saves and closes it.

    Raises:
        AutoparError: the pipeline step cannot be simulated (see
            :func:`autopar.pipeline.layout_timeline.layout_simulation`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autopar.pipeline.layout_timeline import layout_simulation
    from autopar.pipeline.window import timeline_window
    from autopar.report.plots import draw_stage_memory
    from autopar.report.timeline import draw_titled_timeline, head_room_in

    s, name = e.strategy, layout_label(e)
    memory_title = f"{name}: memory per device by stage"
    if s.pp == 1:
        fig, ax = plt.subplots(figsize=(6.0, 4.6))
        draw_stage_memory(ax, e, memory_title + " (pp 1: no pipeline to draw)")
        fig.tight_layout()
        return fig
    sim, p2p_s = layout_simulation(p, s)
    window = timeline_window(sim)
    width_in, rows_in, memory_in = 13.0, max(1.8, 0.34 * s.pp), 2.6
    head_in = head_room_in(window)
    height_in = head_in + rows_in + memory_in + 2.0
    fig = plt.figure(figsize=(width_in, height_in))
    outer = fig.add_gridspec(2, 1, height_ratios=[rows_in, memory_in], hspace=1.1 / ((rows_in + memory_in) / 2),
                             left=0.15, right=0.82, top=1 - head_in / height_in, bottom=1.0 / height_in)
    draw_titled_timeline(fig, outer[0], sim, window, stage_labels(p, e), timeline_title(name, e, sim), p2p_s, width_in)
    draw_stage_memory(fig.add_subplot(outer[1]), e, memory_title)
    return fig


def plot_layout(p: Problem, e: Estimate, path: str | Path, option: str = "--plot") -> Path:
    """Write :func:`layout_figure` to ``path`` (PNG, SVG or PDF by its suffix); returns the path.

    Raises:
        AutoparError: the file cannot be written (named by ``option``), or what
            :func:`layout_figure` raises.
    """
    from autopar.report.plots import save_figure

    return save_figure(layout_figure(p, e), path, option)
