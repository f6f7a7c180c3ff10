"""Pipeline stage balancing: layers per stage (per chunk) and recompute per stage.

Given a :class:`~autopar.pipeline.layers.LayerTable` (per-layer time and memory for each
recompute option, fixed embedding/output parts per stage) and the schedule, :func:`balance`
picks the split and the recompute options that minimise the step time under the memory limit
of every device, then simulates the result (:mod:`autopar.pipeline.simulate`) and the default
(even, Megatron) split for comparison.

* ``form="explicit"``: layers per chunk (unequal chunks of one stage, empty chunks) and the
  number of layers of each chunk run with each recompute option, SAPP-PPB's problem, as one
  integer program (:mod:`autopar.pipeline.chunk_ilp`) started from an exact per-rank DP
  (:mod:`autopar.pipeline.warm_start`); it reports HiGHS's MIP gap. Tables of many distinct
  layers fall back to the equal-chunk positional DP and program (:mod:`autopar.pipeline.split`,
  :mod:`autopar.pipeline.ilp`).
* ``form="megatron"``: only splits Megatron-LM's ``--decoder-first/last-pipeline-num-layers``
  express (equal middle stages) and one recompute option for all stages (Megatron has a single
  ``--recompute-granularity``), enumerated exhaustively.

Outputs follow both conventions: Megatron's first/last stage layer counts (when the middle
stages are equal) or an explicit per-stage list, and MindSpore SAPP's ``offset`` (layers of each
stage and chunk minus ``L // (pp * vpp)``) and ``recompute`` arrays per stage and chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline import chunk_ilp, ilp
from autopar.pipeline.chunk_costs import ChunkCosts, chunk_costs, kind_alone, kind_counts
from autopar.pipeline.folded import fold, surrogate_s
from autopar.pipeline.layers import LayerTable
from autopar.pipeline.layout import PipelineLayout, default_layout
from autopar.pipeline.makespan import static_makespan_s
from autopar.pipeline.schedules import check_schedule, in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes, SimulationResult
from autopar.pipeline.split import dp_split, megatron_split
from autopar.pipeline.steady import simulate_bounded
from autopar.pipeline.warm_start import all_rank_candidates, greedy_counts, rank_time_floor_s, split_dp_counts

FORMS = ("explicit", "megatron")
# Real jobs run tens to a few thousand micro-batches per step. The simulation's cost does not grow
# with their number beyond a few pp (autopar.pipeline.steady extrapolates the steady state, within
# MAX_SIMULATED_OPS), so this only keeps the input in a meaningful range.
MAX_MICROBATCHES = 100_000
# The exact split is a dynamic program quadratic in the layer count, pp * (L/vpp)^2 per recompute
# option: 1,024 layers at pp 32 take ~0.3 s per option (split.min_max_split), 10,000 would take
# ~30 s and 400 MB per stage; the deepest published models have about 130 layers.
MAX_LAYERS = 1024
GIB = 2.0**30
STATIC_SCHEDULES = ("1f1b", "interleaved")  # costed without the event simulation (autopar.pipeline.makespan)
# Runs of identical layers the chunk program takes (Llama 1, DeepSeek-V3 2: dense, then MoE); a table
# of more distinct layers (a hand-written --layers file) is split by position with equal chunks.
MAX_KINDS = 4
TIME_LIMIT_S = 0.3  # the chunk program's default wall-clock limit (benchmarks/bench_balance.py)


@dataclass(frozen=True)
class PlanCost:
    """A split with its recompute counts, simulated: ``layers_per_chunk`` ``(pp, vpp)``,
    ``recompute_counts`` ``(pp, vpp, R)`` layers of each chunk run with each of ``options``
    (``R`` names), ``recompute`` ``(pp,)`` a label per stage (the option name where all its layers
    share one, else e.g. ``"2 none + 6 full"``), ``stage_memory_bytes`` ``(pp,)`` peak bytes per
    device, ``chunk_times`` the per-chunk seconds per micro-batch and ``chunk_activation_bytes``
    ``(pp, vpp)`` what one micro-batch keeps per chunk, ``makespan_s`` the simulated step of
    ``num_microbatches`` under ``schedule`` (:func:`autopar.pipeline.makespan.static_makespan_s`
    for the static schedules, the event simulation otherwise), ``objective_s`` the integer
    program's objective of this split (:func:`autopar.pipeline.chunk_ilp.objective_s`)."""

    layers_per_chunk: np.ndarray
    recompute_counts: np.ndarray
    options: tuple[str, ...]
    stage_memory_bytes: np.ndarray
    chunk_times: PipelineTimes
    chunk_activation_bytes: np.ndarray
    schedule: str
    num_microbatches: int
    makespan_s: float
    objective_s: float

    @cached_property
    def simulation(self) -> SimulationResult:
        """The event simulation with its timeline (:func:`autopar.pipeline.steady.simulate_bounded`),
        run when first asked for (a figure): 1.4 s for pp 16 x vpp 8 and 512 micro-batches."""
        return simulate_bounded(self.chunk_times, self.num_microbatches, self.schedule, self.chunk_activation_bytes)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of ``pp * makespan_s`` (the simulation's definition: fill, drain and faster stages
        waiting for slower ones; not the step breakdown's ``pp_bubble``, the fill and drain alone)."""
        busy = self.num_microbatches * float(self.stage_time_s.sum())
        return 1 - busy / (len(self.stage_time_s) * self.makespan_s) if self.makespan_s > 0 else 0.0

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.layers_per_chunk.sum(axis=1))

    @property
    def recompute(self) -> tuple[str, ...]:
        per_stage = self.recompute_counts.sum(axis=1)  # (pp, R)
        labels = []
        for row in per_stage:
            used = np.flatnonzero(row)
            labels.append(self.options[used[0]] if len(used) == 1 else
                          " + ".join(f"{int(row[o])} {self.options[o]}" for o in used))
        return tuple(labels)

    def option_counts(self, name: str) -> np.ndarray:
        """``(pp, vpp)`` layers of each chunk run with recompute option ``name`` (0 if not an option)."""
        if name not in self.options:
            return np.zeros(self.layers_per_chunk.shape, dtype=np.int64)
        return self.recompute_counts[:, :, self.options.index(name)]

    @property
    def stage_time_s(self) -> np.ndarray:
        """``(pp,)`` seconds per micro-batch of each stage (forward, backward, recompute)."""
        t = self.chunk_times
        return (np.asarray(t.forward_s) + np.asarray(t.backward_s) + np.asarray(t.recompute_s)).sum(axis=1)


