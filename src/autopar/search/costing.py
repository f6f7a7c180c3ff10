"""Cost the search's valid layouts: memory first, time only for the layouts that fit, and each
bounding stage view only where it stands for a stage of its own.

:func:`autopar.cost.stage.bounding_stages` gives three views per layout (stage 0, stage 1 and
stage pp-1). With pp = 1 all three are stage 0, and with pp = 2 stage 1 is stage pp-1, so those
rows are costed once and copied (the cost functions are row-wise, so the copies are the numbers
a full pass gives). The peak memory decides what fits; the step time of a layout that does not
fit is never ranked, so it is not costed (``inf``; its breakdown, tokens/s and MFU ``nan``).
The numbers of the layouts that fit are those of :func:`autopar.cost.step.evaluate`.
Memory is costed as its three parts (:func:`autopar.cost.memory.stage_state`,
:func:`~autopar.cost.memory.stage_activation_bytes`, :func:`~autopar.cost.memory.stage_buffers`),
each once per distinct value of the knobs it reads, summed as
:func:`autopar.cost.memory.stage_memory` sums them. This costs a whole batch (``--explain``,
Galvatron's and the V schedules' variants, :func:`autopar.search.grid.costed_grid`); the streamed
search costs cells of the same terms (:mod:`autopar.search.cell_costs`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable

import numpy as np

from autopar.cost import stage_time as T
from autopar.cost.memory import assemble_memory, stage_activation_bytes, stage_buffers, stage_state
from autopar.cost.stage import Stages, bounding_stages
from autopar.cost.step import TIME_KEYS, StepCosts, combine, view_time
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.search.distinct import Distinct


def view_counts(batch: LayoutBatch) -> list[np.ndarray]:
    """How many pipeline stages each bounding view stands for (see ``bounding_stages``)."""
    pp = batch.pp
    return [np.ones(len(batch)), np.where(pp >= 3, pp - 2, 0), np.where(pp >= 2, 1, 0)]


def _own_rows(batch: LayoutBatch) -> list[np.ndarray]:
    """Rows on which each bounding view is a stage of its own: view 0 everywhere, view 1 (stage
    1) where pp >= 3, view 2 (stage pp-1) where pp >= 2."""
    pp = batch.pp
    return [np.arange(len(batch)), np.flatnonzero(pp >= 3), np.flatnonzero(pp >= 2)]


def spread_views(own: list[np.ndarray], per_view: list[np.ndarray]) -> list[np.ndarray]:
    """Full-length ``(n,)`` values of the three views from each view's values on the rows where
    it is a stage of its own (``own``: row indices per view, view 0's all rows): where pp = 1
    views 1 and 2 are view 0; where pp = 2 view 1 is view 2."""
    v0 = per_view[0]
    v2 = v0.copy()
    v2[own[2]] = per_view[2]
    v1 = v2.copy()
    v1[own[1]] = per_view[1]
    return [v0, v1, v2]


def _views_of(batch: LayoutBatch, per_view: list[np.ndarray]) -> list[np.ndarray]:
    """:func:`spread_views` on the rows of ``batch`` (:func:`_own_rows`)."""
    return spread_views(_own_rows(batch), per_view)


def _memory_total(p: Problem, run: Callable[[str, Callable], object]) -> np.ndarray:
    """Total bytes of a view's rows from its parts, each evaluated by ``run(name, fn)`` (once per
    distinct value of what it reads): :func:`autopar.cost.memory.assemble_memory`."""
    state = run("state", lambda b, s: stage_state(p, b, s))
    activations = run("activations", lambda b, s: stage_activation_bytes(p, b, s))
    buffers = run("buffers", lambda b, s: stage_buffers(p, b, s))
    return assemble_memory(p, state, activations, buffers).total_bytes


def _cost_memory(p: Problem, batch: LayoutBatch, views: list[Stages], distinct: Distinct | None) -> np.ndarray:
    """Peak bytes per layout: the largest stage total over the views that are stages."""
    totals = []
    for j, rows in enumerate(_own_rows(batch)):
        if distinct is not None:
            run = lambda name, fn, j=j, rows=rows: distinct.run(f"{name}{j}", fn, rows, batch, views[j])  # noqa: E731
        else:
            sub, stages = (batch, views[j]) if j == 0 else (batch.take(rows), views[j].take(rows))
            run = lambda name, fn, sub=sub, stages=stages: fn(sub, stages)  # noqa: E731
        totals.append(_memory_total(p, run))
    return np.max(np.stack(_views_of(batch, totals)), axis=0)


def _cost_time(p: Problem, valid: LayoutBatch, views: list[Stages], peak: np.ndarray, fit: np.ndarray,
               distinct: Distinct | None) -> StepCosts:
    """:func:`autopar.cost.step.combine` of the ``valid`` rows at ``fit`` (``views``: the valid
    rows' stage views; ``peak``: the fitting rows' peaks) with each view timed on its own rows."""
    batch = valid if len(fit) == len(valid) else valid.take(fit)  # fit: increasing row indices
    parts = []  # per view: (StageTime, dp, opt) on its own rows
    for j, rows in enumerate(_own_rows(batch)):
        sub, stages = batch.take(rows), views[j].take(fit[rows])
        run = None if distinct is None else (
            lambda name, fn, j=j, rows=fit[rows]: distinct.run(f"{name}{j}", fn, rows, valid, views[j]))
        parts.append(view_time(p, sub, stages, run))
    return combine_views(p, batch, parts, peak)


def combine_views(p: Problem, batch: LayoutBatch, parts: list[tuple], peak: np.ndarray) -> StepCosts:
    """:func:`autopar.cost.step.combine` of ``batch`` from each view's ``(StageTime, dp seconds,
    optimizer seconds)`` on its own rows (:func:`_own_rows`; ``parts``, one per view) and the
    layouts' ``peak`` bytes."""
    names = [f.name for f in fields(T.StageTime)]
    full = {name: _views_of(batch, [getattr(t, name) for t, _, _ in parts]) for name in names}
    times = [T.StageTime(**{name: full[name][j] for name in names}) for j in range(3)]
    dp = _views_of(batch, [d for _, d, _ in parts])
    opt = _views_of(batch, [o for _, _, o in parts])
    return combine(p, batch, view_counts(batch), times, dp, opt, peak, [])


