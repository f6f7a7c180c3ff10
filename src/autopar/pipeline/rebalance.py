"""Re-balance the stages of a ranked layout for ``autopar search``.

The grid search costs every layout under Megatron's default split. For the few that reach the
top k, :func:`rebalance_estimate` asks the balancer for the best split Megatron-LM can express
(``--decoder-first/last-pipeline-num-layers``, equal middle stages; the layout's own recompute
setting, since Megatron has one for all stages) under the memory limit, re-estimates it
(the uneven split's makespan is simulated) and keeps whichever of the two is better.
"""

from __future__ import annotations

import numpy as np

from autopar.errors import AutoparError
from autopar.estimate import Estimate, estimate
from autopar.pipeline.folded import fold
from autopar.pipeline.layers import layer_table
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.split import megatron_split
from autopar.problem import Problem
from autopar.strategy import Strategy


def balanced_strategy(p: Problem, s: Strategy, memory_limit_bytes: float) -> Strategy | None:
    """``s`` with the balanced Megatron-expressible split, or None when there is nothing to
    balance (pp = 1, partial full recompute ``recompute_layers``, vpp not dividing the layers),
    no split fits, or the best split is the one ``s`` already has."""
    if s.pp == 1 or s.recompute_layers is not None:
        return None
    m = s.num_microbatches(p.train.global_batch_size)
    table = layer_table(p, s, memory_limit_bytes)
    try:
        folded = fold(table, s.vpp, in_flight_chunks(s.schedule, s.pp, s.vpp, m) / s.vpp)
    except AutoparError:
        return None
    bounds = megatron_split(folded, table.option_index(s.recompute))
    if bounds is None:
        return None
    split = tuple(int(n) * s.vpp for n in np.diff(bounds))
    return None if split == s.layers_per_stage else s.model_copy(update={"layers_per_stage": split})


def _rank_key(e: Estimate) -> tuple[bool, bool, float]:
    return (not e.fits, e.marginal, e.step_time_s)


def rebalance_estimate(p: Problem, e: Estimate, memory_margin: float) -> Estimate:
    """The better (fits, then not marginal, then faster) of ``e`` and its re-balanced layout.

    The memory limit is ``(1 - memory_margin)`` of the device unless ``e`` is already
    marginal, so re-balancing never turns a comfortable layout into a marginal one.
    """
    capacity = p.cluster.device.memory_bytes
    limit = capacity if e.marginal else (1 - memory_margin) * capacity
    balanced = balanced_strategy(p, e.strategy, limit)
    if balanced is None:
        return e
    other = estimate(p, balanced, memory_margin)
    return other if _rank_key(other) < _rank_key(e) else e


def rank(layouts: list[Estimate]) -> list[Estimate]:
    """Layouts that fit first, comfortable before marginal, each by step time."""
    return sorted(layouts, key=_rank_key)