@dataclass(frozen=True)
class BalancePlan:
    """The balanced layout, the even split it replaces (``even``, None if there is none), the
    memory limit, and how it was solved (``solver``: dp / megatron / highs / scipy / greedy;
    ``optimal``: proven optimal for the objective of :mod:`autopar.pipeline.chunk_ilp` within
    its MIP gap; ``gap``: the solver's relative MIP gap, None when it gave no bound;
    ``time_limit_hit``: the solver stopped at ``time_limit_s``; ``bound_s``: its proven lower bound
    of the objective, to compare with ``best.objective_s``: the answer kept is the one with the
    fastest simulated step among those found, which can differ from the program's own)."""

    best: PlanCost
    even: PlanCost | None
    memory_limit_bytes: float
    schedule: str
    solver: str
    optimal: bool
    solve_time_s: float
    gap: float | None = None
    time_limit_hit: bool = False
    time_limit_s: float | None = None
    num_microbatches: int | None = None
    bound_s: float | None = None

    @property
    def offset(self) -> list[list[int]]:
        """``offset[stage][chunk]``: layers minus ``L // (pp * vpp)``."""
        counts = self.best.layers_per_chunk
        base = int(counts.sum()) // counts.size
        return (counts - base).tolist()

    @property
    def megatron_first_last(self) -> tuple[int, int] | None:
        """``(first, last)`` layer counts if the middle stages are equal and every stage's chunks
        too (Megatron's first/last flags express it), else None (a layout string does)."""
        split = self.best.layers_per_stage
        chunks = self.best.layers_per_chunk
        if len(split) > 2 and len(set(split[1:-1])) > 1:
            return None
        if np.any(chunks != chunks[:, :1]):
            return None
        return split[0], split[-1]

    @property
    def even_fits(self) -> bool:
        """The even split exists and fits in the memory limit."""
        return self.even is not None and bool(np.max(self.even.stage_memory_bytes) <= self.memory_limit_bytes)

    @property
    def gain(self) -> float | None:
        """Speed-up over the even split (``even / best - 1``); None without a fitting even split."""
        if not self.even_fits:
            return None
        return self.even.makespan_s / self.best.makespan_s - 1


