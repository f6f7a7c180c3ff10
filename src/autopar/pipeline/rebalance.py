"""Re-balance the stages of a ranked layout for ``autopar search``.

The grid search costs every layout under Megatron's default split and one recompute option.
For the few that reach the top k, :func:`rebalance_estimate` asks the balancer for a better
split under the memory limit, re-estimates it (uneven stages are simulated) and keeps whichever
is better. What "better split" may mean depends on the framework the result must run on
unchanged (``target``, an ``autopar export`` format):

* ``megatron``, ``mindspeed``, ``torchtitan``, ``deepspeed`` (one recompute setting for all
  stages): the best split Megatron-LM can express (``--decoder-first/last-pipeline-num-layers``,
  equal middle stages) with the layout's own recompute option
  (:func:`autopar.pipeline.split.megatron_split`).
* ``sapp``, ``galvatron`` (per-stage recompute, any split;
  :data:`autopar.export.per_stage.PER_STAGE_OPTIONS`): the exact best split for each allowed
  recompute option (:func:`autopar.pipeline.split.dp_split`), then the integer program choosing
  split and per-stage recompute together (:mod:`autopar.pipeline.ilp`) when a lower bound
  shows a mix could still win. The best uniform and the best mixed candidate (by the surrogate
  of :func:`autopar.pipeline.folded.surrogate_s`) are both re-estimated with the simulated
  makespan, and the faster is kept.

Layer tables depend on the shard shape, not on the recompute option or split, so one table per
distinct shape is built and reused across the top k (:class:`TableCache`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autopar.errors import AutoparError
from autopar.estimate import Estimate, estimate
from autopar.export.per_stage import PER_STAGE_OPTIONS
from autopar.pipeline import ilp
from autopar.pipeline.folded import FoldedTable, fold, surrogate_s
from autopar.pipeline.layers import LayerTable, layer_table
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.split import dp_split, megatron_split
from autopar.problem import Problem
from autopar.strategy import Strategy

TARGETS: tuple[str, ...] = ("megatron", "mindspeed", "torchtitan", "deepspeed", "galvatron", "sapp")
ILP_TIME_LIMIT_S = 0.5  # per layout; the ILP only runs when the lower bound leaves room for a mix


class TableCache:
    """Layer tables keyed by the layout with its recompute, split and dp-independent fields
    cleared, and the memory limit (one table per distinct shard shape)."""

    def __init__(self) -> None:
        self._tables: dict[tuple, LayerTable] = {}

    def get(self, p: Problem, s: Strategy, memory_limit_bytes: float) -> LayerTable:
        """The layer table of ``s`` (see :func:`autopar.pipeline.layers.layer_table`)."""
        shape = s.model_copy(update={"recompute": "none", "recompute_layers": None, "layers_per_stage": None,
                                     "recompute_per_stage": None})
        key = (shape, float(memory_limit_bytes))
        if key not in self._tables:
            self._tables[key] = layer_table(p, shape, memory_limit_bytes)
        return self._tables[key]


def _folded(p: Problem, s: Strategy, table: LayerTable) -> FoldedTable | None:
    m = s.num_microbatches(p.train.global_batch_size)
    try:
        return fold(table, s.vpp, in_flight_chunks(s.schedule, s.pp, s.vpp, m) / s.vpp)
    except AutoparError:
        return None


def _with(s: Strategy, bounds: np.ndarray, options: tuple[str, ...]) -> Strategy:
    """``s`` with the split ``bounds`` (over folded positions) and per-stage ``options``."""
    split = tuple(int(n) * s.vpp for n in np.diff(bounds))
    fields = s.model_dump()
    fields.update(layers_per_stage=split, recompute=None, recompute_layers=None, recompute_per_stage=options)
    return Strategy.model_validate(fields)


def balanced_strategy(p: Problem, s: Strategy, memory_limit_bytes: float, cache: TableCache | None = None
                      ) -> Strategy | None:
    """``s`` with the balanced Megatron-expressible split, or None when there is nothing to
    balance (pp = 1, partial full recompute ``recompute_layers``, recompute per stage, vpp not
    dividing the layers), no split fits, or the best split is the one ``s`` already has."""
    if s.pp == 1 or s.recompute_layers is not None or s.recompute_per_stage:
        return None
    table = (cache or TableCache()).get(p, s, memory_limit_bytes)
    folded = _folded(p, s, table)
    if folded is None:
        return None
    bounds = megatron_split(folded, table.option_index(s.recompute))
    if bounds is None:
        return None
    split = tuple(int(n) * s.vpp for n in np.diff(bounds))
    return None if split == s.layers_per_stage else s.model_copy(update={"layers_per_stage": split})


def per_stage_candidates(p: Problem, s: Strategy, memory_limit_bytes: float, options: tuple[str, ...],
                         cache: TableCache | None = None) -> list[Strategy]:
    """Up to two re-balanced layouts of ``s`` for a target with per-stage recompute: the best
    uniform one (any split, one of ``options``) and, if the integer program finds one that
    beats it, the best split with a recompute option per stage (whole stages: a layout's partial
    ``recompute_layers`` is replaced). Empty when there is nothing to balance or no split fits.

    The lower bound is the fastest option on every stage with memory ignored (no split or
    mix is faster: every option's time is at least the fastest one's); when that split fits,
    or the best uniform split reaches the bound, nothing else is tried.
    """
    if s.pp == 1:
        return []
    table = (cache or TableCache()).get(p, s, memory_limit_bytes)
    folded = _folded(p, s, table)
    if folded is None:
        return []
    m, pp, ranks = s.num_microbatches(p.train.global_batch_size), s.pp, np.arange(s.pp)
    indices = np.array([table.option_index(name) for name in options])

    def score(bounds: np.ndarray, chosen: np.ndarray) -> float:
        return float(surrogate_s(folded.rank_time_s(ranks, bounds[:-1], bounds[1:], chosen), m, s.vpp))

    fastest = int(indices[np.argmin(table.layer_time_s[:, indices].sum(axis=0))])
    free = dp_split(replace(folded, memory_limit_bytes=np.inf), fastest)  # the lower bound: memory ignored
    if free is None:
        return []
    if folded.rank_bytes(ranks, free[:-1], free[1:], fastest).max() <= folded.memory_limit_bytes:
        return [_with(s, free, (table.options[fastest],) * pp)]  # the bound is reached: nothing can beat it
    lower = score(free, np.full(pp, fastest))
    uniform = []
    for r in indices:
        bounds = dp_split(folded, int(r))
        if bounds is not None:
            uniform.append((score(bounds, np.full(pp, r)), bounds, np.full(pp, r)))
    if not uniform:
        return []
    best_score, bounds, chosen = min(uniform, key=lambda item: item[0])
    out = [_with(s, bounds, tuple(table.options[r] for r in chosen))]
    if len(indices) > 1 and best_score > lower * (1 + 1e-9):
        result = ilp.solve(folded, indices, m, s.vpp, best_score, ILP_TIME_LIMIT_S)
        if result.bounds is not None and score(result.bounds, result.options) < best_score:
            out.append(_with(s, result.bounds, tuple(table.options[r] for r in result.options)))
    return out


def _rank_key(e: Estimate) -> tuple[bool, bool, float]:
    return (not e.fits, e.marginal, e.step_time_s)


def rebalance_estimate(p: Problem, e: Estimate, memory_margin: float, target: str = "megatron",
                       cache: TableCache | None = None) -> Estimate:
    """The best (fits, then not marginal, then faster) of ``e`` and its re-balanced layouts for
    ``target`` (see the module docstring).

    The memory limit is ``(1 - memory_margin)`` of the device unless ``e`` is already
    marginal, so re-balancing never turns a comfortable layout into a marginal one.

    Raises:
        AutoparError: ``target`` is not one of :data:`TARGETS`.
    """
    if target not in TARGETS:
        raise AutoparError(f"target={target!r}: allowed {', '.join(TARGETS)}")
    capacity = p.cluster.device.memory_bytes
    limit = capacity if e.marginal else (1 - memory_margin) * capacity
    cache = cache or TableCache()
    if target in PER_STAGE_OPTIONS:
        candidates = per_stage_candidates(p, e.strategy, limit, PER_STAGE_OPTIONS[target], cache)
    else:
        candidates = [c for c in [balanced_strategy(p, e.strategy, limit, cache)] if c is not None]
    best = e
    for s in candidates:
        if s != e.strategy:
            other = estimate(p, s, memory_margin)
            best = other if _rank_key(other) < _rank_key(best) else best
    return best


def rank(layouts: list[Estimate]) -> list[Estimate]:
    """Layouts that fit first, comfortable before marginal, each by step time."""
    return sorted(layouts, key=_rank_key)
