"""A greedy feasible answer for the chunk balancer, its first incumbent (:mod:`autopar.pipeline.chunk_ilp`).

Start from a split (Megatron's default layout, :func:`autopar.pipeline.layout.default_layout`,
or the one given), every layer with its fastest option; while a rank is over the memory limit,
switch one layer to another option where it frees the most bytes per second it adds (the chunk
with the most micro-batches in flight first, as the ratio says). A rank that cannot fit this way
makes the greedy answer None: the integer program then starts without an incumbent.
"""

from __future__ import annotations

import itertools

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
    for r in range(pp):
        while costs.rank_bytes(counts)[r] > limit:
            now = costs.rank_bytes(counts)[r]
            best, best_ratio = None, -np.inf
            for v, k, o in zip(*np.nonzero(counts[r])):
                for to in options:
                    if to == o:
                        continue
                    counts[r, v, k, o] -= 1
                    counts[r, v, k, to] += 1
                    saved = now - costs.rank_bytes(counts)[r]
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


MAX_COMPOSITIONS = 200_000  # option mixes of one rank's layers the per-rank table enumerates
T_CANDIDATES = 40  # bottleneck times the split DP tries above the lowest feasible one


def _compositions(n: int, parts: int) -> np.ndarray:
    """Every way to write ``n`` as ``parts`` non-negative integers, shape ``(count, parts)``
    (stars and bars: the bar positions among ``n + parts - 1`` slots)."""
    if parts == 1:
        return np.array([[n]], dtype=np.int64)
    bars = np.array(list(itertools.combinations(range(n + parts - 1), parts - 1)), dtype=np.int64).reshape(-1, parts - 1)
    edges = np.concatenate([np.full((len(bars), 1), -1), bars, np.full((len(bars), 1), n + parts - 1)], axis=1)
    return np.diff(edges, axis=1) - 1


