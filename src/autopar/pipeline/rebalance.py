"""Re-balance the stages of a ranked layout for ``autopar search``.

The grid search costs every layout under Megatron's default split and one recompute option.
For the few that reach the top k, :func:`rebalance_estimate` asks the balancer for a better
split under the memory limit, re-estimates it (uneven stages are simulated) and keeps whichever
is better. What "better split" may mean depends on the framework the result must run on
unchanged (``target``, an ``autopar export`` format):

* ``deepspeed``: no re-balancing; Megatron-DeepSpeed's pipeline splits by transformer-layer
  count only (:data:`EVEN_SPLIT_TARGETS`, :func:`autopar.export.deepspeed.refusal_reason`).
  Nor for torchtitan's V schedules (ZB-V, DualPipeV: :data:`autopar.strategy.V_SCHEDULE_NAMES`),
  whose two chunks per rank must be equal (:mod:`autopar.rules`).
* ``megatron``, ``mindspeed``, ``torchtitan`` (one recompute setting for all
  stages): the best split Megatron-LM can express (``--decoder-first/last-pipeline-num-layers``,
  equal middle stages) with the layout's own recompute option
  (:func:`autopar.pipeline.split.megatron_split`).
* ``sapp``, ``galvatron`` (per-stage recompute, any split;
  :data:`autopar.export.per_stage.PER_STAGE_OPTIONS`): the exact best split for each allowed
  recompute option (:func:`autopar.pipeline.split.dp_split`), the exact min-max split with a
  recompute option per stage (:func:`autopar.pipeline.split.min_max_split`), then the integer
  program choosing split and per-stage recompute together for the surrogate step time
  (:mod:`autopar.pipeline.ilp`) when a lower bound shows it could still gain (see
  :func:`per_stage_candidates`). The best uniform and the best mixed candidate are both
  re-estimated with the simulated makespan, and the faster is kept.

Layer tables depend on the shard shape, not on the recompute option or split, so one table per
distinct shape is built and reused across the top k (:class:`TableCache`); the top k's tables are
built in one pass (:meth:`TableCache.fill`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autopar.errors import AutoparError
from autopar.estimate import Estimate, estimate_many
from autopar.export.per_stage import PER_STAGE_OPTIONS
from autopar.pipeline import ilp
from autopar.pipeline.folded import FoldedTable, fold, surrogate_s
from autopar.pipeline.layers import LayerTable, layer_table, layer_tables
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.split import dp_split, megatron_split, min_max_split
from autopar.problem import Problem
from autopar.strategy import V_SCHEDULE_NAMES, Strategy, simplicity_key

TARGETS: tuple[str, ...] = ("megatron", "megatron-bridge", "mindspeed", "torchtitan", "deepspeed", "galvatron", "sapp")
EVEN_SPLIT_TARGETS: tuple[str, ...] = ("deepspeed",)  # formats that cannot write an uneven split
ILP_TIME_LIMIT_S = 0.25  # per layout; HiGHS keeps its best answer when the limit cuts the search (machine-dependent)
# Run the ILP only if it could gain more than 1% of the surrogate step time: the min-max split is
# exact for the (m - 1) * slowest term, so the ILP can only trade the smaller sum term, and 1% is
# below the cost model's accuracy (see the README's Accuracy section).
ILP_GAP = 0.01


class TableCache:
    """Layer tables keyed by the layout with its recompute, split and dp-independent fields
    cleared, and the memory limit (one table per distinct shard shape)."""

    def __init__(self) -> None:
        self._tables: dict[tuple, LayerTable] = {}

    def __len__(self) -> int:
        return len(self._tables)

    @staticmethod
    def _key(s: Strategy, memory_limit_bytes: float) -> tuple:
        shape = s.model_copy(update={"recompute": "none", "recompute_layers": None, "layers_per_stage": None,
                                     "recompute_per_stage": None})
        return shape, float(memory_limit_bytes)

    def get(self, p: Problem, s: Strategy, memory_limit_bytes: float) -> LayerTable:
        """The layer table of ``s`` (see :func:`autopar.pipeline.layers.layer_table`)."""
        key = self._key(s, memory_limit_bytes)
        if key not in self._tables:
            self._tables[key] = layer_table(p, *key)
        return self._tables[key]

    def fill(self, p: Problem, wanted: list[tuple[Strategy, float]]) -> None:
        """Build the missing tables of ``wanted`` (layout, memory limit) pairs in one pass
        (:func:`autopar.pipeline.layers.layer_tables`); :meth:`get` then finds them."""
        keys = list(dict.fromkeys(key for s, limit in wanted if (key := self._key(s, limit)) not in self._tables))
        for key, table in zip(keys, layer_tables(p, [shape for shape, _ in keys], [limit for _, limit in keys])):
            self._tables[key] = table


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
    # A balanced split is a --decoder-first/last one: it replaces an embedding/loss-aware split.
    fields.update(layers_per_stage=split, recompute=None, recompute_layers=None, recompute_per_stage=options,
                  account_for_embedding=False, account_for_loss=False, pipeline_layout=None)
    return Strategy.model_validate(fields)


def balanced_strategy(p: Problem, s: Strategy, memory_limit_bytes: float, cache: TableCache | None = None
                      ) -> Strategy | None:
    """``s`` with the balanced Megatron-expressible split, or None when there is nothing to
    balance (pp = 1, partial full recompute ``recompute_layers``, recompute per stage, vpp not
    dividing the layers), no split fits, or the best split is the one ``s`` already has."""
    if s.pp == 1 or s.recompute_layers is not None or s.recompute_per_stage:
        return None
    table = (TableCache() if cache is None else cache).get(p, s, memory_limit_bytes)
    folded = _folded(p, s, table)
    if folded is None:
        return None
    bounds = megatron_split(folded, table.option_index(s.recompute))
    if bounds is None:
        return None
    split = tuple(int(n) * s.vpp for n in np.diff(bounds))
    if split == s.layers_per_stage:
        return None
    # A balanced split is a --decoder-first/last one: it replaces an embedding/loss-aware split.
    return s.model_copy(update={"layers_per_stage": split, "account_for_embedding": False, "account_for_loss": False,
                                "pipeline_layout": None})


def per_stage_candidates(p: Problem, s: Strategy, memory_limit_bytes: float, options: tuple[str, ...],
                         cache: TableCache | None = None, use_ilp: bool = True) -> list[Strategy]:
    """Up to two re-balanced layouts of ``s`` for a target with per-stage recompute: the best
    uniform one (any split, one of ``options``) and, when it beats that, the best split with a
    recompute option per stage (whole stages: a layout's partial ``recompute_layers`` is
    replaced). Empty when there is nothing to balance or no split fits.

    By the surrogate step time (:func:`autopar.pipeline.folded.surrogate_s`,
    ``(m - 1) * slowest + sum / vpp``): if the fastest option fits everywhere on its own best
    split, that split is optimal. Otherwise the candidates are the exact best split for each
    option (:func:`dp_split`) and the exact min-max split with per-stage options
    (:func:`min_max_split`); no layout beats ``(m - 1) * T* + S / vpp`` (``T*`` that min-max
    optimum, ``S`` the sum with the fastest option everywhere), so the integer program
    (:mod:`autopar.pipeline.ilp`) only runs when the best candidate is more than
    :data:`ILP_GAP` above that bound (and ``use_ilp``).
    """
    if s.pp == 1:
        return []
    table = (TableCache() if cache is None else cache).get(p, s, memory_limit_bytes)
    folded = _folded(p, s, table)
    if folded is None:
        return []
    m, pp, ranks = s.num_microbatches(p.train.global_batch_size), s.pp, np.arange(s.pp)
    indices = np.array([table.option_index(name) for name in options])

    def score(bounds: np.ndarray, chosen: np.ndarray) -> float:
        return float(surrogate_s(folded.rank_time_s(ranks, bounds[:-1], bounds[1:], chosen), m, s.vpp))

    def layout(bounds: np.ndarray, chosen: np.ndarray) -> Strategy:
        return _with(s, bounds, tuple(table.options[r] for r in chosen))

    fastest = int(indices[np.argmin(table.layer_time_s[:, indices].sum(axis=0))])
    free = dp_split(replace(folded, memory_limit_bytes=np.inf), fastest)  # memory ignored
    if free is None:
        return []
    if folded.rank_bytes(ranks, free[:-1], free[1:], fastest).max() <= folded.memory_limit_bytes:
        return [layout(free, np.full(pp, fastest))]  # fits: nothing can be faster
    mixed = min_max_split(folded, indices)
    if mixed is None:
        return []  # no split fits with any mix of options
    uniform = [(score(b, np.full(pp, r)), b, np.full(pp, r)) for r in indices
               if (b := dp_split(folded, int(r))) is not None]
    best_uniform = min(uniform, key=lambda item: item[0]) if uniform else (np.inf, None, None)
    best = min([best_uniform, (score(*mixed), *mixed)], key=lambda item: item[0])
    slowest = folded.rank_time_s(ranks, mixed[0][:-1], mixed[0][1:], mixed[1]).max()
    lowest_sum = (np.diff(folded.time_s[:, indices], axis=0).min(axis=1).sum()
                  + folded.stage_time_s[:, indices].min(axis=1).sum())
    lower = (m - 1) * slowest + lowest_sum / s.vpp
    if use_ilp and len(indices) > 1 and best[0] > lower * (1 + ILP_GAP):
        result = ilp.solve(folded, indices, m, s.vpp, best[0], ILP_TIME_LIMIT_S)
        if result.bounds is not None and score(result.bounds, result.options) < best[0]:
            best = (score(result.bounds, result.options), result.bounds, result.options)
    out = [layout(best_uniform[1], best_uniform[2])] if uniform else []
    if best[0] < best_uniform[0]:
        out.append(layout(best[1], best[2]))
    return out


def _rank_key(e: Estimate) -> tuple:
    """Fits first, comfortable before marginal, then step time (to the microsecond), then the
    simpler layout (:func:`autopar.strategy.simplicity_key`)."""
    return (not e.fits, e.marginal, round(e.step_time_s, 6), simplicity_key(e.strategy))


def rebalance_estimate(p: Problem, e: Estimate, memory_margin: float, target: str = "megatron",
                       cache: TableCache | None = None, use_ilp: bool = True) -> Estimate:
    """The best (fits, then not marginal, then faster) of ``e`` and its re-balanced layouts for
    ``target``: :func:`rebalance_many` for one layout.

    Raises:
        AutoparError: ``target`` is not one of :data:`TARGETS`.
    """
    return rebalance_many(p, [e], memory_margin, target, cache, use_ilp)[0]


def rebalance_many(p: Problem, estimates: list[Estimate], memory_margin: float, target: str = "megatron",
                   cache: TableCache | None = None, use_ilp: bool = True) -> list[Estimate]:
    """For each of ``estimates``, the best (fits, then not marginal, then faster) of it and its
    re-balanced layouts for ``target`` (see the module docstring; ``use_ilp``: see
    :func:`per_stage_candidates`). The candidates of all layouts are costed together
    (:func:`autopar.estimate.estimate_many`: one pipeline simulation per shape).

    The memory limit is ``(1 - memory_margin)`` of the device unless a layout is already
    marginal, so re-balancing never turns a comfortable layout into a marginal one.

    Raises:
        AutoparError: ``target`` is not one of :data:`TARGETS`.
    """
    if target not in TARGETS:
        raise AutoparError(f"target={target!r}: allowed {', '.join(TARGETS)}")
    capacity = p.cluster.device.memory_bytes
    cache = TableCache() if cache is None else cache  # an empty cache is falsy (__len__): keep the caller's
    limits = [capacity if e.marginal else (1 - memory_margin) * capacity for e in estimates]
    # the tables the loop below reads (the conditions of balanced_strategy / per_stage_candidates), built together
    cache.fill(p, [(e.strategy, limit) for e, limit in zip(estimates, limits)
                   if target not in EVEN_SPLIT_TARGETS and e.strategy.schedule not in V_SCHEDULE_NAMES
                   and e.strategy.pp > 1 and (target in PER_STAGE_OPTIONS or (
                       e.strategy.recompute_layers is None and not e.strategy.recompute_per_stage))])
    owners, candidates = [], []  # the index in ``estimates`` of each candidate layout
    for k, (e, limit) in enumerate(zip(estimates, limits)):
        if target in EVEN_SPLIT_TARGETS or e.strategy.schedule in V_SCHEDULE_NAMES:
            found = []
        elif target in PER_STAGE_OPTIONS:
            found = per_stage_candidates(p, e.strategy, limit, PER_STAGE_OPTIONS[target], cache, use_ilp)
        else:
            found = [c for c in [balanced_strategy(p, e.strategy, limit, cache)] if c is not None]
        fresh = [s for s in found if s != e.strategy]
        owners += [k] * len(fresh)
        candidates += fresh
    best = list(estimates)
    for k, other in zip(owners, estimate_many(p, candidates, memory_margin) if candidates else []):
        best[k] = other if _rank_key(other) < _rank_key(best[k]) else best[k]
    return best


def rank(layouts: list[Estimate]) -> list[Estimate]:
    """Layouts that fit first, comfortable before marginal, each by step time, ties to the
    simpler layout."""
    return sorted(layouts, key=_rank_key)
