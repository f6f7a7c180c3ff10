"""The layer-wise search: Galvatron's outer loops around the per-stage dynamic programme.

For every pipeline degree ``pp`` (stages split as :func:`stage_split` and, for ``pp > 1``, as
Galvatron-BMW's memory- and time-balanced splits and steps between them:
:mod:`autopar.layerwise.splits`), micro-batch count ``m`` (Galvatron's ``chunks``) and default data-parallel type (DDP = ZeRO-0 or
ZeRO-2, Galvatron's ``default_dp_type``), each stage's layers get their (tp, ZeRO-3 or the
default, checkpoint) by :func:`autopar.layerwise.dp.solve_stage` within the stage's memory
budget (the device memory less the stage's fixed part at the vocabulary tp); the vocabulary tp
and its ZeRO-3 switch (Galvatron's ``vtp`` and ``embed_sdp``) are searched around it, and every
assembled plan is costed whole by :func:`autopar.layerwise.evaluate.cost_from_tables`. The
structure is Galvatron's (Miao et al., VLDB 2023, sec. 4.2 "Search space decomposition":
pp outermost, then the batch, then the DP over layers per stage; Galvatron-BMW, TPDS 2024,
sec. 4, the same with the memory budget per stage).

Per-layer objective of the DP: the layer's ``m`` micro-batches of forward, backward and recompute
plus its once-per-step data-parallel and optimizer time; transitions cost ``m`` re-shardings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from autopar.errors import AutoparError
from autopar.layerwise.dp import solve_stages
from autopar.layerwise.evaluate import PlanCost, build_fixed_tables, cost_from_tables
from autopar.layerwise.plan import LayerwisePlan, candidate_strategy, group_size, stage_slices
from autopar.layerwise.splits import balanced_splits
from autopar.layerwise.tables import Choices, PairTable, pair_tables
from autopar.problem import Problem
from autopar.strategy import default_layers_per_stage


@dataclass(frozen=True)
class LayerwiseResult:
    """The best plan found (None where nothing fits), its cost, and what was searched."""

    plan: LayerwisePlan | None
    cost: PlanCost | None
    plans_costed: int
    seconds: float
    cells: int = 0
    cells_solved: int = 0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def stage_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """The layers per stage the search uses: Megatron's default split
    (:func:`autopar.strategy.default_layers_per_stage`) where it exists, else as even as possible
    with the extra layers on the middle stages first (the first and last also hold the embedding
    and the output layer; Galvatron's ``pp_division`` takes any split). Needs ``pp <= num_layers``."""
    split = default_layers_per_stage(num_layers, pp)
    if split is not None:
        return tuple(split)
    base, extra = divmod(num_layers, pp)
    order = list(range(1, pp - 1)) + [0, pp - 1]  # who gets one more layer first
    out = [base] * pp
    for i in order[:extra]:
        out[i] += 1
    return tuple(out)


def _microbatch_counts(p: Problem, pp: int, tps: list[int]) -> list[int]:
    """Micro-batch counts ``m`` for which some tp has a whole micro-batch (gbs % (dp * m) == 0)."""
    gbs, world = p.train.global_batch_size, p.world_size
    return sorted({m for t in tps for m in _divisors(gbs // (world // (pp * t)))
                   if gbs % (world // (pp * t)) == 0})


@dataclass
class _Best:
    plan: LayerwisePlan | None = None
    cost: PlanCost | None = None
    costed: int = 0
    tables: dict | None = None  # the best plan's cell's pair tables, to cost it in full at the end
    fixed: dict | None = None  # and its fixed parts' tables (autopar.layerwise.evaluate.fixed_parts)

    def offer(self, plan: LayerwisePlan, cost: PlanCost, tables: dict | None = None, fixed: dict | None = None) -> None:
        self.costed += 1
        if cost.fits and (self.cost is None or cost.step_time_s < self.cost.step_time_s):
            self.plan, self.cost, self.tables, self.fixed = plan, cost, tables, fixed


@dataclass
class _Cell:
    """One (pp, m, default dp type) cell: its pair tables and, per variant (0: no checkpointing,
    the stages' fixed part without it; 1: checkpointing allowed), its choices."""

    pp: int
    m: int
    split: tuple[int, ...]
    default_zero: int
    tables: dict[tuple[int, int, bool], PairTable]
    pairs: list[PairTable]
    variants: list[Choices]
    sp: bool = False
    fixed: dict = field(default_factory=dict)  # fixed parts' tables beyond ``tables`` (evaluate.fixed_parts)

    def slices(self) -> list[slice]:
        return stage_slices(self.split)

    def vocab_keys(self) -> list[tuple[int, int, bool]]:
        """The vocabulary (tp, zero, False) options: the default type, and 3 where ZeRO-3 is
        searched (never Ulysses: Galvatron's vsp is not searched)."""
        zeros = {s.strategy.zero for s in self.pairs}
        return sorted(k for k in self.tables if k[1] in zeros and not k[2])

    def lower_bound_s(self, limit: float) -> float:
        """A step time no plan of the cell beats: every layer at its fastest choice and each stage's
        fixed part at its least compute (its collectives, which re-shard to the next layer's tp
        (:func:`autopar.layerwise.evaluate.fixed_parts`), and its once-per-step time left out:
        its compute does not depend on the vocabulary's tp), memory ignored, in the makespan of
        :mod:`autopar.layerwise.evaluate`; inf where even each layer's and the fixed part's least
        memory (as the DP budgets it, at the vocabulary's own tp) overflows a stage."""
        c, vocab = self.variants[-1], [self.tables[k] for k in self.vocab_keys()]
        for i, sl in enumerate(self.slices()):
            least = (c.static_bytes[:, sl] + self.pairs[0].in_flight[i] * c.activation_bytes[:, sl]).min(axis=0).sum()
            if least + min(float(v.stage_bytes[i].min()) for v in vocab) > limit:
                return float("inf")
        t = [float(c.microbatch_s[:, sl].min(axis=0).sum())
             + min(float(v.stage_compute_parts_s[:, i].sum(axis=0).min()) for v in vocab)
             for i, sl in enumerate(self.slices())]
        step = [float(c.step_s[:, sl].min(axis=0).sum()) for i, sl in enumerate(self.slices())]
        return sum(t) + (self.m - 1) * max(t) + max(step)

    def plans(self, p: Problem, limit: float, bins: int) -> list[LayerwisePlan]:
        """Solve each stage's DP once per variant; one plan per variant and vocabulary option whose
        stages all fit (the budget: ``limit`` less the stage's fixed part at that option)."""
        out = []
        for variant, c in enumerate(self.variants):
            solved = []
            for i, sl in enumerate(self.slices()):
                t = (self.m * c.microbatch_s[:, sl] + c.step_s[:, sl]).T
                mem = (c.static_bytes[:, sl] + self.pairs[0].in_flight[i] * c.activation_bytes[:, sl]).T
                solved.append((t, mem))
            dps = _solve_grouped(solved, self.m * c.transition_s, limit, bins)
            for key in self.vocab_keys():
                vocab, layers = self.tables[key], []
                for i, dp in enumerate(dps):
                    _, pick = dp.best(limit - float(vocab.stage_bytes[i, variant]))
                    if pick is None:
                        break
                    layers += _grouped(pick, solved[i], c)
                if len(layers) != p.model.num_layers:
                    continue
                ks = np.array(layers)
                chosen = [self.pairs[i].strategy for i in c.pair[ks]]
                out.append(LayerwisePlan(pp=self.pp, num_microbatches=self.m, layers_per_stage=self.split,
                                         tp=tuple(group_size(s) for s in chosen),
                                         zero3=tuple(s.zero == 3 for s in chosen),
                                         recompute=tuple(bool(x) for x in c.col[ks]), default_zero=self.default_zero,
                                         vocab_tp=key[0], vocab_zero3=key[1] == 3, sp=self.sp,
                                         ulysses=tuple(s.cp > 1 for s in chosen)))
        return out


def _grouped(pick: np.ndarray, stage: tuple[np.ndarray, np.ndarray], c: Choices) -> list[int]:
    """``pick`` with equal choices next to each other inside each run of one tp, where the stage's
    layers all cost the same (a dense stage): the DP is indifferent to their order there (no
    re-sharding within a tp), and runs of equal layers are what Galvatron's JSON reads best."""
    t, mem = stage
    if not ((t == t[0]).all() and (mem == mem[0]).all()):
        return [int(k) for k in pick]
    out, start, tp = [], 0, [group_size(c.pairs[i].strategy) for i in c.pair[pick]]
    for j in range(1, len(pick) + 1):
        if j == len(pick) or tp[j] != tp[start]:
            out += sorted(int(k) for k in pick[start:j])
            start = j
    return out


def _solve_grouped(problems: list[tuple[np.ndarray, np.ndarray]], transition_s: np.ndarray, limit: float,
                   bins: int) -> list:
    """:func:`solve_stages` over stages of equal shape together; results in stage order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (t, _) in enumerate(problems):
        groups.setdefault(t.shape, []).append(i)
    out: list = [None] * len(problems)
    for idx in groups.values():
        moves = np.broadcast_to(transition_s, (len(idx),) + transition_s.shape)
        for i, dp in zip(idx, solve_stages(np.stack([problems[i][0] for i in idx]),
                                           np.stack([problems[i][1] for i in idx]), moves, limit, bins)):
            out[i] = dp
    return out


def _cell_keys(p: Problem, pps: list[int], tp_ok, m_ok) -> list[tuple[int, int, tuple[int, ...], list[int]]]:
    """(pp, m, default split, tps) of every cell: tp and m passing ``tp_ok`` / ``m_ok``."""
    out = []
    for pp in pps:
        tps = [t for t in _divisors(p.world_size // pp) if tp_ok(t)]
        out += [(pp, m, stage_split(p.model.num_layers, pp), tps) for m in filter(m_ok, _microbatch_counts(p, pp, tps))]
    return out


def _tables(p: Problem, keys: list[tuple[int, int, tuple[int, ...], list[int]]], zeros: list[int],
            sp: bool, ulysses: bool = False) -> dict[tuple[int, int, tuple[int, ...]], dict]:
    """{(pp, m, split): {(tp, zero, ulysses): PairTable}} for the cells ``keys``
    (:func:`_cell_keys`), from one vectorised pass; Ulysses layers for tp > 1 where ``ulysses``."""
    names, strategies = [], []
    for pp, m, split, tps in keys:
        for t, u in [(t, u) for t in tps for u in ((False, True) if ulysses and t > 1 else (False,))]:
            for z in zeros:
                try:
                    strategies.append(candidate_strategy(p, pp, m, split, t, z, False, sp, u))
                except AutoparError:
                    continue
                names.append(((pp, m, split), (t, z, u)))
    out: dict[tuple[int, int, tuple[int, ...]], dict] = {}
    for (cell, pair), table in zip(names, pair_tables(p, strategies)):
        if table is not None:
            out.setdefault(cell, {})[pair] = table
    return out


def _balanced_tables(p: Problem, keys: list, tables: dict, zeros: list[int], sp: bool, ulysses: bool) -> dict:
    """The cells of Galvatron-BMW's balanced splits of every pipelined cell of ``tables`` (the
    default split's; :func:`autopar.layerwise.splits.balanced_splits`) other than the default."""
    tps = {(pp, m): t for pp, m, _, t in keys}
    extra = [(pp, m, s, tps[(pp, m)]) for (pp, m, split), cell in tables.items() if pp > 1
             for s in balanced_splits(cell, sorted(k for k in cell if not k[2]), m) if s != split]
    return _tables(p, extra, zeros, sp, ulysses) if extra else {}


def search_layerwise(p: Problem, *, pp_options: list[int] | None = None, max_tp: int | None = None,
                     tp_options: list[int] | None = None, microbatch_options: list[int] | None = None,
                     sp: bool | None = False, recompute: bool = True, zero3: bool = True,
                     default_zeros: tuple[int, ...] = (0, 2), memory_limit_bytes: float | None = None,
                     bins: int = 512, balance: bool = True, ulysses: bool = True) -> LayerwiseResult:
    """The fastest layer-wise plan of ``p`` under autopar's cost model (module docstring): plans
    are compared by the closed-form 1F1B makespan, and the one returned is costed as ``autopar
    estimate`` costs a layout (its pipeline simulated where the stages differ:
    :func:`autopar.layerwise.evaluate.cost_from_tables`).

    Args:
        pp_options: pipeline degrees to try (default: every divisor of the world that the
            layers allow).
        max_tp: largest tp (default: the devices of a node).
        tp_options: only these tp degrees (default: all).
        microbatch_options: only these micro-batch counts (default: all).
        sp: Megatron sequence parallelism on the tp > 1 layers (one runtime switch); None tries
            both.
        recompute: allow per-layer checkpointing.
        zero3: allow per-layer ZeRO-3.
        default_zeros: the default data-parallel types to try (0 = DDP, 2 = ZeRO-2).
        memory_limit_bytes: usable bytes per device (default: the device's memory).
        bins: memory discretisation of the DP.
        balance: also try Galvatron-BMW's balanced pipeline splits
            (:mod:`autopar.layerwise.splits`) besides :func:`stage_split`'s.
        ulysses: with sp, also offer each tp > 1 layer as a Ulysses layer (Galvatron's
            ``use_sp``: :class:`~autopar.layerwise.plan.LayerwisePlan`).

    Raises:
        AutoparError: a MoE model (per-layer expert layouts are not searched), a bad option.
    """
    t0 = time.perf_counter()
    if p.model.is_moe:
        raise AutoparError(f"{p.model.name} is a MoE model: the layer-wise search plans dense decoder layers only")
    if any(z not in (0, 2) for z in default_zeros) or not default_zeros:
        raise AutoparError(f"default_zeros={default_zeros}: Galvatron's default data-parallel types are 0 (ddp) "
                           "and 2 (zero2)")
    limit = p.cluster.device.memory_bytes if memory_limit_bytes is None else float(memory_limit_bytes)
    if not limit > 0:
        raise AutoparError(f"memory_limit_bytes={limit}: must be positive")
    world, num_layers = p.world_size, p.model.num_layers
    max_tp = max_tp or p.cluster.devices_per_node
    pps = pp_options or [d for d in _divisors(world) if d <= num_layers]
    for pp in pps:
        if world % pp or pp > num_layers:
            raise AutoparError(f"pp={pp}: must divide the {world} devices and be at most the {num_layers} layers")
    zeros = sorted(set(default_zeros) | ({3} if zero3 else set()))
    tp_ok = lambda t: t <= max_tp and (tp_options is None or t in tp_options)
    m_ok = lambda m: microbatch_options is None or m in microbatch_options
    keys = _cell_keys(p, pps, tp_ok, m_ok)
    make = lambda by_cell, sp_on: [
        _Cell(pp, m, split, dz, tables, pairs,
              [Choices.of(p, pairs, recompute=False)] + ([Choices.of(p, pairs)] if recompute else []), sp_on)
        for (pp, m, split), tables in by_cell.items() for dz in default_zeros
        if (pairs := [tables[key] for key in sorted(tables) if key[1] in ((dz, 3) if zero3 else (dz,))])]
    best, cells, solved, default_tables = _Best(), 0, 0, []
    for sp_on in ([False, True] if sp is None else [sp]):
        by_cell = _tables(p, keys, zeros, sp_on, ulysses and sp_on)
        default_tables.append((sp_on, by_cell))
        batch = make(by_cell, sp_on)
        cells, solved = cells + len(batch), solved + _branch_and_bound(p, batch, best, limit, bins)
    if balance:  # the balanced splits of the (pp, m) cells whose split-free bound can still beat the best
        for sp_on, by_cell in default_tables:
            hopeful = {k: v for k, v in by_cell.items()
                       if best.cost is None or _split_free_bound_s(k[1], v) < best.cost.step_time_s}
            batch = make(_balanced_tables(p, keys, hopeful, zeros, sp_on, ulysses and sp_on), sp_on)
            cells, solved = cells + len(batch), solved + _branch_and_bound(p, batch, best, limit, bins)
    if best.plan is not None:  # the plan found by the closed form, costed as estimate costs a layout (simulated)
        best.cost = cost_from_tables(p, best.plan, best.tables, limit, simulate=True, fixed_tables=best.fixed)
    return LayerwiseResult(plan=best.plan, cost=best.cost, plans_costed=best.costed,
                           seconds=time.perf_counter() - t0, cells=cells, cells_solved=solved)


def _branch_and_bound(p: Problem, cells: list[_Cell], best: _Best, limit: float, bins: int) -> int:
    """Solve ``cells`` in order of their lower bound, stopping where it reaches ``best``'s step
    (updated in place); the number of cells solved."""
    solved = 0
    for bound, cell in sorted(((c.lower_bound_s(limit), c) for c in cells), key=lambda x: x[0]):
        if bound == float("inf") or (best.cost is not None and bound >= best.cost.step_time_s):
            break
        solved += 1
        plans = list({(q.tp, q.zero3, q.recompute, q.vocab_tp, q.vocab_zero3, q.ulysses): q
                      for q in cell.plans(p, limit, bins)}.values())
        build_fixed_tables(p, plans, cell.tables, cell.fixed)  # the plans' fixed parts, in one pass
        for plan in plans:
            best.offer(plan, cost_from_tables(p, plan, cell.tables, limit, fixed_tables=cell.fixed), cell.tables,
                       cell.fixed)
    return solved


def _split_free_bound_s(m: int, tables: dict[tuple[int, int, bool], PairTable]) -> float:
    """A step no plan of this (pp, m) beats under any split: the stages' per-micro-batch times
    ``t_i`` sum to at least the same ``T`` (each layer at its fastest choice, each stage's fixed part
    at its least compute, as :meth:`_Cell.lower_bound_s`) whatever the split, so the 1F1B makespan
    ``sum_i t_i + (m - 1) max_i t_i`` is at least ``T + (m - 1) T / pp``."""
    pairs = list(tables.values())
    pp = len(pairs[0].in_flight)
    total = float(np.min([t.microbatch_s.min(axis=1) for t in pairs], axis=0).sum())
    total += float(np.min([t.stage_compute_parts_s.sum(axis=0).min(axis=1) for t in pairs], axis=0).sum())
    return total + (m - 1) * total / pp