def _plan_cost(table: LayerTable, costs: ChunkCosts, counts: np.ndarray, num_microbatches: int,
               schedule: str) -> PlanCost:
    """Cost full-table ``counts`` ``(pp, vpp, K, R)``: memory, chunk times and the simulated step."""
    times, act = costs.times(counts), costs.chunk_activation_bytes(counts)
    sim = None if schedule in STATIC_SCHEDULES else simulate_bounded(times, num_microbatches, schedule, act)
    makespan = static_makespan_s(times, num_microbatches, schedule) if sim is None else sim.makespan_s
    per_chunk = counts.sum(axis=2)
    cost = PlanCost(per_chunk.sum(axis=2), per_chunk, table.options, costs.rank_bytes(counts), times, act, schedule,
                    num_microbatches, makespan, chunk_ilp.objective_s(costs, counts, num_microbatches))
    if sim is not None:
        cost.__dict__["simulation"] = sim  # cached_property's slot
    return cost


def _uniform_counts(costs: ChunkCosts, layers_per_chunk: np.ndarray, options: np.ndarray) -> np.ndarray:
    """Full-table counts of ``layers_per_chunk`` with rank ``r`` running option ``options[r]``."""
    per_kind = kind_counts(costs.starts, layers_per_chunk)
    counts = np.zeros(per_kind.shape + (costs.forward_s.shape[1],), dtype=np.int64)
    for r, option in enumerate(options):
        counts[r, :, :, option] = per_kind[r]
    return counts


def _even_chunks(num_layers: int, pp: int, vpp: int, split: tuple[int, ...] | None) -> np.ndarray | None:
    """Layers per chunk ``(pp, vpp)`` of the split compared against: ``split`` spread over each
    rank's chunks, or Megatron's default layout (:func:`autopar.pipeline.layout.default_layout`,
    the flexible one where the default split does not interleave); None if there is none."""
    try:
        if split is not None:
            return PipelineLayout.from_stage_split(split, vpp).decoder
        return default_layout(num_layers, pp, vpp).decoder
    except AutoparError:
        return None


class NoFitError(AutoparError):
    """No split of the layers fits the memory limit with the recompute options allowed (the
    balancer's own refusal, which ``autopar balance`` retries against the whole device memory
    when the limit was the device's less ``--memory-margin``)."""


def _no_fit(table: LayerTable, costs: ChunkCosts, names: tuple[str, ...], limit_name: str | None) -> NoFitError:
    chunks = _even_chunks(table.num_layers, table.pp, costs.vpp, None)
    lightest = None if chunks is None else min(
        float(np.max(costs.rank_bytes(_uniform_counts(costs, chunks, np.full(table.pp, table.option_index(n))))))
        for n in names)
    needs = "" if lightest is None else f" (an even split needs about {lightest / GIB:.1f} GiB)"
    limit_name = limit_name or f"memory_limit_bytes={table.memory_limit_bytes / GIB:.1f} GiB"
    advice = ("more stages or more memory" if "full" in names
              else "allow full recompute (--options ...,full), more stages or more memory")
    return NoFitError(
        f"{limit_name}: no split of {table.num_layers} layers over "
        f"pp={table.pp} fits with recompute in {{{', '.join(names)}}}{needs}; {advice}")


