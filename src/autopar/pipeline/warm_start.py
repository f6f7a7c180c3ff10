"""A greedy feasible answer for the chunk balancer, its first incumbent (:mod:`autopar.pipeline.chunk_ilp`).

Start from a split (Megatron's default layout, :func:`autopar.pipeline.layout.default_layout`,
or the one given), every layer with its fastest option; while a rank is over the memory limit,
switch one layer to another option where it frees the most bytes per second it adds (the chunk
with the most micro-batches in flight first, as the ratio says). A rank that cannot fit this way
makes the greedy answer None: the integer program then starts without an incumbent.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from autopar.pipeline.chunk_costs import ChunkCosts, kind_counts


def greedy_counts(costs: ChunkCosts, options: np.ndarray, layers_per_chunk: np.ndarray) -> np.ndarray | None:
    """Full-table counts ``(pp, vpp, K, R)`` of ``layers_per_chunk`` ``(pp, vpp)`` with recompute
    options among ``options`` (column indices) chosen greedily to fit, or None.
    """
    options = np.asarray(options, dtype=np.int64)
    per_kind = kind_counts(costs.starts, layers_per_chunk)  # (pp, vpp, K)
    pp, vpp, num_kinds = per_kind.shape
    time = costs.time_s
    fastest = options[np.argmin(time[:, options], axis=1)]  # (K,)
    counts = np.zeros((pp, vpp, num_kinds, time.shape[1]), dtype=np.int64)
    for k in range(num_kinds):
        counts[:, :, k, fastest[k]] = per_kind[:, :, k]
    limit = costs.memory_limit_bytes
    per_layer = costs.static_bytes[None, :, None] + costs.in_flight[:, :, None, None] * costs.activation_bytes[None]

    def rank_bytes(r: int) -> float:
        """Rank ``r``'s peak bytes (:meth:`ChunkCosts.rank_bytes` of one rank)."""
        used = counts[r].sum(axis=(0, 1)) > 0
        return float((counts[r] * per_layer[r]).sum() + np.max(np.where(used, costs.stage_bytes[r], -np.inf)))

    for r in range(pp):
        while (now := rank_bytes(r)) > limit:
            best, best_ratio = None, -np.inf
            for v, k, o in zip(*np.nonzero(counts[r])):
                for to in options:
                    if to == o:
                        continue
                    counts[r, v, k, o] -= 1
                    counts[r, v, k, to] += 1
                    saved = now - rank_bytes(r)
                    counts[r, v, k, o] += 1
                    counts[r, v, k, to] -= 1
                    if saved <= 0:
                        continue
                    added = time[k, to] - time[k, o]
                    ratio = np.inf if added <= 0 else saved / added
                    if ratio > best_ratio:
                        best, best_ratio = (v, k, o, to), ratio
            if best is None:
                return None
            v, k, o, to = best
            counts[r, v, k, o] -= 1
            counts[r, v, k, to] += 1
    return counts


T_CANDIDATES = 40  # bottleneck times the split DP tries above the lowest feasible one
HEIGHTS = 4  # chunk-size shapes per layer count (from even to all layers in one chunk)


def _compositions(n: int, parts: int) -> np.ndarray:
    """Every way to write ``n`` as ``parts`` non-negative integers, shape ``(count, parts)``
    (stars and bars: the bar positions among ``n + parts - 1`` slots)."""
    if parts == 1:
        return np.array([[n]], dtype=np.int64)
    bars = np.array(list(itertools.combinations(range(n + parts - 1), parts - 1)), dtype=np.int64).reshape(-1, parts - 1)
    edges = np.concatenate([np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), n + parts - 1)], axis=1)
    return np.diff(edges, axis=1) - 1


def _chunk_sizes(n: int, in_flight: np.ndarray, height: int) -> np.ndarray:
    """``n`` layers on a rank's chunks, at most ``height`` each, the chunks holding the fewest
    micro-batches in flight filled first (``height = ceil(n / vpp)``: as even as possible)."""
    sizes = np.zeros(len(in_flight), dtype=np.int64)
    left = n
    for chunk in np.argsort(in_flight, kind="stable"):
        sizes[chunk] = min(height, left)
        left -= sizes[chunk]
    return sizes


