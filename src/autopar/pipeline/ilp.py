"""Joint layer split and per-stage recompute choice as a mixed-integer program (HiGHS).

Staircase formulation (``shared/reference/ecosystem.md`` sec. 6: 10-20x faster than assignment
binaries): ``u[q, s] = 1`` iff position ``q`` lies in a stage ``<= s``, so stage ``s`` holds
``x[q, s] = u[q, s] - u[q, s-1]`` (``u[., -1] = 0``, ``u[., pp-1] = 1``), with
``u[q+1, s] <= u[q, s]`` and ``u[q, s] <= u[q, s+1]``. ``y[s, r] = 1`` picks stage ``s``'s
recompute option. Big-M rows make the chosen option's time a lower bound of the stage time
``T_s`` and its memory at most the limit; ``T >= T_s``. Objective:
``(m - 1) * T + sum_s T_s / vpp`` (:func:`autopar.pipeline.folded.surrogate_s`).

The caller's best single-option split is an upper bound (HiGHS ``objective_bound``); when
nothing better exists HiGHS proves infeasibility and the caller keeps its split. The bound also
fixes most binaries: a better answer has a bottleneck ``T <= (bound - lowest possible sum / vpp)
/ (m - 1)``, and greedy packing under that ``T`` (fastest option, memory ignored) gives each
stage boundary a window it must lie in (:func:`boundary_windows`); outside it ``u`` is fixed. Solved with
``highspy`` (quiet; its banner goes to /dev/null), or ``scipy.optimize.milp`` if highspy cannot
be imported. Units inside: milliseconds and GiB, to keep coefficients near 1.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from autopar.pipeline import highs_run
from autopar.pipeline.folded import FoldedTable

MS, GIB = 1e3, 2.0**30


@dataclass(frozen=True)
class IlpResult:
    """``bounds`` ``(pp+1,)`` and ``options`` ``(pp,)`` (column indices), or None if nothing beat
    the upper bound; ``optimal``: the search finished (no better split exists if ``bounds`` is
    None); ``solver``: ``highs``, ``scipy``, or ``bounds`` when the boundary windows alone
    prove that nothing beats the upper bound."""

    bounds: np.ndarray | None
    options: np.ndarray | None
    optimal: bool
    solver: str


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null (HiGHS prints its banner from C++ on construction)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Model:
    """Sparse rows ``lower <= A x <= upper`` over the columns u, y, T_s, T."""

    def __init__(self, positions: int, pp: int, num_options: int):
        self.positions, self.pp, self.num_options = positions, pp, num_options
        self.num_u = positions * (pp - 1)
        self.y0 = self.num_u
        self.t0 = self.y0 + pp * num_options
        self.num_cols = self.t0 + pp + 1
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []

    def u(self, q: np.ndarray, s: int) -> np.ndarray:
        return np.asarray(q) * (self.pp - 1) + s

    def add(self, cols: np.ndarray, vals: np.ndarray, lower: float, upper: float) -> None:
        row = len(self.lower)
        self.rows += [row] * len(cols)
        self.cols += list(np.asarray(cols, dtype=np.int64))
        self.vals += list(np.asarray(vals, dtype=np.float64))
        self.lower.append(lower)
        self.upper.append(upper)

    def stage_sum(self, coef: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Columns, values and constant of ``sum_q coef[q] * x[q, s]``."""
        q = np.arange(self.positions)
        cols, vals, const = [], [], 0.0
        if s < self.pp - 1:
            cols.append(self.u(q, s))
            vals.append(coef)
        else:
            const = float(coef.sum())
        if s > 0:
            cols.append(self.u(q, s - 1))
            vals.append(-coef)
        return np.concatenate(cols), np.concatenate(vals), const


