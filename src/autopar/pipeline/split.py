"""Contiguous layer splits with one recompute option: an exact DP and Megatron's split family.

Both return stage boundaries ``bounds`` of shape ``(pp + 1,)`` over the positions of a
:class:`~autopar.pipeline.folded.FoldedTable` (``bounds[0] = 0``, ``bounds[pp] = K``, every
stage non-empty), or ``None`` when no split fits the memory limit.

* :func:`dp_split`: the classic min-max linear partition DP over prefix sums (Bokhari 1988;
  the form used by PipeDream's planner, Narayanan et al., SOSP'19, sec. 3.1), with the memory
  limit per stage. Exact minimum of the slowest stage; ties go to the smaller peak memory.
  ``O(pp * K^2)``, vectorised per stage. :func:`min_max_split` is the same DP letting each
  stage take the fastest of several recompute options that fits (``O(R * pp * K^2)``).
* :func:`megatron_split`: the splits Megatron-LM can express with
  ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` (equal middle
  stages, any first and last), enumerated exhaustively.
"""

from __future__ import annotations

import numpy as np

from autopar.pipeline.folded import FoldedTable


def dp_split(table: FoldedTable, option: int) -> np.ndarray | None:
    """Split minimising the slowest rank's time under the memory limit with one option (exact)."""
    found = min_max_split(table, np.array([option]))
    return None if found is None else found[0]


def min_max_split(table: FoldedTable, options: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Split and per-rank option (among column indices ``options``) minimising the slowest
    rank's time under the memory limit: ``(bounds, chosen)`` of shapes ``(pp + 1,)`` and
    ``(pp,)``, or None when nothing fits. Exact for that bottleneck (each rank takes the
    fastest option that fits its range, ties to the smaller memory); ties between splits go to
    the smaller peak memory."""
    positions, pp = table.positions, table.pp
    start = np.arange(positions + 1)[:, None]
    end = np.arange(positions + 1)[None, :]
    ordered = start < end
    limit = table.memory_limit_bytes
    # Range sums over [start, end) are the same for every rank; only the fixed parts differ.
    span_static = table.static_bytes[end] - table.static_bytes[start]
    spans = [(int(o), table.time_s[end, o] - table.time_s[start, o],
              table.activation_bytes[end, o] - table.activation_bytes[start, o]) for o in options]

    def stage(rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        best_t = np.full(ordered.shape, np.inf)
        best_m = np.full(ordered.shape, np.inf)
        best_o = np.zeros(ordered.shape, dtype=np.int64)
        for option, span_time, span_act in spans:
            time = span_time + table.stage_time_s[rank, option]
            mem = span_static + table.in_flight[rank] * span_act + table.stage_bytes[rank, option]
            time = np.where(ordered & (mem <= limit), time, np.inf)
            better = (time < best_t) | ((time == best_t) & (mem < best_m))
            best_t, best_m = np.where(better, time, best_t), np.where(better, mem, best_m)
            best_o = np.where(better, option, best_o)
        return best_t, best_m, best_o

    time, mem, opt = stage(0)
    picked = [opt]
    best_t, best_m = time[0].copy(), mem[0].copy()
    back = np.zeros((pp, positions + 1), dtype=np.int64)
    columns = np.arange(positions + 1)
    for rank in range(1, pp):
        time, mem, opt = stage(rank)
        picked.append(opt)
        cand_t = np.maximum(best_t[:, None], time)
        cand_m = np.maximum(best_m[:, None], mem)
        low = cand_t.min(axis=0)
        tie = cand_t <= low * (1 + 1e-12)
        choice = np.argmin(np.where(tie, cand_m, np.inf), axis=0)
        back[rank] = choice
        best_t, best_m = low, cand_m[choice, columns]
    if not np.isfinite(best_t[positions]):
        return None
    bounds = np.zeros(pp + 1, dtype=np.int64)
    bounds[pp] = positions
    for rank in range(pp - 1, 0, -1):
        bounds[rank] = back[rank, bounds[rank + 1]]
    return bounds, np.array([picked[r][bounds[r], bounds[r + 1]] for r in range(pp)])


def megatron_bounds(positions: int, pp: int) -> np.ndarray:
    """Every Megatron-expressible split, shape ``(n, pp + 1)``: ``first, middle * (pp - 2), last``
    with each part >= 1."""
    if pp == 1:
        return np.array([[0, positions]])
    if pp == 2:
        first = np.arange(1, positions)
        return np.stack([np.zeros_like(first), first, np.full_like(first, positions)], axis=1)
    rows = []
    for middle in range(1, (positions - 2) // (pp - 2) + 1):
        first = np.arange(1, positions - (pp - 2) * middle)
        inner = first[:, None] + middle * np.arange(pp - 1)[None, :]
        rows.append(np.concatenate([np.zeros((len(first), 1), np.int64), inner,
                                    np.full((len(first), 1), positions)], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, pp + 1), dtype=np.int64)


def megatron_split(table: FoldedTable, option: int) -> np.ndarray | None:
    """Best Megatron-expressible split (slowest rank, then peak memory) under the memory limit."""
    bounds = megatron_bounds(table.positions, table.pp)
    if len(bounds) == 0:
        return None
    ranks = np.arange(table.pp)[None, :]
    time = table.rank_time_s(ranks, bounds[:, :-1], bounds[:, 1:], option).max(axis=1)
    mem = table.rank_bytes(ranks, bounds[:, :-1], bounds[:, 1:], option).max(axis=1)
    fits = mem <= table.memory_limit_bytes
    if not np.any(fits):
        return None
    order = np.lexsort((mem, np.where(fits, time, np.inf)))
    return bounds[order[0]]
