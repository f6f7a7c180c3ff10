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


BLOCK = 64  # end positions per step of the DP: a (K+1) x 64 block of float64 stays in the CPU cache


def min_max_split(table: FoldedTable, options: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Split and per-rank option (among column indices ``options``) minimising the slowest
    rank's time under the memory limit: ``(bounds, chosen)`` of shapes ``(pp + 1,)`` and
    ``(pp,)``, or None when nothing fits. Exact for that bottleneck (each rank takes the
    fastest option that fits its range, ties to the smaller memory); ties between splits go to
    the smaller peak memory. Computed :data:`BLOCK` end positions at a time over the starts
    before them (the same arithmetic as all ``(K+1)^2`` ranges at once, 5x less memory traffic:
    1,024 positions at pp 32 took 10 s)."""
    positions, pp = table.positions, table.pp
    limit = table.memory_limit_bytes
    options = [int(o) for o in options]

    def stage(rank: int, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Time, memory and option of ``rank`` owning ``[start, end)``, shape ``(len(starts), len(ends))``
        (inf where the range is empty or fits no option)."""
        start, end = starts[:, None], ends[None, :]
        empty = start >= end
        span_static = table.static_bytes[end] - table.static_bytes[start]
        best_t = best_m = best_o = None
        for option in options:
            span_act = table.activation_bytes[end, option] - table.activation_bytes[start, option]
            mem = span_static + table.in_flight[rank] * span_act
            mem += table.stage_bytes[rank, option]
            time = table.time_s[end, option] - table.time_s[start, option]
            time += table.stage_time_s[rank, option]
            time[empty | ~(mem <= limit)] = np.inf  # nan memory fits nowhere
            if best_t is None:  # the first option: every finite time beats inf
                best_t, best_m, best_o = time, mem, np.full(time.shape, option)
                best_m[np.isinf(time) & ~(mem < np.inf)] = np.inf
                continue
            better = (time < best_t) | ((time == best_t) & (mem < best_m))
            best_t, best_m = np.where(better, time, best_t), np.where(better, mem, best_m)
            best_o = np.where(better, option, best_o)
        return best_t, best_m, best_o

    all_ends = np.arange(positions + 1)
    time, mem, opt = stage(0, np.zeros(1, dtype=np.int64), all_ends)
    best_t, best_m = time[0], mem[0]
    picked = np.zeros((pp, positions + 1), dtype=np.int64)  # option of rank r's range ending at e
    picked[0] = opt[0]
    back = np.zeros((pp, positions + 1), dtype=np.int64)
    for rank in range(1, pp):
        low_t, low_m = np.empty(positions + 1), np.empty(positions + 1)
        for e0 in range(0, positions + 1, BLOCK):
            ends = all_ends[e0:e0 + BLOCK]
            starts = all_ends[:ends[-1]] if ends[-1] > 0 else all_ends[:1]  # a range ends after its start
            time, mem, opt = stage(rank, starts, ends)
            cand_t = np.maximum(best_t[starts, None], time)
            cand_m = np.maximum(best_m[starts, None], mem)
            low = cand_t.min(axis=0)
            tie = cand_t <= low * (1 + 1e-12)
            choice = np.argmin(np.where(tie, cand_m, np.inf), axis=0)
            columns = np.arange(len(ends))
            back[rank, ends], picked[rank, ends] = choice, opt[choice, columns]
            low_t[ends], low_m[ends] = low, cand_m[choice, columns]
        best_t, best_m = low_t, low_m
    if not np.isfinite(best_t[positions]):
        return None
    bounds = np.zeros(pp + 1, dtype=np.int64)
    bounds[pp] = positions
    for rank in range(pp - 1, 0, -1):
        bounds[rank] = back[rank, bounds[rank + 1]]
    return bounds, np.array([picked[r, bounds[r + 1]] for r in range(pp)])


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