def _build(table: FoldedTable, options: np.ndarray, num_microbatches: int, vpp: int) -> tuple[_Model, np.ndarray]:
    positions, pp, num_options = table.positions, table.pp, len(options)
    model = _Model(positions, pp, num_options)
    inf = np.inf
    for s in range(pp - 1):
        q = np.arange(positions - 1)
        for a, b in zip(model.u(q + 1, s), model.u(q, s)):
            model.add(np.array([a, b]), np.array([1.0, -1.0]), -inf, 0.0)
        if s < pp - 2:
            for a, b in zip(model.u(np.arange(positions), s), model.u(np.arange(positions), s + 1)):
                model.add(np.array([a, b]), np.array([1.0, -1.0]), -inf, 0.0)
    ones = np.ones(positions)
    limit = table.memory_limit_bytes / GIB
    for s in range(pp):
        cols, vals, const = model.stage_sum(ones, s)
        model.add(cols, vals, 1.0 - const, inf)  # non-empty
        y = model.y0 + s * num_options + np.arange(num_options)
        model.add(y, np.ones(num_options), 1.0, 1.0)
        for k, option in enumerate(options):
            time = np.diff(table.time_s[:, option]) * MS
            fixed_t = table.stage_time_s[s, option] * MS
            cols, vals, const = model.stage_sum(time, s)
            big = time.sum() + fixed_t
            model.add(np.concatenate([cols, [y[k], model.t0 + s]]), np.concatenate([vals, [big, -1.0]]),
                      -inf, big - fixed_t - const)
            mem = (np.diff(table.static_bytes) + table.in_flight[s] * np.diff(table.activation_bytes[:, option])) / GIB
            fixed_m = table.stage_bytes[s, option] / GIB
            big = max(mem.sum() + fixed_m - limit, 0.0)
            cols, vals, const = model.stage_sum(mem, s)
            model.add(np.concatenate([cols, [y[k]]]), np.concatenate([vals, [big]]), -inf,
                      limit + big - fixed_m - const)
        model.add(np.array([model.t0 + pp, model.t0 + s]), np.array([1.0, -1.0]), 0.0, inf)
    cost = np.zeros(model.num_cols)
    cost[model.t0:model.t0 + pp] = 1.0 / vpp
    cost[model.t0 + pp] = num_microbatches - 1
    return model, cost