def _positional(table: LayerTable, costs: ChunkCosts, indices: np.ndarray, vpp: int, num_microbatches: int,
                schedule: str, form: str, time_limit_s: float) -> tuple[np.ndarray | None, str, bool]:
    """Equal chunks, one option per stage, over layer positions (:mod:`autopar.pipeline.split`,
    :mod:`autopar.pipeline.ilp`): Megatron's first/last form, and tables of more than
    :data:`MAX_KINDS` layer kinds. Returns full-table counts (None: nothing fits), solver, optimal."""
    pp = table.pp
    in_flight = in_flight_chunks(schedule, pp, vpp, num_microbatches) / vpp
    folded = fold(table, vpp, in_flight)
    ranks = np.arange(pp)

    def score(bounds: np.ndarray, chosen: np.ndarray) -> float:
        return float(surrogate_s(folded.rank_time_s(ranks, bounds[:-1], bounds[1:], chosen), num_microbatches, vpp))

    split_fn = megatron_split if form == "megatron" else dp_split
    uniform = []
    for r in indices:
        bounds = split_fn(folded, int(r))
        if bounds is not None:
            uniform.append((score(bounds, np.full(pp, r)), bounds, np.full(pp, r)))
    if not uniform:
        return None, "", True
    best_score, bounds, chosen = min(uniform, key=lambda item: item[0])
    solver, optimal = ("megatron" if form == "megatron" else "dp"), True
    if form == "explicit" and len(indices) > 1 and pp > 1:
        result = ilp.solve(folded, indices, num_microbatches, vpp, best_score, time_limit_s)
        solver, optimal = result.solver, result.optimal
        if result.bounds is not None and score(result.bounds, result.options) < best_score:
            bounds, chosen = result.bounds, result.options
    chunks = np.repeat(np.diff(bounds)[:, None], vpp, axis=1)
    return _uniform_counts(costs, chunks, chosen), solver, optimal


