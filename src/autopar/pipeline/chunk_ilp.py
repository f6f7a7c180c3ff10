"""Layers per chunk and recompute layer counts as one integer program (HiGHS), SAPP-PPB's problem.

Variables (:class:`~autopar.pipeline.chunk_costs.ChunkCosts` for the costs; ``j = v * pp + r``):

* ``x[r, v, k, o]`` integer >= 0: layers of kind ``k`` in chunk ``v`` of rank ``r`` run with
  recompute option ``o`` (SAPP-PPB: layers per virtual stage and recomputed layers per stage are
  integers; MindSpore hyper_parallel ``auto_parallel/sapp_ppb``). Chunks may be empty
  (Megatron-LM's layout string allows empty virtual stages); every rank keeps one layer.
* with several kinds, ``d[j, k]``: layers of kind ``k`` before virtual stage ``j``, and binaries
  ``z[j, k]`` forcing layer order (kind ``k + 1`` starts only after kind ``k`` is used up: the
  incremental piecewise-linear model, Dantzig 1960).
* ``y[r, o]`` binary where option ``o``'s fixed part of rank ``r`` (the layer rebuilt under full
  recompute) exceeds the rank's cheapest: ``x[r, ., ., o] <= cap * y[r, o]``; ``Ft[r]``, ``Fm[r]``
  the fixed time and bytes over the cheapest, ``>= extra[r, o] * y[r, o]``.
* ``t[r]``: seconds per micro-batch of rank ``r``; ``c[r]`` the slowest of its chunks (vpp > 1);
  ``T >= t[r]``.

Memory: ``sum x * (static + in_flight[r, v] * act) + Fm[r] <= limit - fixed[r]`` per rank.
Objective: ``(m - 1) * T + sum_r c[r]`` (``t[r]`` with vpp 1): the steady state of ``m``
micro-batches runs at the slowest rank's pace, the fill and drain pass every rank once, a chunk at
a time (Narayanan et al., SC'21, sec. 2.2: ``(m - 1) * t + pp * t / vpp`` for equal stages; for
1F1B with uneven stages the exact makespan without p2p, :func:`autopar.pipeline.folded.surrogate_s`).
The simulated step of the answer is reported beside it (:mod:`autopar.pipeline.balance`).

Tightening (the bounds from the even split and the warm start): ``T`` is at least ``ceil(L / pp)``
of the fastest layers (some rank holds that many) and, with one layer kind, at least the least
bottleneck at which the ranks can hold every layer by their exact per-rank time floors
(:func:`autopar.pipeline.warm_start.rank_time_floor_s`), whose lower convex envelopes also cut
each ``t[r]`` from below; ``T`` is at most what the warm start's objective allows, and each rank's
layers are capped by that ``T`` and by its memory. The warm start
(:func:`autopar.pipeline.warm_start.split_dp_counts`) is handed to HiGHS as its first incumbent.
With these, Llama-3.1-405B on pp 16 (512 micro-batches) is proven optimal in 0.2 s, where the
bare program had not closed a 1.4% gap in 2 s (``benchmarks/bench_balance.py``). With several
layer kinds (DeepSeek-V3: 3 dense and 58 MoE layers) the floors are those of the most numerous
kind alone (a rank may hold all of them), the other kinds' layers added at their fastest option,
the envelope starting at none of the kind and each rank's layers of the kind capped where its
floor ends (``floor_kind``): on pp 16 x vpp 2, ep 64, 16 micro-batches this took the MIP gap at the
0.3 s limit from 9.1% to 3.3% (2 s: 8.6% to 1.9%), and with ep 1 from 11.2-11.6% to 5.4-5.8%
(wall-clock limits: the figures move with the machine's load). Units inside:
the fastest layer's time and the memory limit. HiGHS (``highspy``) reports the relative MIP gap
and whether it proved optimality; ``scipy.optimize.milp`` is the fallback without highspy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.pipeline import highs_run
from autopar.pipeline.chunk_costs import ChunkCosts
from autopar.pipeline.ilp import _quiet_stdout

MIP_REL_GAP = 1e-3  # "optimal": proven within 0.1% of the bound (HiGHS mip_rel_gap; its default is 0.01%)


@dataclass(frozen=True)
class ChunkSolution:
    """``counts`` ``(pp, vpp, K, len(options))`` or None (no split found); ``optimal``: HiGHS
    proved it within :data:`MIP_REL_GAP` of the best possible (or proved nothing fits); ``gap``: relative MIP gap
    (``(objective - bound) / objective``, None without a solution); ``time_limit_hit``;
    ``objective_s`` / ``bound_s``: the surrogate and its proven lower bound (seconds);
    ``solver``: highs or scipy."""

    counts: np.ndarray | None
    optimal: bool
    gap: float | None
    time_limit_hit: bool
    objective_s: float | None
    bound_s: float | None
    solver: str


def bottleneck_bound_s(costs: ChunkCosts, options: np.ndarray, num_microbatches: int, objective: float) -> float:
    """The slowest rank's seconds per micro-batch that an answer of objective ``objective`` (or
    better) can have: ``(objective - least tail) / (m - 1)``, the least tail being every layer at
    its fastest option over ``vpp`` (inf with one micro-batch)."""
    if num_microbatches <= 1:
        return np.inf
    time = costs.time_s[:, options]
    work = float((costs.kind_layers * time.min(axis=1)).sum() + costs.stage_time_s[:, options].min(axis=1).sum())
    tail = work if costs.vpp == 1 else work / costs.vpp
    return (objective * (1 + 1e-6) - tail) / (num_microbatches - 1)


def objective_s(costs: ChunkCosts, counts: np.ndarray, num_microbatches: int) -> float:
    """The program's objective (seconds) of full-table ``counts`` ``(pp, vpp, K, R)``."""
    times = costs.times(counts)
    chunk = np.asarray(times.forward_s) + np.asarray(times.backward_s) + np.asarray(times.recompute_s)
    rank = chunk.sum(axis=1)
    tail = rank if costs.vpp == 1 else chunk.max(axis=1)
    return float((num_microbatches - 1) * rank.max() + tail.sum())