def _bounding_stages(p: Problem, batch: LayoutBatch, distinct: Distinct | None) -> list[Stages]:
    """:func:`bounding_stages` of ``batch``, computed once per block where ``distinct`` knows the
    blocks (a layout's stages depend on its block only: pp and the embedding/loss accounting)."""
    if distinct is None:
        return bounding_stages(p, batch)
    first, inverse = distinct.per_block()
    return [v.take(inverse) for v in bounding_stages(p, batch.take(first))]


def search_costs(p: Problem, batch: LayoutBatch, capacity_bytes: float, keys: np.ndarray | None = None,
                 reads: dict[str, frozenset[str]] | None = None) -> StepCosts:
    """Step costs of the search's layouts (``(n,)`` arrays): the peak memory of every layout, the
    step time, breakdown, tokens/s per device and MFU of those whose peak is at most
    ``capacity_bytes`` (``inf`` / ``nan`` for the others; see the module docstring). ``memory`` is
    empty (the search keeps only the peak). ``keys`` (:attr:`ValidSpace.keys`): cost each term once
    per distinct key of what it reads (:class:`autopar.search.distinct.Distinct`, sharing ``reads``)."""
    distinct = None if keys is None else Distinct(keys, reads)
    views = _bounding_stages(p, batch, distinct)
    peak = _cost_memory(p, batch, views, distinct)
    fit = np.flatnonzero(peak <= capacity_bytes)
    n = len(batch)
    step = np.full(n, np.inf)
    breakdown = {key: np.full(n, np.nan) for key in TIME_KEYS}
    tps, mfu = np.full(n, np.nan), np.full(n, np.nan)
    if len(fit):
        costs = _cost_time(p, batch, views, peak[fit], fit, distinct)
        step[fit], tps[fit], mfu[fit] = costs.step_time_s, costs.tokens_per_s_per_device, costs.mfu
        for key, value in costs.time_breakdown_s.items():
            breakdown.setdefault(key, np.full(n, np.nan))[fit] = value
    return StepCosts(step, breakdown, peak, [], tps, mfu)
