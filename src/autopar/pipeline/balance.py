"""Pipeline stage balancing: layers per stage (per chunk) and recompute per stage.

Given a :class:`~autopar.pipeline.layers.LayerTable` (per-layer time and memory for each
recompute option, fixed embedding/output parts per stage) and the schedule, :func:`balance`
picks the split and the recompute options that minimise the step time under the memory limit
of every device, then simulates the result (:mod:`autopar.pipeline.simulate`) and the default
(even, Megatron) split for comparison.

* One recompute option, any split (``form="explicit"``): exact min-max DP
  (:func:`autopar.pipeline.split.dp_split`).
* Several options, any split: the best single-option DP split is the upper bound for a mixed
  integer program choosing split and per-stage option together (:mod:`autopar.pipeline.ilp`).
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

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline import ilp
from autopar.pipeline.folded import FoldedTable, fold, surrogate_s
from autopar.pipeline.layers import LayerTable
from autopar.pipeline.schedules import check_schedule, in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes, SimulationResult
from autopar.pipeline.steady import simulate_bounded
from autopar.pipeline.split import dp_split, megatron_split
from autopar.strategy import default_layers_per_stage

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


@dataclass(frozen=True)
class PlanCost:
    """A split with its recompute options, simulated: ``layers_per_chunk`` ``(pp, vpp)``,
    ``recompute`` ``(pp,)`` names, ``stage_memory_bytes`` ``(pp,)`` peak bytes per device."""

    layers_per_chunk: np.ndarray
    recompute: tuple[str, ...]
    stage_memory_bytes: np.ndarray
    simulation: SimulationResult

    @property
    def makespan_s(self) -> float:
        return self.simulation.makespan_s

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.layers_per_chunk.sum(axis=1))


@dataclass(frozen=True)
class BalancePlan:
    """The balanced layout, the even split it replaces (``even``, None if there is none), the
    memory limit, and how it was solved (``solver``: dp / megatron / highs / scipy; ``optimal``:
    proven optimal for the objective, False when the time limit cut the search)."""

    best: PlanCost
    even: PlanCost | None
    memory_limit_bytes: float
    schedule: str
    solver: str
    optimal: bool
    solve_time_s: float

    @property
    def offset(self) -> list[list[int]]:
        """SAPP ``offset[stage][chunk]``: layers minus ``L // (pp * vpp)``."""
        counts = self.best.layers_per_chunk
        base = int(counts.sum()) // counts.size
        return (counts - base).tolist()

    @property
    def megatron_first_last(self) -> tuple[int, int] | None:
        """``(first, last)`` layer counts if the middle stages are equal (Megatron-expressible)."""
        split = self.best.layers_per_stage
        if len(split) > 2 and len(set(split[1:-1])) > 1:
            return None
        return split[0], split[-1]

    @property
    def gain(self) -> float | None:
        """Speed-up over the even split (``even / best - 1``); None without a fitting even split."""
        if self.even is None or np.max(self.even.stage_memory_bytes) > self.memory_limit_bytes:
            return None
        return self.even.makespan_s / self.best.makespan_s - 1


def _chunk_times(table: LayerTable, bounds: np.ndarray, options: np.ndarray, vpp: int) -> PipelineTimes:
    """Per-(rank, chunk) times; a rank's fixed time goes on its first chunk (the last rank's on
    its last chunk, where the output layer runs)."""
    positions, pp = table.num_layers // vpp, table.pp
    prefix = {name: np.concatenate([np.zeros((1, len(table.options))), np.cumsum(getattr(table, name), axis=0)])
              for name in ("forward_s", "backward_s", "recompute_s")}
    fixed = {"forward_s": table.stage_forward_s, "backward_s": table.stage_backward_s,
             "recompute_s": table.stage_recompute_s}
    out = {}
    for name, cum in prefix.items():
        values = np.zeros((pp, vpp))
        for rank in range(pp):
            r = options[rank]
            for chunk in range(vpp):
                lo, hi = chunk * positions + bounds[rank], chunk * positions + bounds[rank + 1]
                values[rank, chunk] = cum[hi, r] - cum[lo, r]
            values[rank, vpp - 1 if rank == pp - 1 and pp > 1 else 0] += fixed[name][rank, r]
        out[name] = values
    return PipelineTimes(out["forward_s"], out["backward_s"], out["recompute_s"], table.p2p_s)


def _chunk_activations(table: LayerTable, bounds: np.ndarray, options: np.ndarray, vpp: int) -> np.ndarray:
    positions = table.num_layers // vpp
    cum = np.concatenate([np.zeros((1, len(table.options))), np.cumsum(table.activation_bytes, axis=0)])
    return np.array([[cum[c * positions + bounds[i + 1], options[i]] - cum[c * positions + bounds[i], options[i]]
                      for c in range(vpp)] for i in range(table.pp)])


