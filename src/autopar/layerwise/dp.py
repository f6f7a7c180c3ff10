"""The dynamic programme over the layers of one pipeline stage (pure numpy).

Galvatron's formulation (Miao et al., VLDB 2023, sec. 4.2, Eq. 2; Galvatron-BMW, Wang et al.,
TPDS 2024, sec. 4.2): with layers ``1..n``, memory budget ``E`` and choices ``S``,

    C(l, e, s) = T(l, s) + min_{s'} [ C(l-1, e - M(l, s), s') + R(s', s) ]

where ``T(l, s)`` is layer ``l``'s time under choice ``s``, ``M(l, s)`` its memory and
``R(s', s)`` the re-sharding cost between consecutive layers; the answer is
``min_s C(n, E, s)``. Every plan spends at least each layer's smallest memory; what a choice
costs above that is discretised into ``bins`` equal units of the largest budget's spare bytes,
rounded up to whole units (so a plan found within a budget fits it). ``C`` is kept as "memory used at most e", non-increasing in ``e``, so one pass answers
every budget up to the largest at once (:meth:`StageDP.best`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StageDP:
    """The solved programme of one stage.

    Attributes:
        cost: ``(bins + 1, K)`` least time of all the stage's layers, last layer's choice ``k``,
            memory at most ``e`` units (inf where none fits).
        back: ``(n, bins + 1, K)`` the previous layer's choice at each state after layer ``l``
            (row 0 unused).
        units: ``(n, K)`` memory units of each layer's choices.
        unit_bytes: bytes per unit.
        floor_bytes: the sum of each layer's smallest memory (spent by every plan).
    """

    cost: np.ndarray
    back: np.ndarray
    units: np.ndarray
    unit_bytes: float
    floor_bytes: float

    def best(self, budget_bytes: float) -> tuple[float, np.ndarray | None]:
        """(least time, choice per layer) within ``budget_bytes``; (inf, None) where none fits."""
        spare = budget_bytes - self.floor_bytes
        if spare < 0:
            return float("inf"), None
        e = int(np.floor(min(spare / self.unit_bytes, self.cost.shape[0] - 1) + 1e-9))
        if e < 0:
            return float("inf"), None
        k = int(np.argmin(self.cost[e]))
        if not np.isfinite(self.cost[e, k]):
            return float("inf"), None
        total = float(self.cost[e, k])
        n = self.units.shape[0]
        out = np.empty(n, dtype=np.int64)
        for layer in range(n - 1, -1, -1):
            out[layer] = k
            if layer:  # back[layer] is indexed by the state after this layer
                k, e = int(self.back[layer, e, k]), e - int(self.units[layer, k])
        return total, out


def solve_stage(time_s: np.ndarray, memory_bytes: np.ndarray, transition_s: np.ndarray, max_budget_bytes: float,
                bins: int = 512) -> StageDP:
    """Solve the programme of one stage for every budget up to ``max_budget_bytes``.

    Args:
        time_s: ``(n, K)`` time of each layer under each choice (seconds).
        memory_bytes: ``(n, K)`` memory of each layer under each choice (bytes).
        transition_s: ``(K, K)`` cost from choice ``k'`` on a layer to ``k`` on the next.
        max_budget_bytes: the largest budget to be asked (must be positive).
        bins: memory units (the discretisation).

    Raises:
        ValueError: shapes that disagree, a non-positive budget or bins.
    """
    return solve_stages(np.asarray(time_s)[None], np.asarray(memory_bytes)[None], np.asarray(transition_s)[None],
                        max_budget_bytes, bins)[0]


def solve_stages(time_s: np.ndarray, memory_bytes: np.ndarray, transition_s: np.ndarray, max_budget_bytes: float,
                 bins: int = 512) -> list[StageDP]:
    """:func:`solve_stage` for ``B`` independent stages at once (arrays with a leading ``B``
    axis: ``(B, n, K)``, ``(B, n, K)``, ``(B, K, K)``), one numpy pass per layer for all.

    Raises:
        ValueError: shapes that disagree, a non-positive budget or bins.
    """
    time_s, memory_bytes = np.asarray(time_s, dtype=np.float64), np.asarray(memory_bytes, dtype=np.float64)
    transition_s = np.asarray(transition_s, dtype=np.float64)
    if time_s.ndim != 3 or memory_bytes.shape != time_s.shape or time_s.shape[1] < 1:
        raise ValueError(f"shapes time {time_s.shape}, memory {memory_bytes.shape} must be equal (B, n, K)")
    b, n, k = time_s.shape
    if transition_s.shape != (b, k, k):
        raise ValueError(f"transition shape {transition_s.shape} must be {(b, k, k)}")
    if not max_budget_bytes > 0 or bins < 1:
        raise ValueError(f"max_budget_bytes={max_budget_bytes}, bins={bins}: must be positive")
    least = memory_bytes.min(axis=2, keepdims=True)  # (B, n, 1) spent by every plan
    floor = least.sum(axis=(1, 2))
    unit = np.maximum(max_budget_bytes - floor, max_budget_bytes * 1e-9) / bins  # (B,)
    units = np.ceil((memory_bytes - least) / unit[:, None, None] - 1e-9).astype(np.int64)  # (B, n, K)
    # Choices whose transition rows and columns are equal (same tp) form a group: the best previous
    # choice is the best of each group (a min over K) then the best group (a min over G x G).
    members, group_of = _groups(transition_s)
    g = members.shape[0]
    first = members[:, 0]
    group_moves = transition_s[:, first][:, :, first]  # (B, G, G)
    e = np.arange(bins + 1)
    back = np.zeros((b, n, bins + 1, k), dtype=np.int16 if k < 2 ** 15 else np.int64)
    cost = np.where(e[None, :, None] >= units[:, 0][:, None, :], time_s[:, 0][:, None, :], np.inf)  # (B, E, K)
    rows_b, cols_k = np.arange(b)[:, None, None], np.arange(k)[None, None, :]
    padded = np.full((b, bins + 1, k + 1), np.inf)  # column 0: the padding of short groups
    for layer in range(1, n):
        padded[..., 1:] = cost
        in_group = padded[..., members + 1]  # (B, E, G, S)
        pick = np.argmin(in_group, axis=3)  # (B, E, G)
        group_best = np.take_along_axis(in_group, pick[..., None], axis=3)[..., 0]
        group_arg = members[np.arange(g)[None, None, :], pick]  # (B, E, G) choice index
        via = group_best[:, :, :, None] + group_moves[:, None, :, :]  # (B, E, G prev, G next)
        prev_group = np.argmin(via, axis=2)  # (B, E, G next)
        best_prev = np.take_along_axis(via, prev_group[:, :, None, :], axis=2)[:, :, 0, :][..., group_of]  # (B, E, K)
        arg = np.take_along_axis(group_arg, prev_group, axis=2)[..., group_of]
        shifted = e[None, :, None] - units[:, layer][:, None, :]  # state before this layer's memory
        ok = shifted >= 0
        at = np.clip(shifted, 0, bins)
        cost = np.where(ok, best_prev[rows_b, at, cols_k], np.inf) + time_s[:, layer][:, None, :]
        back[:, layer] = np.where(ok, arg[rows_b, at, cols_k], 0)
    return [StageDP(cost=cost[i], back=back[i], units=units[i], unit_bytes=float(unit[i]), floor_bytes=float(floor[i]))
            for i in range(b)]


def _groups(transition_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((G, S) member choices of each group, -1 padded; (K,) group of each choice): choices
    whose transition rows and columns are equal in every one of the ``B`` stages."""
    k = transition_s.shape[1]
    keys = [transition_s[:, j, :].tobytes() + transition_s[:, :, j].tobytes() for j in range(k)]
    labels: dict[bytes, int] = {}
    group_of = np.array([labels.setdefault(key, len(labels)) for key in keys], dtype=np.int64)
    size = np.bincount(group_of).max()
    members = np.full((len(labels), size), -1, dtype=np.int64)
    for gi in range(len(labels)):
        idx = np.flatnonzero(group_of == gi)
        members[gi, :len(idx)] = idx
    return members, group_of