def boundary_windows(table: FoldedTable, options: np.ndarray, bottleneck_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Lowest and highest possible value of each boundary ``bounds[s]``, shapes ``(pp + 1,)``,
    for splits whose every rank takes at most ``bottleneck_s`` with some option (greedy packing
    from either end is optimal for contiguous segments under a bound)."""
    positions, pp = table.positions, table.pp
    time = table.time_s[:, options]  # (K+1, R), increasing in the position

    def reach(rank: int, start: int, forward: bool) -> int:
        best = start
        for k, r in enumerate(options):
            budget = bottleneck_s - table.stage_time_s[rank, r]
            if forward:
                best = max(best, int(np.searchsorted(time[:, k], time[start, k] + budget * (1 + 1e-12), "right")) - 1)
            else:
                best = min(best, int(np.searchsorted(time[:, k], time[start, k] - budget * (1 + 1e-12), "left")))
        return best

    hi, lo = np.zeros(pp + 1, dtype=np.int64), np.zeros(pp + 1, dtype=np.int64)
    hi[pp] = lo[pp] = positions
    for s in range(1, pp):
        hi[s] = min(reach(s - 1, hi[s - 1], True), positions - (pp - s))
    for s in range(pp - 1, 0, -1):
        lo[s] = max(reach(s, lo[s + 1], False), s)
    return lo, hi


def _decode(model: _Model, x: np.ndarray, options: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = np.rint(x[:model.num_u]).reshape(model.positions, model.pp - 1)
    sizes = np.diff(np.concatenate([np.zeros(1), u.sum(axis=0), [model.positions]]))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    y = np.rint(x[model.y0:model.t0]).reshape(model.pp, model.num_options)
    return bounds, options[np.argmax(y, axis=1)]


def _solve_highs(model: _Model, cost: np.ndarray, integer: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                 bound: float, time_limit_s: float):
    import highspy

    with _quiet_stdout():
        h = highspy.Highs()
    h.silent()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.num_cols, len(model.lower)
    lp.col_cost_ = cost
    lp.col_lower_ = lower
    lp.col_upper_ = upper
    lp.row_lower_ = np.array(model.lower)
    lp.row_upper_ = np.array(model.upper)
    cols, rows, vals = np.array(model.cols), np.array(model.rows), np.array(model.vals)
    order = np.lexsort((rows, cols))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols[order], np.arange(model.num_cols + 1)).astype(np.int32)
    lp.a_matrix_.index_ = rows[order].astype(np.int32)
    lp.a_matrix_.value_ = vals[order]
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in integer]
    h.passModel(lp)
    highs_run.configure(h, time_limit_s)
    h.setOptionValue("objective_bound", float(bound))
    highs_run.run(h)
    status = h.getModelStatus()
    optimal = status in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible,
                         highspy.HighsModelStatus.kObjectiveBound)
    has_solution = h.getInfo().primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value) if has_solution else None
    return x, optimal


def _solve_scipy(model: _Model, cost: np.ndarray, integer: np.ndarray, lower: np.ndarray, upper: np.ndarray,
                 bound: float, time_limit_s: float):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    a = coo_matrix((model.vals, (model.rows, model.cols)), shape=(len(model.lower), model.num_cols))
    rows = [LinearConstraint(a, model.lower, model.upper), LinearConstraint(cost[None, :], -np.inf, bound)]
    res = milp(cost, constraints=rows, integrality=integer.astype(int), bounds=Bounds(lower, upper),
               options={"time_limit": time_limit_s, "disp": False})
    return (res.x if res.x is not None else None), res.status in (0, 2)  # 0 optimal, 2 infeasible


def solve(table: FoldedTable, options: np.ndarray, num_microbatches: int, vpp: int, upper_bound_s: float,
          time_limit_s: float) -> IlpResult:
    """Best split and per-stage option among ``options`` (column indices of the table) whose
    objective beats ``upper_bound_s`` (seconds), within ``time_limit_s``."""
    options = np.asarray(options, dtype=np.int64)
    if table.pp == 1:
        return IlpResult(None, None, True, "none")
    model, cost = _build(table, options, num_microbatches, vpp)
    integer = np.zeros(model.num_cols, dtype=bool)
    integer[:model.t0] = True
    upper = np.full(model.num_cols, np.inf)
    upper[:model.t0] = 1.0
    lower = np.zeros(model.num_cols)
    lowest_sum = (np.diff(table.time_s[:, options], axis=0).min(axis=1).sum()
                  + table.stage_time_s[:, options].min(axis=1).sum()) / vpp
    lo, hi = boundary_windows(table, options, (upper_bound_s - lowest_sum) / max(num_microbatches - 1, 1))
    if np.any(lo > hi):
        return IlpResult(None, None, True, "bounds")
    q = np.arange(table.positions)
    for s in range(table.pp - 1):  # boundary s + 1 = positions in stages <= s
        lower[model.u(q[q < lo[s + 1]], s)] = 1.0
        upper[model.u(q[q >= hi[s + 1]], s)] = 0.0
    bound = upper_bound_s * MS * (1 - 1e-9)
    try:
        import highspy  # noqa: F401
    except ImportError:
        x, optimal = _solve_scipy(model, cost, integer, lower, upper, bound, time_limit_s)
        solver = "scipy"
    else:
        x, optimal = _solve_highs(model, cost, integer, lower, upper, bound, time_limit_s)
        solver = "highs"
    if x is None:
        return IlpResult(None, None, optimal, solver)
    bounds, chosen = _decode(model, x, options)
    return IlpResult(bounds, chosen, optimal, solver)
