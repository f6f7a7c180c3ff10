"""Grid search: count the space, reject by rule, cost the valid layouts chunk by chunk, drop what
does not fit, rank (:mod:`autopar.search.stream`; Galvatron's variants, torchtitan's V schedules
and ``--explain`` go through the whole batch at once, :func:`costed_grid`).

Ranking: layouts that fit comfortably first, then marginal ones (within the memory margin of
the device limit), each group by predicted step time (equivalently tokens/s/device, since the
batch is fixed). The top ``k`` are re-costed stage by stage with :func:`estimate_many` so their
numbers are exactly what ``autopar estimate`` prints for the same layout; pipelined ones are
re-balanced first and the top ``k`` re-ranked (:mod:`autopar.pipeline.rebalance`: under the
memory limit, the best split the ``target`` framework can run unchanged, kept if it ranks
higher; at least :data:`RECOST_AT_LEAST` are re-balanced whatever ``k``, so a smaller ``--top``
never shows another #1; for ``sapp`` and ``galvatron`` also any split with a recompute option per stage,
found by the min-max split DP, which the other formats cannot express; the integer program
then refines #1). Two layouts that re-balance to the same one are listed once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from itertools import islice
from typing import Any, Callable, Iterator

import numpy as np

from autopar.errors import AutoparError
from autopar.estimate import DEFAULT_MEMORY_MARGIN, Estimate, estimate_many
from autopar.export.comm_knobs import CP_ALGORITHMS, MOE_CHOICE_TARGETS, TP_OVERLAP_TARGETS, preferred_flex
from autopar.export.per_stage import MODULE_TARGETS, PER_STAGE_OPTIONS
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.rebalance import TARGETS, TableCache, rank, rebalance_estimate, rebalance_many
from autopar.problem import Problem
from autopar.problem_record import problem_record
from autopar.progress import advance, phase, timings
from autopar.rules import RULES, first_failure
from autopar.search.constraints import Constraint, apply_constraints, widen_space
from autopar.search.costing import search_costs
from autopar.search.stream import KEEP, stream_costs
from autopar.search.valid_space import ValidSpace, count_space, valid_layouts
from autopar.space import MAX_LAYOUTS, SpaceOptions, check_size, divisors, enumerate_layouts
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, SIMPLICITY_ORDER, Strategy

GIB = 2**30


@dataclass
class SearchResult:
    """Ranked layouts and the accounting of everything that was dropped."""

    layouts: list[Estimate]
    enumerated: int
    rejected: dict[str, int]
    out_of_memory: int
    marginal: int
    search_time_s: float
    global_batch_size: int
    target: str = "megatron"
    not_writable: int = 0  # fitting layouts skipped because the target's writer refuses them
    extra: dict[str, Any] = field(default_factory=dict)
    problem: dict[str, Any] | None = None  # autopar.problem_record.problem_record of the problem searched
    constraints: dict[str, int] = field(default_factory=dict)  # constraint text -> layouts it removed
    phases_s: dict[str, float] = field(default_factory=dict)  # wall time of each phase (autopar.progress)

    def to_dict(self) -> dict[str, Any]:
        """The stable search JSON documented in the README."""
        return {
            "layouts": [e.to_dict(self.global_batch_size) for e in self.layouts],
            "enumerated": self.enumerated,
            "rejected": self.rejected,
            "out_of_memory": self.out_of_memory,
            "marginal": self.marginal,
            "search_time_s": self.search_time_s,
            "phases_s": self.phases_s,
            "target": self.target,
            "not_writable": self.not_writable,
            "problem": self.problem,
            "constraints": self.constraints,
        }


def _unique(layouts: list[Estimate]) -> list[Estimate]:
    """``layouts`` without repeats (two layouts can re-balance to the same one), order kept."""
    return [e for i, e in enumerate(layouts) if all(e.strategy != o.strategy for o in layouts[:i])]


LIGHTER_FRACTION = 0.01  # a recompute variant saving < 1% of the peak is no alternative plan


def for_target(p: Problem, target: str) -> Problem:
    """``p`` costed and checked as the ``target`` export format runs it: ``torchtitan`` sets
    ``TrainSpec.framework='torchtitan'`` (fp32 FSDP2 shards, per-op SAC, fp32 loss, and FSDP2 with
    pp > 1 allowed by rule ``zero_with_pp``); ``deepspeed`` sets ``framework='deepspeed'`` (16-bit
    gradients plus BF16_Optimizer's fp32 accumulation buffer, the allocator reserve, ZeRO-3 gathers
    per submodule: :mod:`autopar.cost.framework_memory`, :mod:`autopar.cost.framework`) and
    ``tp_backward_overlap=False`` (Megatron-DeepSpeed keeps the async TP all-reduce off: its issue
    #447, as ``validate.rows`` family ``megatron-deepspeed``); ``galvatron`` sets ``grad_reduce_once``
    (FSDP's no_sync accumulation, :mod:`autopar.cost.grad_accumulation`); other targets leave ``p``
    unchanged; ``megatron-bridge`` with fp8 current scaling and no ``fp8_bf16_layers`` given keeps the
    first and last layer in bf16, as its ``bf16_with_fp8_current_scaling_mixed`` recipe does
    (:data:`autopar.export.megatron_bridge.RECIPE_BF16_LAYERS`), and with fp8 and no
    ``fp8_param_storage`` given stores the weights as the recipe does (its ``fp8_param_gather``,
    :data:`autopar.export.megatron_bridge.FP8_MIXED_PRECISION`)."""
    update = {"torchtitan": {"framework": "torchtitan"},
              "deepspeed": {"framework": "deepspeed", "tp_backward_overlap": False},
              "galvatron": {"grad_reduce_once": True}}.get(target)
    t = p.train
    if target == "megatron-bridge" and t.precision == "fp8":  # what the user left open, as the recipe sets it
        from autopar.export.megatron_bridge import FP8_MIXED_PRECISION, RECIPE_BF16_LAYERS

        name, gathers = FP8_MIXED_PRECISION[t.effective_fp8_recipe]
        update = {**({"fp8_bf16_layers": RECIPE_BF16_LAYERS[name]}
                     if t.fp8_bf16_layers is None and name in RECIPE_BF16_LAYERS else {}),
                  **({"fp8_param_storage": gathers} if "fp8_param_storage" not in t.model_fields_set else {})} or None
    if update is None:
        return p
    return Problem(p.model, p.cluster, p.train.model_copy(update=update))


def _refuse_megatron_knobs(p: Problem, target: str) -> None:
    """Refuse, once, the recipe knobs only Megatron-LM and Megatron-Bridge run (every layout's export
    would refuse them): CUDA graphs (torchtitan compiles, it has no CUDA-graph capture of training),
    activation CPU offloading, bf16 first/last layers of fp8 training.

    Raises:
        AutoparError: one line naming the option and the target."""
    if target in ("megatron", "megatron-bridge"):
        return
    t = p.train
    given = [f"--cuda-graph-impl {t.cuda_graph_impl}"] if t.cuda_graph_impl != "none" else []
    given += [f"--activation-offload-layers {t.activation_offload_layers}"] if t.activation_offload_layers else []
    given += ["--fp8-bf16-layers {},{}".format(*t.bf16_end_layers)] if t.bf16_end_layers != (0, 0) else []
    if given:
        raise AutoparError(f"{' '.join(given)} with --target {target}: only Megatron-LM and Megatron-Bridge run it "
                           f"({target} has no such switch); use --target megatron or megatron-bridge, or drop it")


def for_search(p: Problem, target: str, options: SpaceOptions | None) -> tuple[Problem, SpaceOptions | None]:
    """``p`` as ``target`` runs it (:func:`for_target`) and ``options`` restricted to the
    recompute modules, TP overlap and CP algorithms the target writes
    (:mod:`autopar.export.comm_knobs`).

    Raises:
        AutoparError: a ``megatron-bridge`` model without a library recipe (once, not per layout),
            ``options`` pinning recompute modules the target cannot write, or a Megatron-only
            recipe knob for another target (:func:`_refuse_megatron_knobs`).
    """
    p = for_target(p, target)
    _refuse_megatron_knobs(p, target)
    if target == "megatron-bridge":
        from autopar.export.megatron_bridge import recipe_for

        recipe_for(p)
    if target not in MODULE_TARGETS:  # only Megatron-LM writes other recompute modules than core_attn
        pinned = options.recompute_modules if options else None
        if pinned not in (None, DEFAULT_RECOMPUTE_MODULES):
            raise AutoparError(f"--recompute-modules {','.join(pinned)} with --target {target}: only "
                               f"{', '.join(MODULE_TARGETS)} writes recompute modules other than core_attn")
        options = replace(options or SpaceOptions(), recompute_modules=DEFAULT_RECOMPUTE_MODULES)
    moe_choices = target in MOE_CHOICE_TARGETS and p.model.is_moe
    flex = preferred_flex(p, target)[0]  # one flex backend where deepep and hybridep cost the same
    # DeepEP and HybridEP are NVIDIA kernels (rules_moe.flex_needs_nvidia): alltoall alone elsewhere
    dispatchers = ("alltoall", flex) if p.cluster.device.vendor in (None, "nvidia") else ("alltoall",)
    if moe_choices and target == "megatron-bridge":  # also the model's recipe's (autopar.export.bridge_moe_recipes)
        from autopar.export.bridge_moe_recipes import layout_fallbacks

        recipe = layout_fallbacks(p).get("moe_dispatcher", flex)  # last: kept if the space is too big
        dispatchers = tuple(d for d in dispatchers if d != recipe) + (recipe,)
    options = replace(options or SpaceOptions(), tp_comm_overlap=target in TP_OVERLAP_TARGETS,
                      cp_comm_types=CP_ALGORITHMS.get(target, ("p2p",)),  # what the target can write
                      moe_dispatchers=dispatchers if moe_choices else ("alltoall",),
                      moe_ep_overlap=moe_choices,
                      galvatron_choices=target == "galvatron", v_schedules=target == "torchtitan")
    return p, options


def refusal(p: Problem, target: str, strategy: Strategy) -> str | None:
    """Why ``target``'s writer (:data:`autopar.export.WRITERS`) cannot write ``strategy``
    unchanged (torchtitan has no distributed optimizer, DeepSpeed no context parallelism, ...),
    or None when it can."""
    from autopar.export import WRITERS  # the writers import the search's result types

    try:
        WRITERS[target](p, strategy)
    except AutoparError as err:
        return str(err)
    return None


def undominated(batch: LayoutBatch, step_s: np.ndarray, peak_bytes: np.ndarray, order: np.ndarray,
                keep: Callable[[int], bool] = lambda i: True) -> Iterator[int]:
    """The indices of ``order`` in turn, skipping a layout that differs from one already
    taken only in its recompute setting, ZeRO stage or GPipe schedule and is neither faster (to the microsecond)
    nor lighter by at least :data:`LIGHTER_FRACTION` of its peak: e.g. selective recompute that
    saves almost no memory under flash attention and costs no time on a communication-bound step
    is not a second plan, nor is ZeRO-1 with dp x cp = 1 (nothing to shard: the same layout).
    ``keep(i)`` False skips row ``i`` too (a layout the target cannot write). The table lists
    the first ``top_k`` of these."""
    layout_columns = [getattr(batch, f.name) for f in fields(LayoutBatch)
                      if f.name not in ("recompute", "recompute_layers", "zero", "gpipe")]
    taken: dict[tuple, list[int]] = {}
    for i in order:
        i = int(i)
        if not keep(i):
            continue
        same = taken.setdefault(tuple(int(c[i]) for c in layout_columns), [])
        if any(step_s[i] >= step_s[j] - 1e-6 and peak_bytes[i] >= (1 - LIGHTER_FRACTION) * peak_bytes[j]
               for j in same):
            continue
        same.append(i)
        yield i


def _refuse_empty(p: Problem, enumerated: int, removed: dict[str, int], rejected: dict[str, int], valid: int,
                  constraints: list[Constraint]) -> None:
    """Refuse a space the constraints or the rules leave empty.

    Raises:
        AutoparError: the constraints leave nothing (with what each removed and, for a parallel
            size no layout can have, the sizes there are: the divisors of the world size,
            :func:`autopar.space.divisors`), or no layout passes the rules (with the rules that
            rejected most).
    """
    if removed and enumerated == sum(removed.values()):
        what = ", ".join(f"{text} ({count:,})" for text, count in removed.items())
        sizes = ", ".join(str(d) for d in divisors(p.world_size))
        allowed = "".join(f"; {c.column} sizes divide the {p.world_size:,} devices: {sizes}" for c in constraints
                          if c.column in ("tp", "pp", "cp", "dp") and removed.get(c.text) == enumerated)
        raise AutoparError(f"the constraints leave none of the {enumerated:,} layouts of {p.model.name} on "
                           f"{p.world_size} devices (gbs={p.train.global_batch_size}); removed by: {what}{allowed}")
    if valid == 0:
        why = ", ".join(f"{name} ({count})" for name, count in sorted(rejected.items(), key=lambda kv: -kv[1]))
        raise AutoparError(
            f"no valid layout for {p.model.name} on {p.world_size} devices with gbs="
            f"{p.train.global_batch_size}, seq_len={p.train.seq_len}; rejected by: {why}"
        )


@dataclass
class Grid:
    """The vectorised stage of a search: how many layouts the space holds (``enumerated``), how
    many each constraint removed (``removed``) and each rule rejected first (``rejected``, by rule
    name), the valid layouts (``valid``) with their ``costs`` (:func:`autopar.search.costing.search_costs`:
    the step time only where a layout fits), ``fits`` / ``marginal`` masks over ``valid`` and ``order``: the fitting
    rows best first (comfortable before marginal, then by step time, then simplest), then the
    others in row order. With ``full`` (``--explain``) it also
    holds every enumerated layout (``batch``), which the constraints kept (``kept``), the first
    rule each kept layout fails (``failed``: index into :data:`RULES`, -1 = valid) and the valid
    ones' rows in ``batch`` (``valid_rows``); without, those are None."""

    enumerated: int
    removed: dict[str, int]
    rejected: dict[str, int]
    valid: LayoutBatch
    costs: Any
    fits: np.ndarray
    marginal: np.ndarray
    order: np.ndarray
    batch: LayoutBatch | None = None
    kept: np.ndarray | None = None
    failed: np.ndarray | None = None
    valid_rows: np.ndarray | None = None


def _full_space(p: Problem, options: SpaceOptions, constraints: list[Constraint]) -> tuple[ValidSpace, dict]:
    """Every enumerated layout with its constraint and rule outcome (``--explain`` needs them):
    the :class:`ValidSpace` and the :class:`Grid` fields ``batch``, ``kept``, ``failed``, ``valid_rows``."""
    batch = enumerate_layouts(p, options)
    kept, removed = apply_constraints(batch, constraints)
    failed = np.full(len(batch), -1, dtype=np.int64)
    failed[kept] = first_failure(p, batch.take(kept))
    rejected = {rule.name: int(np.sum(kept & (failed == i))) for i, rule in enumerate(RULES)
                if np.any(kept & (failed == i))}
    valid_rows = np.flatnonzero(kept & (failed < 0))
    space = ValidSpace(batch.take(valid_rows), len(batch), removed, rejected)
    return space, {"batch": batch, "kept": kept, "failed": failed, "valid_rows": valid_rows}


def costed_grid(p: Problem, memory_margin: float, options: SpaceOptions | None = None,
                constraints: list[Constraint] | None = None, full: bool = False) -> Grid:
    """Enumerate the valid layouts of ``p``'s space (widened to hold pinned values) that
    ``constraints`` allow (:func:`autopar.search.valid_space.valid_layouts`; with ``full`` every
    layout, as ``--explain`` needs) and cost them at once (see :class:`Grid`).

    Raises:
        AutoparError: the constraints leave nothing (with what each removed), or no layout passes
            the rules (with the rules that rejected most).
    """
    constraints = constraints or []
    options = widen_space(options or SpaceOptions(), constraints)
    with phase("enumerate", description="enumerating the valid layouts"):
        if full or options.galvatron_choices or options.v_schedules:  # variants follow the blocks: every row, checked
            space, extra = _full_space(p, options, constraints)
        else:
            space, extra = valid_layouts(p, options, constraints), {}
    valid = space.valid
    _refuse_empty(p, space.enumerated, space.removed, space.rejected, len(valid), constraints)
    capacity = p.cluster.device.memory_bytes
    with phase("cost", description=f"costing {len(valid):,} valid layouts"):
        costs = search_costs(p, valid, capacity, space.keys)
    with phase("rank", description="ranking"):
        fits = costs.peak_memory_bytes <= capacity
        marginal = fits & (costs.peak_memory_bytes > (1 - memory_margin) * capacity)
        fit_rows = np.flatnonzero(fits)
        ties = tuple(getattr(valid, name)[fit_rows] for name in reversed(SIMPLICITY_ORDER))  # last key sorts first
        best = fit_rows[np.lexsort(ties + (np.round(costs.step_time_s[fit_rows], 6), marginal[fit_rows]))]
        order = np.concatenate([best, np.flatnonzero(~fits)])
    return Grid(space.enumerated, space.removed, space.rejected, valid, costs, fits, marginal, order, **extra)


def _nothing_fits(p: Problem, batch: LayoutBatch, peak_bytes: np.ndarray) -> AutoparError:
    """The error when no layout fits: the lightest of ``batch`` (first of the lightest) against
    the capacity."""
    capacity = p.cluster.device.memory_bytes
    best = int(np.argmin(peak_bytes))
    layout = batch.strategy(best, p.model.num_layers, p.model.mtp_num_layers)
    return AutoparError(
        f"no layout fits in {capacity / GIB:.1f} GiB per device: the smallest predicted peak is "
        f"{peak_bytes[best] / GIB:.1f} GiB (tp={layout.tp} pp={layout.pp} cp={layout.cp} "
        f"dp={layout.dp} zero={layout.zero} recompute={layout.recompute}); add devices or memory")


@dataclass
class Ranking:
    """Fitting layouts best first, as :func:`_top` walks them: their ``batch``, ``step_s`` and
    ``peak_bytes``; ``complete``: False where they are only the first of the fitting layouts."""

    batch: LayoutBatch
    step_s: np.ndarray
    peak_bytes: np.ndarray
    complete: bool = True


class _MoreNeeded(Exception):
    """The walk of a truncated :class:`Ranking` ran out before it found ``top_k`` layouts."""


def _ranked(p: Problem, memory_margin: float, options: SpaceOptions, constraints: list[Constraint] | None,
            keep: int) -> tuple[Ranking, int, dict[str, int], dict[str, int], int, int]:
    """The first ``keep`` fitting layouts, best first, and the counts of the search: (ranking,
    enumerated, rejected, removed, out of memory, marginal). Galvatron's variants and the V
    schedules go through the whole batch (:func:`costed_grid`); the other spaces are counted, then costed
    and ranked chunk by chunk (:mod:`autopar.search.stream`).

    Raises:
        AutoparError: as :func:`costed_grid`, or no layout fits (with the lightest one).
    """
    if options.galvatron_choices or options.v_schedules:  # variants added after the blocks: every row
        grid = costed_grid(p, memory_margin, options, constraints)
        if not np.any(grid.fits):
            raise _nothing_fits(p, grid.valid, grid.costs.peak_memory_bytes)
        best = grid.order[grid.fits[grid.order]]
        ranking = Ranking(grid.valid.take(best), grid.costs.step_time_s[best], grid.costs.peak_memory_bytes[best])
        return (ranking, grid.enumerated, grid.rejected, grid.removed, int(np.sum(~grid.fits)),
                int(np.sum(grid.marginal)))
    constraints = constraints or []
    with phase("enumerate", description="counting the layouts"):
        count = count_space(p, widen_space(options, constraints), constraints)
    _refuse_empty(p, count.enumerated, count.removed, count.rejected, count.valid, constraints)
    check_size(p, count.valid, "valid")
    streamed = stream_costs(p, count, memory_margin, keep)
    if streamed.top is None:
        raise _nothing_fits(p, streamed.lightest, np.asarray([streamed.lightest_peak_bytes]))
    top = streamed.top
    ranking = Ranking(top.batch, top.step_s, top.peak_bytes, not streamed.truncated)
    return (ranking, count.enumerated, count.rejected, count.removed, count.valid - streamed.fitting,
            streamed.marginal)


def _refuse_target(p: Problem, target: str) -> None:
    """Refuse ``target`` before any costing when its writer refuses ``p`` whatever the layout
    (:data:`autopar.export.PROBLEM_CHECKS`: e.g. Megatron-Bridge has no recipe for the model).

    Raises:
        AutoparError: with the writer's reason.
    """
    from autopar.export import PROBLEM_CHECKS  # the writers import the search's result types

    try:
        PROBLEM_CHECKS[target](p)
    except AutoparError as err:
        raise AutoparError(f"no layout can be written for --target {target}: {err}") from None


def search(
    p: Problem,
    top_k: int = 10,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    options: SpaceOptions | None = None,
    target: str = "megatron",
    constraints: list[Constraint] | None = None,
) -> SearchResult:
    """Search the whole layout space of ``p`` and return the ``top_k`` best layouts.

    ``target``: the ``autopar export`` format the layouts must run on unchanged
    (:data:`autopar.pipeline.rebalance.TARGETS`); ``sapp`` and ``galvatron`` allow recompute
    per stage, the others get one recompute option for all stages. ``constraints``
    (:mod:`autopar.search.constraints`) remove layouts before the rules and the costing.

    Raises:
        AutoparError: ``target`` is not a known format, or ``options`` pin recompute modules the
            target cannot write.
        AutoparError: the constraints leave no layout (with what each removed).
        AutoparError: no layout passes the rules (with the rules that rejected most), or none
            fits in device memory (with the smallest peak found against the capacity).
        AutoparError: ``target``'s writer refuses the problem whatever the layout (:func:`_refuse_target`).
    """
    start = time.perf_counter()
    if target not in TARGETS:
        raise AutoparError(f"--target={target!r}: allowed {', '.join(TARGETS)}")
    with timings() as phases_s:
        p, options = for_search(p, target, options)
        _refuse_target(p, target)
        keep = max(KEEP, 8 * top_k)
        while True:  # a walk past the first `keep` (many layouts the target refuses): a pass keeping 8x more
            ranking, enumerated, rejected, removed, out_of_memory, marginal = _ranked(
                p, memory_margin, options, constraints, keep)
            try:
                layouts, refused = _top(p, ranking, top_k, memory_margin, target)
                break
            except _MoreNeeded:
                keep = min(8 * keep, MAX_LAYOUTS)
    return SearchResult(
        layouts=layouts,
        enumerated=enumerated,
        rejected=rejected,
        out_of_memory=out_of_memory,
        marginal=marginal,
        search_time_s=time.perf_counter() - start,
        global_batch_size=p.train.global_batch_size,
        target=target,
        not_writable=len(refused),
        problem=problem_record(p),
        constraints=removed,
        phases_s=phases_s,
    )


#: Layouts re-costed and re-balanced before the top ``k`` are taken, whatever ``k``: re-balancing can
#: lift a layout above those ranked before it, so re-balancing only ``k = 1`` could show a slower #1
#: than ``--top 2`` does.
RECOST_AT_LEAST = 10


def _top(p: Problem, ranking: Ranking, top_k: int, memory_margin: float, target: str) -> tuple[list[Estimate], list[str]]:
    """The ``top_k`` best undominated layouts of ``ranking`` that ``target`` can write, re-costed
    stage by stage (:func:`estimate_many`), re-balanced and re-ranked (see the module docstring), and
    the refusals of the fitting layouts skipped on the way. The first ``max(top_k,
    RECOST_AT_LEAST)`` are re-balanced, so the top rows do not depend on ``top_k``.

    Raises:
        _MoreNeeded: ``ranking`` is incomplete and ran out before that many layouts were found.
        AutoparError: the target's writer refuses every fitting layout.
    """
    valid = ranking.batch
    refused: list[str] = []

    def writable(i: int) -> bool:
        reason = refusal(p, target, valid.strategy(i, p.model.num_layers, p.model.mtp_num_layers))
        if reason is not None:
            refused.append(reason)
        return reason is None

    wanted = max(top_k, RECOST_AT_LEAST)
    with phase("rank"):
        order = list(islice(undominated(valid, ranking.step_s, ranking.peak_bytes, np.arange(len(valid)), writable),
                            wanted))
    if len(order) < wanted and not ranking.complete:
        raise _MoreNeeded
    if not order:
        raise AutoparError(f"no fitting layout can be written for --target {target}: "
                           f"{len(refused):,} refused, e.g. {refused[0]}")
    with phase("recost", total=2 * len(order), description=f"re-costing and re-balancing the top {len(order)}"):
        layouts = estimate_many(p, [valid.strategy(int(i), p.model.num_layers, p.model.mtp_num_layers) for i in order],
                                memory_margin)  # one pipeline simulation per shape across the top k
        advance(len(order))
        cache = TableCache()  # one layer table per shard shape across the top k
        layouts = _unique(rank(rebalance_many(p, layouts, memory_margin, target, cache, use_ilp=False)))
        advance(len(order))
    if target in PER_STAGE_OPTIONS and layouts[0].strategy.pp > 1:  # the integer program polishes #1 only
        with phase("balance", description="balancing #1 (integer program)"):
            layouts = _unique(rank([rebalance_estimate(p, layouts[0], memory_margin, target, cache)] + layouts))
    return layouts[:top_k], refused