class _Rows:
    """Sparse rows ``lower <= A x <= upper``."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def add(self, cols, vals, lower: float = -np.inf, upper: float = np.inf) -> None:
        cols = np.asarray(cols, dtype=np.int64).ravel()
        self.rows.append(np.full(len(cols), len(self.lower), dtype=np.int64))
        self.cols.append(cols)
        self.vals.append(np.broadcast_to(np.asarray(vals, dtype=np.float64).ravel(), cols.shape).copy())
        self.lower.append(lower)
        self.upper.append(upper)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.concatenate(self.rows), np.concatenate(self.cols), np.concatenate(self.vals)


class _Program:
    """Columns, bounds, integrality, rows and cost of the program (module docstring)."""

    def __init__(self, costs: ChunkCosts, options: np.ndarray, num_microbatches: int, upper_bound_s: float | None,
                 floor_s: np.ndarray | None = None, floor_kind: int | None = None):
        pp, vpp, layers = costs.pp, costs.vpp, costs.kind_layers
        num_kinds, num_opts = len(layers), len(options)
        self.costs, self.options, self.m = costs, options, num_microbatches
        # Units: the fastest layer's time and the memory limit, so that coefficients are near 1
        # whatever the table's scale (HiGHS's tolerances are absolute, 1e-7).
        fastest_s = float(costs.time_s[:, options].min())
        self.ms = MS = 1.0 / fastest_s if fastest_s > 0 else 1e3
        self.gib = GIB = costs.memory_limit_bytes
        time = costs.time_s[:, options] * MS  # (K, O)
        act = costs.activation_bytes[:, options] / GIB
        static = costs.static_bytes / GIB
        fixed_t = costs.stage_time_s[:, options] * MS  # (pp, O)
        fixed_m = costs.stage_bytes[:, options] / GIB
        base_t, base_m = fixed_t.min(axis=1), fixed_m.min(axis=1)
        extra_t, extra_m = fixed_t - base_t[:, None], fixed_m - base_m[:, None]
        limit = costs.memory_limit_bytes / GIB
        total = int(layers.sum())

        columns: list[tuple[str, int]] = []
        lower: list[np.ndarray] = []
        upper: list[np.ndarray] = []
        integer: list[np.ndarray] = []

        def block(name: str, shape: tuple[int, ...], lo, hi, is_int: bool) -> np.ndarray:
            size = int(np.prod(shape))
            start = sum(n for _, n in columns)
            columns.append((name, size))
            lower.append(np.broadcast_to(np.asarray(lo, float), shape).ravel().copy())
            upper.append(np.broadcast_to(np.asarray(hi, float), shape).ravel().copy())
            integer.append(np.full(size, is_int))
            return start + np.arange(size).reshape(shape)

        # Bounds on T: some rank holds ceil(L / pp) layers; the warm start caps it.
        fastest = time.min(axis=1)  # (K,)
        t_low = math.ceil(total / pp) * fastest.min() + base_t.min()
        t_high = np.inf if upper_bound_s is None else bottleneck_bound_s(costs, options, num_microbatches,
                                                                         upper_bound_s) * MS
        # floor_kind: the floors count that kind's layers only (the other kinds add their fastest time)
        held, each = (total, 1) if floor_kind is None else (int(layers[floor_kind]), 0)
        if floor_s is not None:  # the least bottleneck at which the ranks can hold every layer (of the kind)
            floor = np.maximum.accumulate(floor_s[:, 1:] * MS, axis=1)  # n = 1.. (a true floor is monotone)
            levels = np.unique(floor[np.isfinite(floor)])
            capacity = np.stack([np.searchsorted(row, levels, side="right") for row in floor])  # (pp, levels)
            ok = np.flatnonzero((capacity.min(axis=0) >= each) & (capacity.sum(axis=0) >= held))
            if len(ok):
                t_low = max(t_low, float(levels[ok[0]]))
        per_layer_m = static[:, None] + costs.in_flight.min(axis=1)[:, None, None] * act[None]  # (pp, K, O)
        cap_mem = np.floor((limit - base_m) / np.maximum(per_layer_m.min(axis=(1, 2)), 1e-12))
        cap_time = np.floor((t_high - base_t) / fastest.min()) if np.isfinite(t_high) else np.full(pp, total)
        cap = np.clip(np.minimum(cap_mem, cap_time), 0, total)  # (pp,) layers a rank may hold
        if floor_s is not None and floor_kind is None:
            cap = np.minimum(cap, [np.flatnonzero(np.isfinite(row)).max(initial=0) for row in floor_s])
        self.cap = cap

        self.x = block("x", (pp, vpp, num_kinds, num_opts), 0, cap[:, None, None, None], True)
        self.d = self.z = None
        if num_kinds > 1:
            self.d = block("d", (pp * vpp - 1, num_kinds), 0, layers[None, :], True)
            self.z = block("z", (pp * vpp - 1, num_kinds - 1), 0, 1, True)
        need_y = (extra_t > 0) | (extra_m > 0)  # (pp, O)
        self.y = block("y", (pp, num_opts), 0, np.where(need_y, 1.0, 0.0), True)
        self.ft = block("ft", (pp,), 0, extra_t.max(axis=1), False)
        self.fm = block("fm", (pp,), 0, extra_m.max(axis=1), False)
        self.t = block("t", (pp,), 0, np.inf, False)
        self.c = block("c", (pp,), 0, np.inf, False) if vpp > 1 else self.t
        self.T = block("T", (1,), t_low, t_high, False)[0]
        self.num_cols = sum(n for _, n in columns)
        self.lower, self.upper = np.concatenate(lower), np.concatenate(upper)
        self.integer = np.concatenate(integer)

        rows = _Rows()
        x = self.x
        # layers of each kind, in layer order over the virtual stages
        if num_kinds == 1:
            rows.add(x, 1.0, total, total)
        else:
            for j in range(pp * vpp):
                v, r = divmod(j, pp)
                for k in range(num_kinds):
                    cols, vals, const = [x[r, v, k]], [np.ones(num_opts)], 0.0
                    if j + 1 < pp * vpp:
                        cols.append([self.d[j, k]]), vals.append([-1.0])
                    else:
                        const -= layers[k]
                    if j > 0:
                        cols.append([self.d[j - 1, k]]), vals.append([1.0])
                    rows.add(np.concatenate(cols), np.concatenate(vals), -const, -const)
            for j in range(pp * vpp - 1):
                for k in range(num_kinds - 1):
                    rows.add([self.d[j, k], self.z[j, k]], [1.0, -layers[k]], 0.0)
                    rows.add([self.d[j, k + 1], self.z[j, k]], [1.0, -layers[k + 1]], upper=0.0)
                    if j > 0:
                        rows.add([self.d[j, k], self.d[j - 1, k]], [1.0, -1.0], 0.0)
        for r in range(pp):
            rows.add(x[r], 1.0, 1.0, cap[r])  # every rank holds a layer
            for o in np.flatnonzero(need_y[r]):
                rows.add(np.concatenate([x[r, :, :, o].ravel(), [self.y[r, o]]]),
                         np.concatenate([np.ones(vpp * num_kinds), [-max(cap[r], 1.0)]]), upper=0.0)
                if extra_t[r, o] > 0:
                    rows.add([self.ft[r], self.y[r, o]], [1.0, -extra_t[r, o]], 0.0)
                if extra_m[r, o] > 0:
                    rows.add([self.fm[r], self.y[r, o]], [1.0, -extra_m[r, o]], 0.0)
            layer_t = np.broadcast_to(time[None], (vpp, num_kinds, num_opts))
            rows.add(np.concatenate([x[r].ravel(), [self.ft[r], self.t[r]]]),
                     np.concatenate([layer_t.ravel(), [1.0, -1.0]]), -base_t[r], -base_t[r])
            rows.add([self.T, self.t[r]], [1.0, -1.0], 0.0)
            if floor_s is not None:  # t[r] above the lower convex envelope of the rank's floor
                points = floor_s[r] * MS
                if floor_kind is not None:  # a rank may hold none of the kind: its fixed part alone
                    points = np.concatenate([[base_t[r]], points[1:]])
                    # and no more of it than its floor covers (beyond: no fit, or slower than the warm start)
                    rows.add(x[r, :, floor_kind].ravel(), 1.0, upper=float(np.flatnonzero(np.isfinite(points)).max()))
                for slope, intercept in _envelope(points, first=0 if floor_kind is not None else 1):
                    per_layer = np.full(x[r].shape, -slope)
                    if floor_kind is not None:  # the other kinds' layers at their fastest option
                        per_layer[:] = -fastest[None, :, None]
                        per_layer[:, floor_kind] = -slope
                    rows.add(np.concatenate([x[r].ravel(), [self.t[r]]]),
                             np.concatenate([per_layer.ravel(), [1.0]]), intercept)
            mem = static[None, :, None] + costs.in_flight[r][:, None, None] * act[None]  # (vpp, K, O)
            rows.add(np.concatenate([x[r].ravel(), [self.fm[r]]]), np.concatenate([mem.ravel(), [1.0]]),
                     upper=limit - base_m[r])
            if vpp > 1:
                for v in range(vpp):
                    on = v == costs.holder[r]
                    cols = np.concatenate([x[r, v].ravel(), [self.c[r]] + ([self.ft[r]] if on else [])])
                    vals = np.concatenate([-time.ravel(), [1.0] + ([-1.0] if on else [])])
                    rows.add(cols, vals, base_t[r] if on else 0.0)
        self.rows = rows
        self.cost = np.zeros(self.num_cols)
        self.cost[self.T] = num_microbatches - 1
        self.cost[self.c] += 1.0

    def point(self, counts: np.ndarray) -> np.ndarray:
        """Column values of ``counts`` ``(pp, vpp, K, O)`` (for a warm start)."""
        costs, pp, vpp = self.costs, self.costs.pp, self.costs.vpp
        col = np.zeros(self.num_cols)
        col[self.x] = counts
        if self.d is not None:
            per_stage = counts.sum(axis=3).transpose(1, 0, 2).reshape(pp * vpp, -1)  # virtual stage order
            before = np.cumsum(per_stage, axis=0)[:-1]
            col[self.d] = before
            col[self.z] = before[:, :-1] >= costs.kind_layers[None, :-1]
        used = counts.sum(axis=(1, 2)) > 0
        col[self.y] = used * (self.upper[self.y] > 0)
        fixed_t = costs.stage_time_s[:, self.options] * self.ms
        fixed_m = costs.stage_bytes[:, self.options] / self.gib
        col[self.ft] = np.max(np.where(col[self.y] > 0, fixed_t - fixed_t.min(axis=1)[:, None], 0.0), axis=1)
        col[self.fm] = np.max(np.where(col[self.y] > 0, fixed_m - fixed_m.min(axis=1)[:, None], 0.0), axis=1)
        time = costs.time_s[:, self.options] * self.ms
        chunk = (counts * time[None, None]).sum(axis=(2, 3))
        chunk[np.arange(pp), costs.holder] += fixed_t.min(axis=1) + col[self.ft]
        col[self.t] = chunk.sum(axis=1)
        if vpp > 1:
            col[self.c] = chunk.max(axis=1)
        col[self.T] = col[self.t].max()
        return col

    def counts(self, col: np.ndarray) -> np.ndarray:
        return np.rint(col[self.x]).astype(np.int64)


def _envelope(values: np.ndarray, first: int = 1) -> list[tuple[float, float]]:
    """``(slope, intercept)`` of each segment of the lower convex envelope of the finite points
    ``(n, values[n])``, ``n >= first`` (monotone chain); a line through one point is level."""
    n = np.flatnonzero(np.isfinite(values))
    n = n[n >= first]
    hull: list[int] = []
    for i in n:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (values[b] - values[a]) * (i - a) >= (values[i] - values[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(int(i))
    if len(hull) == 1:
        return [(0.0, float(values[hull[0]]))]
    return [((values[b] - values[a]) / (b - a), values[a] - (values[b] - values[a]) / (b - a) * a)
            for a, b in zip(hull[:-1], hull[1:])]


def _solve_highs(prog: _Program, warm: np.ndarray | None, time_limit_s: float):
    import highspy

    with _quiet_stdout():
        h = highspy.Highs()
    h.silent()
    lp = highspy.HighsLp()
    rows, cols, vals = prog.rows.arrays()
    lp.num_col_, lp.num_row_ = prog.num_cols, len(prog.rows.lower)
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = prog.cost, prog.lower, prog.upper
    lp.row_lower_, lp.row_upper_ = np.array(prog.rows.lower), np.array(prog.rows.upper)
    order = np.lexsort((rows, cols))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols[order], np.arange(prog.num_cols + 1)).astype(np.int32)
    lp.a_matrix_.index_ = rows[order].astype(np.int32)
    lp.a_matrix_.value_ = vals[order]
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in prog.integer]
    h.passModel(lp)
    highs_run.configure(h, time_limit_s)
    h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
    if warm is not None:
        start = highspy.HighsSolution()
        start.col_value = list(prog.point(warm))
        start.value_valid = True
        h.setSolution(start)
    highs_run.run(h)
    status, info = h.getModelStatus(), h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has else None
    optimal = status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible)
    hit = status == highspy.HighsModelStatus.kTimeLimit
    bound = float(info.mip_dual_bound) if has else None
    return x, optimal, hit, bound


def _solve_scipy(prog: _Program, time_limit_s: float):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    rows, cols, vals = prog.rows.arrays()
    a = coo_matrix((vals, (rows, cols)), shape=(len(prog.rows.lower), prog.num_cols))
    res = milp(prog.cost, constraints=[LinearConstraint(a, prog.rows.lower, prog.rows.upper)],
               integrality=prog.integer.astype(int), bounds=Bounds(prog.lower, prog.upper),
               options={"time_limit": time_limit_s, "disp": False, "mip_rel_gap": MIP_REL_GAP})
    bound = getattr(res, "mip_dual_bound", None)
    return res.x, res.status in (0, 2), res.status == 1, (None if bound is None else float(bound))


def solve(costs: ChunkCosts, options: np.ndarray, num_microbatches: int, warm: np.ndarray | None,
          time_limit_s: float, floor_s: np.ndarray | None = None, floor_kind: int | None = None) -> ChunkSolution:
    """Best chunk counts and recompute counts among ``options`` (column indices of ``costs``).

    Args:
        warm: a feasible ``(pp, vpp, K, R)`` full-table counts to start from (or None).
        time_limit_s: wall-clock limit of the solver.
        floor_s: ``(pp, L + 1)`` least seconds per micro-batch of each rank holding ``n`` layers
            (:func:`autopar.pipeline.warm_start.rank_time_floor_s`, one layer kind), or None: it
            bounds ``T`` below, caps each rank's layers and adds the lower convex envelope of
            each rank's floor as cuts on ``t[r]``.
        floor_kind: with several kinds, the kind ``floor_s`` counts (``(pp, n_k + 1)``, from
            that kind alone): the cuts add the other kinds' layers at their fastest option, the
            envelope starts at 0 layers (the rank's fixed part) and ``T`` is bounded by where the
            ranks hold every layer of the kind.
    """
    options = np.asarray(options, dtype=np.int64)
    upper = None if warm is None else objective_s(costs, warm, num_microbatches)
    prog = _Program(costs, options, num_microbatches, upper, floor_s, floor_kind)
    start = None if warm is None else warm[..., options]
    try:
        import highspy  # noqa: F401
    except ImportError:
        x, optimal, hit, bound = _solve_scipy(prog, time_limit_s)
        solver = "scipy"
    else:
        x, optimal, hit, bound = _solve_highs(prog, start, time_limit_s)
        solver = "highs"
    if x is None:
        return ChunkSolution(None, optimal, None, hit, None, None, solver)
    chosen = prog.counts(x)
    counts = np.zeros(chosen.shape[:3] + (costs.forward_s.shape[1],), dtype=np.int64)
    counts[..., options] = chosen
    value = objective_s(costs, counts, num_microbatches)
    bound_s = None if bound is None else bound / prog.ms
    gap = None if bound_s is None else max(0.0, (value - bound_s) / value) if value > 0 else 0.0
    return ChunkSolution(counts, optimal, gap, hit, value, bound_s, solver)