def _chunk_sizes(n: int, in_flight: np.ndarray) -> np.ndarray:
    """``n`` layers over a rank's chunks as evenly as possible, the remainder on the chunks with
    the fewest micro-batches in flight."""
    vpp = len(in_flight)
    sizes = np.full(vpp, n // vpp, dtype=np.int64)
    sizes[np.argsort(in_flight, kind="stable")[:n % vpp]] += 1
    return sizes


def rank_table(costs: ChunkCosts, options: np.ndarray, rank: int, max_layers: int):
    """For ``n = 0..max_layers`` layers on ``rank`` (one kind): the fastest option mix that fits
    in memory, its time per micro-batch and slowest chunk (seconds; inf where nothing fits),
    shapes ``(max_layers + 1,)`` and mixes ``(max_layers + 1, len(options))``.

    The layers spread evenly over the chunks (:func:`_chunk_sizes`); the options that keep the
    fewest activation bytes go to the chunks holding the most micro-batches (by the
    rearrangement inequality the least memory for that mix).
    """
    options = np.asarray(options, dtype=np.int64)
    act = costs.activation_bytes[0, options]
    order = np.argsort(act, kind="stable")  # lightest activations first
    time = costs.time_s[0, options]
    fixed_t, fixed_m = costs.stage_time_s[rank, options], costs.stage_bytes[rank, options]
    in_flight = costs.in_flight[rank]
    best_t = np.full(max_layers + 1, np.inf)
    best_c = np.full(max_layers + 1, np.inf)
    best_mix = np.zeros((max_layers + 1, len(options)), dtype=np.int64)
    for n in range(1, max_layers + 1):
        mix = _compositions(n, len(options))
        sizes = _chunk_sizes(n, in_flight)
        slots = np.sort(np.repeat(in_flight, sizes))[::-1]  # in flight of each layer slot, most first
        prefix = np.concatenate([[0.0], np.cumsum(slots)])
        ends = np.cumsum(mix[:, order], axis=1)
        starts = ends - mix[:, order]
        act_bytes = ((prefix[ends] - prefix[starts]) * act[order]).sum(axis=1)
        used = mix > 0
        memory = n * costs.static_bytes[0] + act_bytes + np.max(np.where(used, fixed_m, -np.inf), axis=1)
        total = mix @ time + fixed_t.min() + np.max(np.where(used, fixed_t - fixed_t.min(), 0.0), axis=1)
        total[memory > costs.memory_limit_bytes] = np.inf
        i = int(np.argmin(total))
        if not np.isfinite(total[i]):
            break  # a layer more only adds memory
        if True:
            best_t[n], best_mix[n] = total[i], mix[i]
            per_layer = total[i] - fixed_t.min()  # chunk times: the rank's layers pro rata, fixed part on its holder
            chunk = sizes * (per_layer / n)
            chunk[costs.holder[rank]] += fixed_t.min()
            best_c[n] = chunk.max()
        if len(mix) > MAX_COMPOSITIONS:
            break
    return best_t, best_c, best_mix


def _placed(costs: ChunkCosts, options: np.ndarray, rank: int, mix: np.ndarray) -> np.ndarray:
    """``(vpp, R)`` counts of ``mix`` (per option) on ``rank``'s chunks, as :func:`rank_table` places them."""
    in_flight = costs.in_flight[rank]
    sizes = _chunk_sizes(int(mix.sum()), in_flight)
    order = np.argsort(costs.activation_bytes[0, options], kind="stable")
    layer_option = np.repeat(options[order], mix[order])  # lightest first
    chunk_of_slot = np.repeat(np.argsort(-in_flight, kind="stable"), sizes[np.argsort(-in_flight, kind="stable")])
    out = np.zeros((len(in_flight), costs.forward_s.shape[1]), dtype=np.int64)
    np.add.at(out, (chunk_of_slot, layer_option), 1)
    return out


def split_dp_counts(costs: ChunkCosts, options: np.ndarray, num_microbatches: int) -> np.ndarray | None:
    """Counts ``(pp, vpp, 1, R)`` minimising ``(m - 1) * T + sum_r tail_r`` over layers per rank
    (one layer kind): per rank the fastest fitting mix of each size (:func:`rank_table`), then for
    each of the :data:`T_CANDIDATES` lowest bottlenecks ``T`` a min-plus DP over the ranks for the
    layer counts summing to ``L`` with every rank within ``T``. None when nothing fits."""
    options = np.asarray(options, dtype=np.int64)
    pp, vpp, total = costs.pp, costs.vpp, costs.num_layers
    if len(costs.kind_layers) != 1:
        return None
    tables = [rank_table(costs, options, r, total - (pp - 1)) for r in range(pp)]
    times = np.stack([t for t, _, _ in tables])  # (pp, n)
    tails = times if vpp == 1 else np.stack([c for _, c, _ in tables])
    levels = np.unique(times[np.isfinite(times)])
    best, best_value = None, np.inf
    tried = 0
    for level in levels:
        if tried >= T_CANDIDATES:
            break
        cost = np.full((pp, total + 1), np.inf)
        cost[:, :times.shape[1]] = np.where(times <= level, tails, np.inf)
        cost[:, 0] = np.inf  # every rank holds a layer
        reach = cost[0]  # reach[l]: least tail sum of the ranks so far holding l layers
        n = np.arange(total + 1)
        j = n[:, None] - n[None, :]  # layers of the next rank for each (l, l_before)
        j_ok = j >= 0
        back = []
        for r in range(1, pp):
            # new[l] = min over l' of reach[l'] + cost[r, l - l']
            candidates = np.where(j_ok, reach[None, :] + cost[r][np.clip(j, 0, total)], np.inf)
            choice = np.argmin(candidates, axis=1)
            back.append(choice)
            reach = candidates[n, choice]
        if total >= len(reach) or not np.isfinite(reach[total]):
            continue
        tried += 1
        value = (num_microbatches - 1) * level + reach[total]
        if value < best_value:
            sizes, left = np.zeros(pp, dtype=np.int64), total
            for r in range(pp - 1, 0, -1):
                prev = int(back[r - 1][left])
                sizes[r], left = left - prev, prev
            sizes[0] = left
            best, best_value = sizes, value
    if best is None:
        return None
    counts = np.zeros((pp, vpp, 1, costs.forward_s.shape[1]), dtype=np.int64)
    for r, n in enumerate(best):
        counts[r, :, 0, :] = _placed(costs, options, r, tables[r][2][n])
    return counts
