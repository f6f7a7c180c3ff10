"""Pipeline makespan for ``autopar estimate``: fast static-schedule simulation of a layout.

The closed forms of :mod:`autopar.cost.step` assume equal stages; with uneven layer counts
(``--layers-per-stage``, or Megatron's default split when pp does not divide the layers) the
estimate uses this simulation instead. :func:`static_makespan_s` computes the same makespan as
:func:`autopar.pipeline.simulate.simulate` for the static schedules (gpipe, 1f1b, interleaved)
without building a timeline: every op starts at ``max(rank free, input arrived)`` in its rank's
order, so ranks can be advanced round-robin in any order.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from autopar.cost.stage import Stages
from autopar.cost.stage_time import p2p_time_s, tied_embedding_grad_s
from autopar.cost.step import StepCosts
from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layers import chunk_op_times_many_s
from autopar.pipeline.schedules import check_schedule
from autopar.pipeline.simulate import PipelineTimes
from autopar.pipeline.steady import RECURRENCE_REL_TOL, recurrence, simulate_bounded
from autopar.problem import Problem
from autopar.strategy import V_SCHEDULE_NAMES, Strategy

# Ops (one forward, or one recompute + backward, of a micro-batch on a chunk) one static simulation
# may run: ~150 bytes and ~0.5 us each, so ~300 MB and ~1 s (pp 63 and 100,000 micro-batches
# were 12.6 million ops and 1.9 GB).
MAX_STATIC_OPS = 2_000_000


def _levels(after: np.ndarray, needs: np.ndarray) -> np.ndarray:
    """Dependency depth of every op, one vector step per depth (Kahn's algorithm): an op is
    ready once the previous op on its rank (``after``) and its input (``needs``) are done;
    ``len(after)`` means none. Each op feeds at most the next op on its rank and one other
    op. -1 marks ops never reached (a deadlock)."""
    n = len(after)
    pending = (after != n).astype(np.int64) + (needs != n)
    successor = np.full((2, n + 1), n)
    has_after, has_needs = np.flatnonzero(after != n), np.flatnonzero(needs != n)
    successor[0, after[has_after]] = has_after
    successor[1, needs[has_needs]] = has_needs
    level = np.full(n, -1)
    frontier, depth = np.flatnonzero(pending == 0), 0
    while frontier.size:
        level[frontier] = depth
        reached = successor[:, frontier].ravel()
        reached = reached[reached != n]
        np.subtract.at(pending, reached, 1)
        frontier = np.unique(reached[pending[reached] == 0])
        depth += 1
    return level


def _orders(schedule: str, pp: int, vpp: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's op order as ``(pp, 2 * m * vpp)`` arrays ``backward``, ``microbatch``,
    ``chunk``: :func:`autopar.pipeline.schedules.rank_order`, vectorised. Rank ``i`` runs
    ``w_i`` warm-up forwards, then alternates forward ``w_i + s`` and backward ``s``, then
    drains (GPipe: ``w_i = m``); the ``k``-th chunk forward of interleaving is micro-batch
    ``(k // (pp * vpp)) * pp + k % pp`` of chunk ``(k // pp) % vpp`` (backward: chunks reversed)."""
    total = m * vpp
    rank = np.arange(pp)[:, None]
    if schedule == "gpipe":
        warmup = np.full((pp, 1), total)
    elif schedule == "interleaved":
        warmup = np.minimum(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
    else:
        warmup = np.minimum(pp - rank - 1, total)
    q = np.arange(2 * total)[None, :]
    steady = q - warmup
    in_steady = (steady >= 0) & (steady < 2 * (total - warmup))
    backward = np.where(in_steady, steady % 2 == 1, q >= warmup)
    k = np.where(in_steady, np.where(backward, steady // 2, warmup + steady // 2), np.where(backward, q - total, q))
    if vpp == 1:
        return backward, k, np.zeros_like(k)
    group, within = np.divmod(k, pp * vpp)
    chunk = within // pp
    return backward, group * pp + within % pp, np.where(backward, vpp - 1 - chunk, chunk)


def _rank_graph(schedule: str, pp: int, vpp: int, m: int) -> tuple[np.ndarray, ...]:
    """The ops of a static schedule, rank after rank in each rank's order (``W = 2 * m * vpp``
    per rank): ``backward`` (bool; a backward runs its recompute first), ``chunk``, ``rank``,
    ``after`` (the previous op on the rank) and ``needs`` (the op whose output it waits for),
    both flat indices with ``pp * W`` = none, ``hop`` (1.0 where that input comes from another
    rank and pays one p2p transfer: never with pp 1, as in the event simulation), ``microbatch``.
    """
    backward, mb, chunk = _orders(schedule, pp, vpp, m)
    rank = np.broadcast_to(np.arange(pp)[:, None], backward.shape)
    j = chunk * pp + rank  # virtual stage
    width, last = backward.shape[1], pp * vpp - 1
    n = pp * width
    flat = np.arange(n).reshape(pp, width)
    f_at, b_at = np.zeros((last + 1, m), np.int64), np.zeros((last + 1, m), np.int64)
    f_at[j[~backward], mb[~backward]] = flat[~backward]
    b_at[j[backward], mb[backward]] = flat[backward]
    needs, hop = np.full((pp, width), n), np.zeros((pp, width))
    fwd = ~backward & (j > 0)
    needs[fwd], hop[fwd] = f_at[j[fwd] - 1, mb[fwd]], float(pp > 1)
    turn = backward & (j == last)  # the last virtual stage's backward needs its own forward
    needs[turn] = f_at[last, mb[turn]]
    bwd = backward & (j < last)
    needs[bwd], hop[bwd] = b_at[j[bwd] + 1, mb[bwd]], float(pp > 1)
    after = np.where(flat % width > 0, flat - 1, n)
    return backward.ravel(), chunk.ravel(), rank.ravel(), after.ravel(), needs.ravel(), hop.ravel(), mb.ravel()


@lru_cache(maxsize=32)
def _graph(schedule: str, pp: int, vpp: int, ms: tuple[int, ...]) -> tuple:
    """The schedules for each micro-batch count in ``ms`` side by side, their ops sorted by
    dependency depth so that each depth is one vector step for all of them.

    Returns ``(backward, chunk, rank, after, needs, hop, cuts, lasts, microbatch)``: the op
    arrays of :func:`_rank_graph` in depth order (``after``/``needs`` as positions in that order,
    the total op count = none), ``cuts`` the depth boundaries and ``lasts[g]`` the positions of
    schedule ``g``'s last op on every rank.

    Raises:
        AutoparError: the orders deadlock.
    """
    parts, offset, lasts = [], 0, []
    for m in ms:
        backward, chunk, rank, after, needs, hop, mb = _rank_graph(schedule, pp, vpp, m)
        n = len(after)
        shift = lambda x: np.where(x == n, -1, x + offset)  # noqa: E731  (-1: none, fixed below)
        parts.append((backward, chunk, rank, shift(after), shift(needs), hop, mb))
        lasts.append(offset + np.arange(1, pp + 1) * (n // pp) - 1)
        offset += n
    backward, chunk, rank, after, needs, hop, mb = (np.concatenate(x) for x in zip(*parts))
    after, needs = np.where(after < 0, offset, after), np.where(needs < 0, offset, needs)
    level = _levels(after, needs)
    if np.any(level < 0):
        raise AutoparError(f"schedule {schedule!r} deadlocked (pp={pp}, vpp={vpp}, m={ms})")
    order = np.argsort(level, kind="stable")
    position = np.empty(offset + 1, np.int64)
    position[order] = np.arange(offset)
    position[offset] = offset
    cuts = np.searchsorted(level[order], np.arange(level.max() + 2)).tolist()
    return (backward[order], chunk[order], rank[order], position[after[order]], position[needs[order]],
            hop[order], cuts, [position[x] for x in lasts], mb[order])


def _static_ends_s(fwd: np.ndarray, bwd: np.ndarray, rec: np.ndarray, p2p_s: np.ndarray, ms: tuple[int, ...],
                   schedule: str) -> tuple[np.ndarray, tuple]:
    """End time of every op, ``(n * c, ops)`` for ``n`` layouts' op times ``(n, pp, vpp)`` and
    their ``(n, c)`` p2p times (layout-major rows), in the order of :func:`_graph` (returned
    too): every op ends at ``max(previous op on its rank, its input + p2p) + duration``
    (recompute, then backward), computed one dependency depth at a time for all ops of that
    depth and every row, which is exactly list scheduling of each rank's order (rows never mix)."""
    _, pp, vpp = fwd.shape
    c = p2p_s.shape[1]
    graph = _graph(schedule, pp, vpp, ms)
    backward, chunk, rank, after, needs, hop, cuts = graph[:7]
    # op-major (ops, rows): each depth's gathers copy whole rows
    first = np.repeat(np.where(backward, rec[:, rank, chunk], fwd[:, rank, chunk]), c, axis=0).T.copy()
    second = np.repeat(np.where(backward, bwd[:, rank, chunk], 0.0), c, axis=0).T.copy()
    delay = (p2p_s.reshape(-1, 1) * hop).T.copy()
    end = np.zeros((first.shape[0] + 1, delay.shape[1]))
    for a, b in zip(cuts[:-1], cuts[1:]):
        start = np.maximum(end[after[a:b]], end[needs[a:b]] + delay[a:b])
        end[a:b] = (start + first[a:b]) + second[a:b]
    return end[:-1].T, graph


def _simulate_static(fwd: np.ndarray, bwd: np.ndarray, rec: np.ndarray, p2p_s: np.ndarray, ms: tuple[int, ...],
                     schedule: str) -> np.ndarray:
    """Makespans ``(n, c, len(ms))`` of a static schedule for ``n`` layouts' op times
    ``(n, pp, vpp)``, their ``(n, c)`` p2p times and each micro-batch count in ``ms``
    (:func:`_static_ends_s`)."""
    end, graph = _static_ends_s(fwd, bwd, rec, p2p_s, ms, schedule)
    return np.stack([end[:, last].max(axis=1) for last in graph[7]], axis=1).reshape(*p2p_s.shape, len(ms))


def static_makespan_s(times: PipelineTimes, num_microbatches: int, schedule: str) -> float:
    """Makespan (seconds) of ``schedule`` (``gpipe``, ``1f1b`` or ``interleaved``) with
    per-(rank, chunk) ``times``; equals ``simulate(...).makespan_s``.

    Raises:
        AutoparError: see :func:`static_makespans_s`.
    """
    return float(static_makespans_s(times, np.array([times.p2p_s]), num_microbatches, schedule)[0])


def static_makespans_s(times: PipelineTimes, p2p_s: np.ndarray, num_microbatches: int, schedule: str) -> np.ndarray:
    """Makespans ``(c,)`` of ``schedule`` with ``times`` and each of the ``c`` p2p times
    ``p2p_s`` (``times.p2p_s`` is ignored): :func:`batch_makespans_s` for one layout.

    Raises:
        AutoparError: see :func:`batch_makespans_s`.
    """
    ops = [np.asarray(x, dtype=float)[None] for x in (times.forward_s, times.backward_s, times.recompute_s)]
    return batch_makespans_s(*ops, np.asarray(p2p_s, dtype=float)[None], num_microbatches, schedule)[0]


def batch_makespans_s(fwd: np.ndarray, bwd: np.ndarray, rec: np.ndarray, p2p_s: np.ndarray, num_microbatches: int,
                      schedule: str) -> np.ndarray:
    """Makespans ``(n, c)`` of ``schedule`` for ``n`` layouts of the same shape: per-(rank, chunk)
    forward, backward and recompute times ``(n, pp, vpp)`` (seconds per micro-batch), each with
    ``c`` p2p times ``p2p_s`` ``(n, c)``. The layouts share one op graph and one vector step per
    dependency depth; each gets exactly the makespans it gets alone.

    With many micro-batches the schedule reaches a periodic steady state (a max-plus linear
    system; Baccelli et al., "Synchronization and Linearity", 1992, ch. 3): every op recurs
    ``delta`` seconds later every ``c`` micro-batches. As :mod:`autopar.pipeline.steady` does for
    the event simulation, ``10 * pp`` micro-batches are simulated, ``(c, delta)`` is read from
    the ops of a window past the warm-up (:func:`autopar.pipeline.steady.recurrence`) and the
    makespan extrapolated from a step with ``m``'s remainder modulo ``c``; a layout without a
    recurrence (for some p2p time) doubles its warm-up. Fewer micro-batches, GPipe, and layouts
    with no recurrence found within :data:`MAX_STATIC_OPS` are simulated in full, up to
    :data:`MAX_STATIC_OPS` ops.

    Raises:
        AutoparError: ``zb-h1`` and the two-chunk schedules (use ``simulate``), sizes the
            schedule cannot run, or a full simulation beyond :data:`MAX_STATIC_OPS` ops.
    """
    if schedule not in ("gpipe", "1f1b", "interleaved"):
        raise AutoparError(f"schedule={schedule!r}: use autopar.pipeline.simulate.simulate (the static makespan "
                           "covers the interleaved placement's gpipe, 1f1b and interleaved)")
    (_, pp, vpp), m = fwd.shape, num_microbatches
    check_schedule(schedule, pp, vpp, m)
    spans = np.full(p2p_s.shape, np.nan)
    todo = np.arange(len(fwd))  # layouts without a makespan yet
    step = pp if schedule == "interleaved" else 1  # the schedule's own period in micro-batches
    warmup = 2 * pp
    while schedule != "gpipe" and todo.size:
        size = warmup + 8 * pp  # warm-up, window 4pp, shift <= 2pp, drain 2pp
        size += (m - size) % step
        if size >= m or 2 * pp * vpp * size > MAX_STATIC_OPS:
            break
        found, extrapolated = _extrapolated_s(fwd[todo], bwd[todo], rec[todo], p2p_s[todo], m, schedule, size,
                                              warmup, step)
        spans[todo[found]] = extrapolated
        todo = todo[~found]
        warmup *= 2
    if not todo.size:
        return spans
    if 2 * pp * vpp * m > MAX_STATIC_OPS:
        what = "GPipe's backwards wait for every forward" if schedule == "gpipe" else "no periodic steady state found"
        raise AutoparError(f"num_microbatches={m}: the {schedule} pipeline (pp={pp}, vpp={vpp}) is simulated op by op "
                           f"({what}) up to pp * vpp * num_microbatches = {MAX_STATIC_OPS // 2:,}; lower --gbs or "
                           "raise --mbs/--dp")
    spans[todo] = _simulate_static(fwd[todo], bwd[todo], rec[todo], p2p_s[todo], (m,), schedule)[:, :, 0]
    return spans


def _extrapolated_s(fwd: np.ndarray, bwd: np.ndarray, rec: np.ndarray, p2p_s: np.ndarray, m: int, schedule: str,
                    size: int, warmup: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Which of the ``n`` layouts have a recurrence for every p2p time in a ``size`` step's ops
    past ``warmup`` micro-batches (``(n,)`` bool), and those layouts' makespans ``(found, c)`` of
    ``m`` micro-batches extrapolated from it."""
    n, pp, vpp = fwd.shape
    end, graph = _static_ends_s(fwd, bwd, rec, p2p_s, (size,), schedule)
    backward, chunk, rank, microbatch = graph[0], graph[1], graph[2], graph[8]
    row = (rank * 2 + backward) * vpp + chunk  # one row per (rank, kind, chunk)
    cycles = []
    for ends in end:
        op_s = np.full((2 * pp * vpp, size), np.nan)
        op_s[row, microbatch] = ends
        cycles.append(recurrence(op_s, warmup, 4 * pp, 2 * pp, step, RECURRENCE_REL_TOL * float(ends.max())))
    c = p2p_s.shape[1]
    found = np.array([all(x is not None for x in cycles[i * c:(i + 1) * c]) for i in range(n)], dtype=bool)
    kept = [cycle for i, cycle in enumerate(cycles) if found[i // c]]
    if not kept:
        return found, np.zeros((0, c))
    finals = [size + (m - size) % cycle for cycle, _ in kept]  # m's remainder modulo each cycle
    sizes = tuple(sorted(set(finals)))
    spans = _simulate_static(fwd[found], bwd[found], rec[found], p2p_s[found], sizes, schedule).reshape(len(kept), -1)
    return found, np.array([spans[i, sizes.index(f)] + (m - f) // cycle * delta
                            for i, (f, (cycle, delta)) in enumerate(zip(finals, kept))]).reshape(-1, c)


def simulated_costs_many(p: Problem, layouts: list[tuple[Strategy, LayoutBatch, Stages, StepCosts]]) -> list[StepCosts]:
    """The ``costs`` of each layout with its pipeline makespan simulated stage by stage; the
    static schedules of one shape (schedule, pp, vpp, num_microbatches) are simulated together
    (:func:`batch_makespans_s`), each layout getting exactly what it gets alone.

    Each item: the layout ``s``, ``batch``/``stages`` the layout repeated per stage and its
    stages (:func:`autopar.cost.stage.all_stages`) and its ``costs``. A stage's per-micro-batch
    time (communication shared out as in :mod:`autopar.pipeline.layers`) goes to its ``vpp``
    chunks by their layers, the embedding/output-layer part to the chunk holding it
    (:func:`autopar.pipeline.layers.chunk_op_times_s`, all layouts in one pass). The time
    breakdown keeps its compute/communication terms;
    ``pp_bubble`` becomes the simulated makespan without p2p minus ``m`` times the slowest stage
    and ``pp_comm`` the p2p hand-offs plus the tied-embedding gradient all-reduce
    (:func:`autopar.cost.stage_time.tied_embedding_grad_s`), so the breakdown still sums to the
    step time. The hand-offs of 1F1B and GPipe are the closed form's blocking ones
    (:func:`blocking_handoffs_s`), as for equal stages: an uneven split is not charged less p2p
    than an even one (it was: the simulation's delay on the dependency hid all but the fill and
    drain's); those of interleaving and the V schedules are what p2p adds to the simulated
    makespan.

    Raises:
        AutoparError: as :func:`batch_makespans_s`.
    """
    inputs = []  # per layout: (op times (3, pp, vpp), m, schedule, p2p seconds, the layout's first row)
    chunk_times = chunk_op_times_many_s(p, [(s, batch, stages) for s, batch, stages, _ in layouts])
    for (s, batch, stages, _), chunks in zip(layouts, chunk_times):
        m = s.num_microbatches(p.train.global_batch_size)
        # GPipe (Galvatron's pipeline_type gpipe) is simulated op by op; beyond MAX_STATIC_OPS its 1F1B twin
        # stands in (the same makespan for equal stages).
        gpipe = s.schedule == "gpipe" and 2 * s.pp * m <= MAX_STATIC_OPS
        schedule = "interleaved" if s.vpp > 1 else "gpipe" if gpipe else "1f1b"
        one = batch.take(np.zeros(1, dtype=np.int64))
        inputs.append((np.asarray(chunks, dtype=float), m, schedule,
                       float(p2p_time_s(p, one)[0]), one))
    spans: list = [None] * len(layouts)  # (makespan without p2p, with p2p) per layout
    shapes: dict[tuple, list[int]] = {}
    for i, ((s, *_), (chunks, m, schedule, p2p, _)) in enumerate(zip(layouts, inputs)):
        if s.schedule in V_SCHEDULE_NAMES:  # ZB-V / DualPipeV: the event simulation of their op orders
            spans[i] = tuple(simulate_bounded(PipelineTimes(*chunks, p2p_s=delay), m, s.schedule).makespan_s
                             for delay in (0.0, p2p))
        else:
            shapes.setdefault((schedule, chunks.shape, m), []).append(i)
    for (schedule, _, m), group in shapes.items():
        ops = np.stack([inputs[i][0] for i in group], axis=1)  # (3, n, pp, vpp)
        p2p_s = np.array([[0.0, inputs[i][3]] for i in group])
        for i, pair in zip(group, batch_makespans_s(*ops, p2p_s, m, schedule)):
            spans[i] = tuple(pair)
    return [_with_makespans(p, costs, inputs[i][4], *spans[i], blocking_s=blocking_handoffs_s(s, inputs[i][1],
                                                                                              inputs[i][3]))
            for i, (s, _, _, costs) in enumerate(layouts)]


def blocking_handoffs_s(s: Strategy, num_microbatches: int, p2p_s: float) -> float | None:
    """Seconds of the exposed p2p hand-offs of a non-interleaved schedule (1F1B, GPipe): the
    closed form of :func:`autopar.cost.step.combine`, ``2 (m + pp - 2) * p2p`` (``m`` micro-batches,
    one send of ``p2p_s``): Megatron-LM's ``forward_backward_pipelining_without_interleaving``
    sends and receives synchronously (``send_forward_recv_backward`` and the like wait for their
    transfer), so every hand-off on the slowest stage's path costs its time, whether the stages are
    equal or not. None for interleaving and the V schedules, whose p2p overlaps with compute: the
    simulation's delay on the dependency is what it adds."""
    if s.vpp > 1 or s.schedule in V_SCHEDULE_NAMES:
        return None
    return 2 * (num_microbatches + s.pp - 2) * p2p_s


def _with_makespans(p: Problem, costs: StepCosts, one: LayoutBatch, without: float, with_p2p: float,
                    blocking_s: float | None = None) -> StepCosts:
    """``costs`` with the pipeline terms of the simulated makespans ``without`` and ``with_p2p``
    (seconds; see :func:`simulated_costs_many`); ``blocking_s``: the exposed hand-offs of a
    non-interleaved schedule (:func:`blocking_handoffs_s`), which replace what p2p adds to the
    simulated makespan."""
    b = costs.time_breakdown_s
    busy = b["compute"] + b["tp_comm"] + b["cp_comm"] + b["ep_comm"]
    p2p = with_p2p - without if blocking_s is None else blocking_s
    breakdown = dict(b, pp_bubble=np.maximum(without - busy, 0.0), pp_comm=p2p + tied_embedding_grad_s(p, one))
    step = busy + breakdown["pp_bubble"] + breakdown["pp_comm"] + b["dp_comm"] + b["optimizer"]
    scale = costs.step_time_s / step
    return replace(costs, step_time_s=step, time_breakdown_s=breakdown,
                   tokens_per_s_per_device=costs.tokens_per_s_per_device * scale, mfu=costs.mfu * scale)