def _cost(table: LayerTable, folded: FoldedTable, bounds: np.ndarray, options: np.ndarray, vpp: int,
          num_microbatches: int, schedule: str) -> PlanCost:
    ranks = np.arange(table.pp)
    times = _chunk_times(table, bounds, options, vpp)
    sim = simulate_bounded(times, num_microbatches, schedule, _chunk_activations(table, bounds, options, vpp))
    memory = folded.rank_bytes(ranks, bounds[:-1], bounds[1:], options)
    counts = np.repeat(np.diff(bounds)[:, None], vpp, axis=1)
    return PlanCost(counts, tuple(table.options[r] for r in options), memory, sim)


def _even_bounds(num_layers: int, pp: int, vpp: int, split: tuple[int, ...] | None = None) -> np.ndarray | None:
    split = split or default_layers_per_stage(num_layers, pp)
    if split is None or any(n % vpp for n in split):
        return None
    return np.concatenate([[0], np.cumsum(split) // vpp]).astype(np.int64)


def _no_fit(table: LayerTable, folded: FoldedTable, names: tuple[str, ...], limit_name: str | None) -> AutoparError:
    indices = [table.option_index(n) for n in names]
    lightest = min(float(np.max(folded.rank_bytes(np.arange(table.pp), b[:-1], b[1:], r)))
                   for r in indices for b in [np.linspace(0, folded.positions, table.pp + 1).astype(np.int64)])
    limit_name = limit_name or f"memory_limit_bytes={table.memory_limit_bytes / GIB:.1f} GiB"
    return AutoparError(
        f"{limit_name}: no split of {table.num_layers} layers over "
        f"pp={table.pp} fits with recompute in {{{', '.join(names)}}} (an even split needs about "
        f"{lightest / GIB:.1f} GiB); allow full recompute, more stages or more memory")


def balance(table: LayerTable, vpp: int, num_microbatches: int, schedule: str,
            options: tuple[str, ...] | None = None, form: str = "explicit", baseline: str | None = None,
            time_limit_s: float = 0.8, even_split: tuple[int, ...] | None = None,
            limit_name: str | None = None) -> BalancePlan:
    """Balance ``table.pp`` stages (``vpp`` chunks each) for ``num_microbatches`` under ``schedule``.

    Args:
        options: recompute options to choose from (default: all of the table's); one option
            means a pure split (DP), several a joint choice (integer program).
        form: ``explicit`` (any split, per-stage recompute) or ``megatron`` (see module doc).
        baseline: recompute option of the even split compared against (default: ``options[0]``).
        time_limit_s: wall-clock limit of the integer program.
        even_split: layers per stage of the split compared against (default: Megatron's default
            split; the layout's own one where it counts the embedding/loss as layers).
        limit_name: how the no-fit error names the memory limit, as the user gave it (e.g.
            ``--memory-limit-gib=60``); default ``memory_limit_bytes=<GiB>``.

    Raises:
        AutoparError: unknown form/option/schedule, sizes the schedule cannot run, more than
            :data:`MAX_MICROBATCHES` micro-batches or :data:`MAX_LAYERS` layers, vpp not dividing
            the layers, or no split fitting in memory (with what an even split needs).
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
    names = tuple(options) if options else table.options
    if not names:
        raise AutoparError("options: give at least one recompute option")
    indices = np.array([table.option_index(n) for n in names])
    base = table.option_index(baseline or names[0])
    in_flight = in_flight_chunks(schedule, pp, vpp, num_microbatches) / vpp
    folded = fold(table, vpp, in_flight)
    ranks = np.arange(pp)

    def score(bounds: np.ndarray, chosen: np.ndarray) -> float:
        times = folded.rank_time_s(ranks, bounds[:-1], bounds[1:], chosen)
        return float(surrogate_s(times, num_microbatches, vpp))

    split_fn = megatron_split if form == "megatron" else dp_split
    uniform = []
    for r in indices:
        bounds = split_fn(folded, int(r))
        if bounds is not None:
            uniform.append((score(bounds, np.full(pp, r)), bounds, np.full(pp, r)))
    if not uniform:
        raise _no_fit(table, folded, names, limit_name)
    best_score, bounds, chosen = min(uniform, key=lambda item: item[0])
    solver, optimal = ("megatron" if form == "megatron" else "dp"), True
    if form == "explicit" and len(indices) > 1 and pp > 1:
        result = ilp.solve(folded, indices, num_microbatches, vpp, best_score, time_limit_s)
        solver, optimal = result.solver, result.optimal
        if result.bounds is not None and score(result.bounds, result.options) < best_score:
            bounds, chosen = result.bounds, result.options
    best = _cost(table, folded, bounds, chosen, vpp, num_microbatches, schedule)
    even_bounds = _even_bounds(table.num_layers, pp, vpp, even_split)
    even = None if even_bounds is None else _cost(table, folded, even_bounds, np.full(pp, base), vpp,
                                                   num_microbatches, schedule)
    if (even is not None and base in indices and even.makespan_s < best.makespan_s
            and np.max(even.stage_memory_bytes) <= table.memory_limit_bytes):
        best = even  # the surrogate objective can miss by a little; never answer worse than even
    return BalancePlan(best, even, table.memory_limit_bytes, schedule, solver, optimal, time.perf_counter() - start)