def _slots(in_flight: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Chunk of each layer slot, the chunks with the most micro-batches in flight first."""
    order = np.argsort(-in_flight, kind="stable")
    return np.repeat(order, sizes[order])


@dataclass(frozen=True)
class RankCandidates:
    """Ways to load one rank (one layer kind): ``layers`` ``(c,)``, ``time_s`` ``(c,)`` seconds
    per micro-batch, ``chunk_s`` ``(c,)`` its slowest chunk, ``mixes`` ``(c, O)`` layers per
    option, ``sizes`` ``(c, vpp)`` layers per chunk; ``exact``: every option mix was tried for
    every count (else only mixes of two options, :data:`MAX_MIXES`), so the least time per count
    is a true floor."""

    layers: np.ndarray
    time_s: np.ndarray
    chunk_s: np.ndarray
    mixes: np.ndarray
    sizes: np.ndarray
    exact: bool = True


MAX_MIXES = 20_000  # option mixes tried per (count, shape); beyond, mixes of at most two options


def _two_option_mixes(n: int, parts: int) -> np.ndarray:
    """Mixes of ``n`` layers over at most two of ``parts`` options, shape ``(count, parts)``."""
    rows = []
    for a in range(parts):
        for b in range(a + 1, parts):
            block = np.zeros((n + 1, parts), dtype=np.int64)
            block[:, a] = np.arange(n + 1)
            block[:, b] = n - np.arange(n + 1)
            rows.append(block)
    return np.unique(np.concatenate(rows), axis=0) if rows else np.array([[n]], dtype=np.int64)


def rank_candidates(costs: ChunkCosts, options: np.ndarray, rank: int, max_layers: int) -> RankCandidates:
    """For each layer count ``n <= max_layers`` and chunk shape (:func:`_chunk_sizes`, :data:`HEIGHTS`
    heights from even to one chunk; one shape with vpp 1): the fastest option mix that fits in
    memory. The options that keep the fewest activation bytes go to the chunks holding the most
    micro-batches (by the rearrangement inequality the least memory for that mix). Where the
    fastest option fits the even shape, that is the only candidate for ``n`` (it is the fastest
    and its chunks the most even); once nothing fits ``n``, more layers fit neither.
    """
    options = np.asarray(options, dtype=np.int64)
    act, time = costs.activation_bytes[0, options], costs.time_s[0, options]
    order = np.argsort(act, kind="stable")  # lightest activations first, on the fullest slots
    fixed_t, fixed_m = costs.stage_time_s[rank, options], costs.stage_bytes[rank, options]
    in_flight, vpp, holder = costs.in_flight[rank], costs.vpp, costs.holder[rank]
    fastest = np.zeros((1, len(options)), dtype=np.int64)
    fastest[0, np.argmin(time)] = 1
    found: list[tuple] = []
    exact = True

    def fastest_fitting(mix: np.ndarray, n: int, sizes: np.ndarray):
        """The fastest of ``mix`` ``(count, O)`` that fits ``sizes``: its index and time; None if none fits."""
        slots = in_flight[_slots(in_flight, sizes)]  # in flight of each slot, the fullest first
        prefix = np.concatenate([[0.0], np.cumsum(slots)])
        ends = np.cumsum(mix[:, order], axis=1)
        act_bytes = ((prefix[ends] - prefix[ends - mix[:, order]]) * act[order]).sum(axis=1)
        used = mix > 0
        memory = n * costs.static_bytes[0] + act_bytes + np.max(np.where(used, fixed_m, -np.inf), axis=1)
        total = mix @ time + fixed_t.min() + np.max(np.where(used, fixed_t - fixed_t.min(), 0.0), axis=1)
        total[memory > costs.memory_limit_bytes] = np.inf
        i = int(np.argmin(total))
        return None if not np.isfinite(total[i]) else (i, float(total[i]))

    def record(n: int, sizes: np.ndarray, mix: np.ndarray, total: float) -> None:
        layer_option = np.repeat(options[order], mix[order])  # lightest first, on the fullest slots
        chunk = np.zeros(vpp)
        np.add.at(chunk, _slots(in_flight, sizes), costs.time_s[0, layer_option])
        chunk[holder] += total - float(mix @ time)  # the fixed part
        found.append((n, total, chunk.max(), mix, sizes))

    for n in range(1, max_layers + 1):
        even = -(-n // vpp)
        sizes = _chunk_sizes(n, in_flight, even)
        hit = fastest_fitting(fastest * n, n, sizes)
        if hit is not None:  # the fastest option fits the even shape: nothing beats it
            record(n, sizes, fastest[0] * n, hit[1])
            continue
        if math.comb(n + len(options) - 1, len(options) - 1) <= MAX_MIXES:
            mixes = _compositions(n, len(options))
        else:
            mixes, exact = _two_option_mixes(n, len(options)), False
        any_fit = False
        heights = np.unique(np.linspace(even, n, HEIGHTS).round().astype(np.int64)) if vpp > 1 else [n]
        for height in heights:
            sizes = _chunk_sizes(n, in_flight, int(height))
            hit = fastest_fitting(mixes, n, sizes)
            if hit is not None:
                record(n, sizes, mixes[hit[0]], hit[1])
                any_fit = True
        if not any_fit:
            break  # a layer more only adds memory
    if not found:
        empty = np.zeros(0)
        return RankCandidates(empty.astype(np.int64), empty, empty, np.zeros((0, len(options)), np.int64),
                              np.zeros((0, vpp), np.int64), exact)
    n, t, c, mixes, sizes = zip(*found)
    return RankCandidates(np.array(n), np.array(t), np.array(c), np.array(mixes), np.array(sizes), exact)


def _subset(cand: RankCandidates, keep: np.ndarray) -> RankCandidates:
    return RankCandidates(cand.layers[keep], cand.time_s[keep], cand.chunk_s[keep], cand.mixes[keep],
                          cand.sizes[keep], cand.exact)


def _placed(costs: ChunkCosts, options: np.ndarray, rank: int, mix: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``(vpp, R)`` counts of ``mix`` (per option) on ``rank``'s chunks of ``sizes``, as
    :func:`rank_candidates` places them."""
    order = np.argsort(costs.activation_bytes[0, options], kind="stable")
    layer_option = np.repeat(options[order], mix[order])  # lightest first, on the fullest slots
    out = np.zeros((costs.vpp, costs.forward_s.shape[1]), dtype=np.int64)
    np.add.at(out, (_slots(costs.in_flight[rank], sizes), layer_option), 1)
    return out


def all_rank_candidates(costs: ChunkCosts, options: np.ndarray, bottleneck_s: float = np.inf,
                        others_hold_layers: bool = True) -> list[RankCandidates]:
    """:func:`rank_candidates` of every rank, each up to ``L - pp + 1`` layers (``L`` without
    ``others_hold_layers``: the layers of one kind among several, which one rank may hold
    alone) and no more than fit within ``bottleneck_s`` at the fastest option (a known answer's
    slowest rank: a better answer has none slower)."""
    options = np.asarray(options, dtype=np.int64)
    most = costs.num_layers - (costs.pp - 1 if others_hold_layers else 0)
    fastest = float(costs.time_s[0, options].min())
    out = []
    for r in range(costs.pp):
        room = (bottleneck_s - float(costs.stage_time_s[r, options].min())) / fastest if fastest > 0 else np.inf
        out.append(rank_candidates(costs, options, r, int(min(most, np.floor(room * (1 + 1e-9)))) if np.isfinite(room)
                                   else most))
    return out


def split_dp_counts(costs: ChunkCosts, options: np.ndarray, num_microbatches: int,
                    even_chunks: bool = False, ranks: list[RankCandidates] | None = None) -> np.ndarray | None:
    """Counts ``(pp, vpp, 1, R)`` minimising ``(m - 1) * T + sum_r c_r`` (the objective of
    :mod:`autopar.pipeline.chunk_ilp`) over the candidates of each rank (:func:`rank_candidates`),
    one layer kind: for each of the :data:`T_CANDIDATES` lowest bottlenecks ``T`` that fit (until
    ``(m - 1) * T`` plus the least possible chunk sum exceeds the best found), a
    min-plus DP over the ranks for layer counts summing to ``L``, each rank taking its candidate
    with the smallest slowest chunk within ``T``. None when nothing fits (or several kinds).

    ``ranks``: :func:`all_rank_candidates`, computed here if not given. ``even_chunks``: only candidates whose chunks differ by at most one layer. The objective
    prices a lopsided rank only by its slowest chunk; the simulated interleaved step can cost more
    (405B, pp 16 x vpp 2: 216 s against 209 s evenly), so the balancer simulates both answers.
    """
    options = np.asarray(options, dtype=np.int64)
    pp, vpp, total = costs.pp, costs.vpp, costs.num_layers
    if len(costs.kind_layers) != 1:
        return None
    ranks = all_rank_candidates(costs, options) if ranks is None else ranks
    if even_chunks:
        ranks = [_subset(cand, np.ptp(cand.sizes, axis=1) <= 1) for cand in ranks]
    levels = np.unique(np.concatenate([c.time_s for c in ranks]))
    n = np.arange(total + 1)
    j = n[:, None] - n[None, :]  # layers of the next rank for each (l, l_before)
    j_ok = j >= 0
    best, best_value, tried = None, np.inf, 0
    for cand in ranks:  # by layer count, then slowest chunk: the first of each count is its best
        order = np.lexsort((cand.chunk_s, cand.layers))
        for name in ("layers", "time_s", "chunk_s", "mixes", "sizes"):
            object.__setattr__(cand, name, getattr(cand, name)[order])
    least_tail = sum(float(cand.chunk_s.min(initial=np.inf)) for cand in ranks)
    for level in levels:
        if tried >= T_CANDIDATES or (num_microbatches - 1) * level + least_tail >= best_value:
            break  # no later bottleneck can do better
        within = [cand.time_s <= level for cand in ranks]
        if sum(int(cand.layers[ok].max(initial=0)) for cand, ok in zip(ranks, within)) < total:
            continue  # the ranks cannot hold every layer within this bottleneck
        cost = np.full((pp, total + 1), np.inf)
        pick = np.full((pp, total + 1), -1)
        for r, (cand, ok) in enumerate(zip(ranks, within)):
            index = np.flatnonzero(ok)
            counts_here, first = np.unique(cand.layers[index], return_index=True)
            cost[r, counts_here], pick[r, counts_here] = cand.chunk_s[index[first]], index[first]
        reach, back = cost[0], []  # reach[l]: least sum of the ranks so far holding l layers
        for r in range(1, pp):
            candidates = np.where(j_ok, reach[None, :] + cost[r][np.clip(j, 0, total)], np.inf)
            choice = np.argmin(candidates, axis=1)
            back.append(choice)
            reach = candidates[n, choice]
        if not np.isfinite(reach[total]):
            continue
        tried += 1
        value = (num_microbatches - 1) * level + reach[total]
        if value < best_value:
            sizes, left = np.zeros(pp, dtype=np.int64), total
            for r in range(pp - 1, 0, -1):
                prev = int(back[r - 1][left])
                sizes[r], left = left - prev, prev
            sizes[0] = left
            best, best_value = [int(pick[r, sizes[r]]) for r in range(pp)], value
    if best is None:
        return None
    counts = np.zeros((pp, vpp, 1, costs.forward_s.shape[1]), dtype=np.int64)
    for r, i in enumerate(best):
        counts[r, :, 0, :] = _placed(costs, options, r, ranks[r].mixes[i], ranks[r].sizes[i])
    return counts


def rank_time_floor_s(ranks: list[RankCandidates], num_layers: int) -> np.ndarray | None:
    """``(pp, L + 1)``: the least seconds per micro-batch of each rank holding ``n`` layers (inf
    where ``n`` layers fit in no way, or beyond the counts tried: slower than the bound of
    :func:`all_rank_candidates`), or None where some rank did not try every mix. A valid floor for any chunk placement: among the shapes of
    :func:`rank_candidates` is the one with every layer on the chunk holding the fewest
    micro-batches, the least memory any placement of a mix needs."""
    floor = np.full((len(ranks), num_layers + 1), np.inf)
    if not all(cand.exact for cand in ranks):
        return None
    for r, cand in enumerate(ranks):
        np.minimum.at(floor[r], cand.layers, cand.time_s)
    return floor