def balance(table: LayerTable, vpp: int, num_microbatches: int, schedule: str,
            options: tuple[str, ...] | None = None, form: str = "explicit", baseline: str | None = None,
            time_limit_s: float = TIME_LIMIT_S, even_split: tuple[int, ...] | None = None,
            limit_name: str | None = None, even_chunks: np.ndarray | None = None) -> BalancePlan:
    """Balance ``table.pp`` stages (``vpp`` chunks each) for ``num_microbatches`` under ``schedule``.

    ``form="explicit"``: layers per chunk (unequal chunks, empty chunks allowed, every stage
    non-empty) and recompute layer counts per chunk and option, by the integer program of
    :mod:`autopar.pipeline.chunk_ilp`, started from :func:`autopar.pipeline.warm_start.split_dp_counts`
    (one layer kind) or the greedy answer on the even split; tables of more than
    :data:`MAX_KINDS` kinds of layers use the equal-chunk positional programs instead.

    Args:
        options: recompute options to choose from (default: all of the table's).
        form: ``explicit`` or ``megatron`` (equal middle stages, one recompute option; module doc).
        baseline: recompute option of the even split compared against (default: ``options[0]``).
        time_limit_s: wall-clock limit of the integer program.
        even_split: layers per stage of the split compared against (default: Megatron's default
            layout; the layout's own one where it counts the embedding/loss as layers).
        limit_name: how the no-fit error names the memory limit, as the user gave it (e.g.
            ``--memory-limit-gib=60``); default ``memory_limit_bytes=<GiB>``.
        even_chunks: ``(pp, vpp)`` layers per chunk of the layout compared against (e.g.
            Megatron's ``--account-for-embedding/loss-in-pipeline-split`` chunks); overrides ``even_split``.

    Raises:
        AutoparError: unknown form/option/schedule, sizes the schedule cannot run, more than
            :data:`MAX_MICROBATCHES` micro-batches or :data:`MAX_LAYERS` layers, fewer layers than
            stages, vpp not dividing the layers where equal chunks are needed (``megatron``), or no
            split fitting in memory (with what an even split needs).
    """
    start = time.perf_counter()
    pp = table.pp
    check_schedule(schedule, pp, vpp, num_microbatches)
    if table.num_layers > MAX_LAYERS:
        raise AutoparError(f"num_layers={table.num_layers}: balancing splits at most {MAX_LAYERS} layers "
                           "(the exact split is quadratic in the layer count)")
    if num_microbatches > MAX_MICROBATCHES:
        raise AutoparError(f"num_microbatches={num_microbatches}: balancing takes at most {MAX_MICROBATCHES:,} "
                           "micro-batches per step; lower --gbs or raise --mbs/--dp")
    if form not in FORMS:
        raise AutoparError(f"form={form!r}: allowed {', '.join(FORMS)}")
    if table.num_layers < pp:
        raise AutoparError(f"pp={pp} exceeds num_layers={table.num_layers}: some stage would be empty")
    names = tuple(options) if options else table.options
    if not names:
        raise AutoparError("options: give at least one recompute option")
    indices = np.array([table.option_index(n) for n in names])
    base = table.option_index(baseline or names[0])
    costs = chunk_costs(table, vpp, schedule, num_microbatches)
    gap, hit, best, bound = None, False, None, None
    if form == "megatron" or len(costs.kind_layers) > MAX_KINDS:
        counts, solver, optimal = _positional(table, costs, indices, vpp, num_microbatches, schedule, form,
                                              time_limit_s)
    else:
        one_kind = len(costs.kind_layers) == 1
        reference = _even_chunks(table.num_layers, pp, vpp, even_split) if even_chunks is None else even_chunks
        on_even = None if reference is None else greedy_counts(costs, indices, reference)
        bound = np.inf if on_even is None else chunk_ilp.bottleneck_bound_s(
            costs, indices, num_microbatches, chunk_ilp.objective_s(costs, on_even, num_microbatches))
        ranks = all_rank_candidates(costs, indices, bound) if one_kind else None
        even_shape = split_dp_counts(costs, indices, num_microbatches, True, ranks) if one_kind and vpp > 1 else None
        starts = [split_dp_counts(costs, indices, num_microbatches, False, ranks) if one_kind else None, even_shape,
                  on_even]
        starts = [c for c in starts if c is not None]
        warm = min(starts, key=lambda c: chunk_ilp.objective_s(costs, c, num_microbatches)) if starts else None
        counts, solver, optimal = warm, "greedy", False
        if pp > 1:
            # several kinds: the floors of the most numerous kind alone, the others at their fastest
            kind = None if one_kind else int(np.argmax(costs.kind_layers))
            alone = ranks if one_kind else all_rank_candidates(kind_alone(costs, kind), indices, bound, False)
            floor = None if alone is None else rank_time_floor_s(alone, int(costs.kind_layers[kind or 0]))
            found = chunk_ilp.solve(costs, indices, num_microbatches, warm, time_limit_s, floor, kind)
            solver, optimal, gap, hit = found.solver, found.optimal, found.gap, found.time_limit_hit
            bound = found.bound_s
            if found.counts is not None and (warm is None or found.objective_s <= chunk_ilp.objective_s(
                    costs, warm, num_microbatches)):
                counts = found.counts
        elif warm is not None:
            solver, optimal, gap = "dp", True, 0.0
        if counts is not None:
            # The objective prices a lopsided rank by its slowest chunk only, not where its empty chunks
            # fall nor which stage is the slow one; the simulated step decides between the answer and
            # the others found (ties of the objective: 1F1B is faster with the slow stage first).
            shapes = [counts]
            for other in (warm, even_shape, on_even):
                if other is not None and not any(np.array_equal(other, c) for c in shapes):
                    shapes.append(other)
            best = min((_plan_cost(table, costs, c, num_microbatches, schedule) for c in shapes),
                       key=lambda plan: plan.makespan_s)
    if counts is None:
        raise _no_fit(table, costs, names, limit_name)
    best = best or _plan_cost(table, costs, counts, num_microbatches, schedule)
    if even_chunks is None:
        even_chunks = _even_chunks(table.num_layers, pp, vpp, even_split)
    even = None if even_chunks is None else _plan_cost(
        table, costs, _uniform_counts(costs, np.asarray(even_chunks), np.full(pp, base)), num_microbatches, schedule)
    if (even is not None and base in indices and even.makespan_s < best.makespan_s
            and np.max(even.stage_memory_bytes) <= table.memory_limit_bytes):
        best = even  # the surrogate objective can miss by a little; never answer worse than even
    return BalancePlan(best, even, table.memory_limit_bytes, schedule, solver, optimal, time.perf_counter() - start,
                       gap=gap, time_limit_hit=hit, time_limit_s=time_limit_s, num_microbatches=num_microbatches,
                       bound_s=bound)
