"""Pipeline splits (Galvatron's ``pp_division``) the layer-wise search tries besides the default one.

Galvatron-BMW (Wang et al., "Improving Automatic Parallel Training via Balanced Memory Workload
Optimization", TPDS 2024, arXiv 2307.02031) balances the pipeline partition for two objectives,
memory and time (its "bi-objective optimization workflow that focuses on workload balance"); Galvatron
2.4.0 ships the memory side (``search_engine.py`` ``pp_division_memory_balanced``, used for models
with several layer types; one layer type gets ``pp_division_even``). autopar's reading: start from
the memory-balanced partition (each stage's least memory as equal as possible) and move layers
towards the time-balanced one (each stage's per-micro-batch time as equal as possible, which bounds
the 1F1B makespan ``sum_i t_i + (m - 1) max_i t_i``), keeping every partition on the way as a
candidate, since the fastest plan within memory may sit anywhere between the two.

Both ends are min-max partitions of the layers into ``pp`` contiguous non-empty stages
(:func:`min_max_split`), from the per-layer costs of a cell's pair tables
(:class:`autopar.layerwise.tables.PairTable`, which do not depend on the split): time = each
layer's fastest per-micro-batch time plus the stage's fixed part (embedding on the first, output
layer and loss on the last) at the fastest vocabulary option; memory = the bytes of each layer's
fastest choice with the stage's 1F1B in-flight micro-batches (``min(pp - i, m)`` on stage ``i``:
the memory balance therefore gives the first stages fewer layers) plus the fixed part's bytes at that
vocabulary option; the layer's fastest choice is what the per-stage DP takes where memory allows, so
this is the split under which the fastest plan is most likely to fit.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from autopar.layerwise.tables import PairTable


def min_max_split(cost: np.ndarray, fixed: np.ndarray) -> tuple[int, ...]:
    """The contiguous split of ``L`` layers into ``pp`` non-empty stages that minimises
    ``max_i c_i``, ``c_i = fixed[i] + sum of cost[i, l] over stage i's layers``, by dynamic
    programming over (stage, last layer) in ``O(pp L^2)``; among splits of that maximum the
    programme keeps, per state, the least ``sum_i c_i^2`` (the most even; exact for the maximum, a
    heuristic for the tie).

    Args:
        cost: ``(pp, L)`` cost of each layer if placed on stage ``i`` (any unit).
        fixed: ``(pp,)`` the stage's own cost.

    Raises:
        ValueError: ``pp`` > ``L`` or shapes that disagree.
    """
    cost, fixed = np.asarray(cost, dtype=np.float64), np.asarray(fixed, dtype=np.float64)
    pp, n = cost.shape
    if fixed.shape != (pp,) or not 1 <= pp <= n:
        raise ValueError(f"cost {cost.shape} and fixed {fixed.shape}: need (pp, L) and (pp,) with 1 <= pp <= L")
    prefix = np.concatenate([np.zeros((pp, 1)), np.cumsum(cost, axis=1)], axis=1)  # (pp, L + 1)
    j, k = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    first = prefix[0] + fixed[0]  # stage 0 holds layers [0, k)
    worst = np.where(np.arange(n + 1) >= 1, first, np.inf)
    squares = np.where(np.arange(n + 1) >= 1, first ** 2, np.inf)
    back = np.zeros((pp, n + 1), dtype=np.int64)
    cols = np.arange(n + 1)
    for i in range(1, pp):
        span = prefix[i][None, :] - prefix[i][:, None] + fixed[i]  # (j, k): stage i holds layers [j, k)
        cand = np.where(j < k, np.maximum(worst[:, None], span), np.inf)
        least = cand.min(axis=0)
        even = np.where(cand <= least * (1 + 1e-12), squares[:, None] + span ** 2, np.inf)
        back[i] = np.argmin(even, axis=0)
        worst, squares = cand[back[i], cols], even[back[i], cols]
    ends, k_end = [n], n
    for i in range(pp - 1, 0, -1):
        k_end = int(back[i, k_end])
        ends.append(k_end)
    bounds = [0] + ends[::-1]
    return tuple(int(b - a) for a, b in pairwise(bounds))


def path(start: tuple[int, ...], end: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The splits from ``start`` to ``end`` moving one layer at a time across the boundary that most
    lags (Galvatron-BMW's step from the memory-balanced towards the time-balanced partition), both
    ends included. Example: (9, 11) -> (11, 9) gives (9, 11), (10, 10), (11, 9)."""
    out, cur = [tuple(start)], list(start)
    while tuple(cur) != tuple(end):
        # boundaries as cumulative layer counts; move the one furthest from its target by one layer
        c, e = np.cumsum(cur)[:-1], np.cumsum(end)[:-1]
        b = int(np.argmax(np.abs(e - c)))
        step = 1 if e[b] > c[b] else -1
        cur[b] += step
        cur[b + 1] -= step
        out.append(tuple(cur))
    return out


MAX_SPLITS = 5  # splits kept per cell: both ends and evenly spaced steps between them


def balanced_splits(tables: dict[tuple[int, int, bool], PairTable], vocab_keys: list[tuple[int, int, bool]],
                    m: int) -> list[tuple[int, ...]]:
    """Galvatron-BMW's candidate splits of one (pp, m) cell: the memory-balanced split, the
    time-balanced one and, of the one-layer steps between them (:func:`path`), evenly spaced ones
    up to :data:`MAX_SPLITS` in all (module docstring).

    Args:
        tables: the cell's pair tables, ``(tp, zero, ulysses) -> PairTable`` (any split: per-layer and
            per-stage-index costs do not depend on it).
        vocab_keys: the (tp, zero, False) options of the vocabulary.
        m: micro-batches per step (sets each stage's in-flight micro-batches).
    """
    pairs = list(tables.values())
    pp, n = len(pairs[0].in_flight), len(pairs[0].static_bytes)
    in_flight = np.minimum(pp - np.arange(pp), m).astype(np.float64)
    # each layer's fastest choice (no recompute): its time, and the memory it needs on each stage
    times = np.stack([t.microbatch_s[:, 0] for t in pairs])  # (P, L)
    fastest = np.argmin(times, axis=0)
    layer_t = times[fastest, np.arange(n)]
    layer_mem = np.stack([pairs[q].static_bytes[l] + in_flight * pairs[q].activation_bytes[l, 0]
                          for l, q in enumerate(fastest)], axis=1)  # (pp, L)
    vocab = np.argmin([tables[k].stage_microbatch_s[:, 0].sum() for k in vocab_keys])  # the fastest vocabulary
    fixed = tables[vocab_keys[int(vocab)]]
    by_time = min_max_split(np.broadcast_to(layer_t, (pp, n)), fixed.stage_microbatch_s[:, 0])
    by_memory = min_max_split(layer_mem, fixed.stage_bytes[:, 0])
    steps = path(by_memory, by_time)
    picks = np.unique(np.round(np.linspace(0, len(steps) - 1, min(len(steps), MAX_SPLITS))).astype(int))
    return [steps[i] for i in picks]
