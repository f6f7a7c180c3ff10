"""Step time and per-stage memory of a layer-wise plan under autopar's cost model.

Stage ``i`` of the plan takes, per micro-batch, ``t_i = sum over its layers of the layer's
forward + backward + recompute time under the layer's own (tp, zero, recompute)
(:mod:`autopar.layerwise.tables`) + the re-sharding between consecutive layers of different tp
+ the stage's fixed part`` (embedding on the first stage, output layer and loss on the last:
the fixed part of the uniform layout with the next decoder layer's tp and the plan's vocabulary
tp, re-sharding between the two included, :func:`fixed_parts`). The step is then what
:mod:`autopar.cost.step` computes for a uniform layout: the 1F1B makespan ``sum_i t_i + (m - 1) * max_i t_i`` (Narayanan et al.,
SC'21, sec. 2.2), ``2 (m + pp - 2)`` exposed activation hand-offs, the tied-embedding all-reduce,
and the slowest stage's data-parallel and optimizer time (the sum of its layers' terms).
Memory of stage ``i``: its layers' weights, gradients and optimizer state + ``min(pp - i, m)``
micro-batches of its layers' activations + the fixed part (the checkpointed variant of the fixed
part where any layer of the stage is checkpointed).

Where the stages differ (unequal layer counts, or other choices on one stage than on another),
``autopar estimate`` costs a uniform layout's pipeline by simulating the 1F1B schedule over the
stages' forward, backward and recompute times rather than by the closed form
(:func:`autopar.pipeline.makespan.simulated_costs_many`). :func:`evaluate_plan` and the plan
:func:`autopar.layerwise.search.search_layerwise` returns do the same (``simulate=True`` of
:func:`cost_from_tables`: the stages' parts by :func:`stage_op_times_s`, as
:func:`autopar.pipeline.layers.op_times_s` shares each stage's communication out), so a uniform
plan costs what ``estimate`` and ``search`` give for its layout; the search compares plans by the
closed form, which its bounds are proved for (it is within about 0.1% of the simulation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.errors import AutoparError
from autopar.layerwise.plan import LayerwisePlan
from autopar.layerwise.tables import PairTable, pair_table, pair_tables, reshard_s
from autopar.problem import Problem
from autopar.rules import check_strategy
from autopar.strategy import Strategy


@dataclass(frozen=True)
class PlanCost:
    """Predicted cost of one layer-wise plan (seconds, bytes; lists per pipeline stage)."""

    step_time_s: float
    stage_microbatch_s: list[float]
    stage_memory_bytes: list[float]
    peak_memory_bytes: float
    memory_limit_bytes: float
    tokens_per_s_per_device: float

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_limit_bytes


def plan_tables(p: Problem, plan: LayerwisePlan) -> dict[tuple[int, int, bool], PairTable]:
    """The :class:`PairTable` of every (tp, zero, ulysses) the plan uses, its layers' and its
    vocabulary's.

    Raises:
        AutoparError: a pair whose uniform layout breaks a rule (named) or does not divide.
    """
    pairs = {(t, plan.layer_zero(i), u) for i, (t, u) in enumerate(zip(plan.tp, plan.ulysses))}
    pairs.add(vocab_key(plan))
    out = {}
    for tp, zero, ulysses in sorted(pairs):
        table = pair_table(p, plan.pp, plan.num_microbatches, plan.layers_per_stage, tp, zero, plan.sp, ulysses)
        if table is None:
            check_strategy(p, plan.candidate(p, tp, zero, False, ulysses))  # raises the batch's or the rule's reason
        out[(tp, zero, ulysses)] = table
    return out


def vocab_key(plan: LayerwisePlan) -> tuple[int, int, bool]:
    """The (tp, zero, ulysses) of the plan's embedding and output layer (never Ulysses: vsp 0)."""
    return plan.vocab_tp, 3 if plan.vocab_zero3 else plan.default_zero, False


FixedKey = tuple  # (tp, zero, ulysses) of a plan's pair table, or (tp, zero, False, vocab_tp)


@dataclass(frozen=True)
class FixedPart:
    """One stage's fixed part (embedding on the first stage, output layer and loss on the last):
    seconds per micro-batch ``(2,)`` and its ``(3, 2)`` forward / backward / recompute compute,
    bytes ``(2,)``, once-per-step seconds ``(2,)`` (columns: no checkpointing on the stage, some)."""

    microbatch_s: np.ndarray
    compute_parts_s: np.ndarray
    bytes: np.ndarray
    step_s: np.ndarray


def fixed_keys(plan: LayerwisePlan) -> list[list[FixedKey]]:
    """Per stage, the tables whose empty stage is that stage's fixed part: the uniform layout with
    the tp of the decoder layer next to the vocabulary layer and the plan's ``vocab_tp``
    (:func:`autopar.cost.vocab.layer_collective_s` then re-shards between them, one formula with
    ``autopar estimate``), i.e. ``(tp, zero, False, vocab_tp)``, or the vocabulary's own
    :func:`vocab_key` where the two agree (no re-sharding), the neighbour is a Ulysses layer
    (its hand-over to the vocabulary is not modelled) or the stage holds no vocabulary layer.
    A single stage (pp 1) whose first and last layers differ lists both: each end is half of
    each table's fixed part (its collectives are per end; its compute does not depend on tp).

    The once-per-step part is not linear in the layers (the data-parallel traffic hides behind the
    stage's backward: :mod:`autopar.layerwise.tables`), so for a ``vocab_tp`` key it is the
    vocabulary's effect on the whole stage, ``whole(tp, vocab_tp) - whole(tp) + empty(tp)`` of the
    uniform layouts with and without it: a uniform plan then sums to ``estimate``'s step."""
    own = vocab_key(plan)

    def beside(j: int) -> FixedKey:
        t = plan.tp[j]
        return own if plan.ulysses[j] or t == plan.vocab_tp else (t, own[1], False, plan.vocab_tp)

    out = []
    for i, sl in enumerate(plan.stage_slices()):
        ends = ([sl.start] if i == 0 else []) + ([sl.stop - 1] if i == plan.pp - 1 else [])
        out.append(sorted({beside(j) for j in ends}) or [own])
    return out


def build_fixed_tables(p: Problem, plans: list[LayerwisePlan], tables: dict[tuple[int, int, bool], PairTable],
                       extra: dict[FixedKey, PairTable]) -> None:
    """Build into ``extra``, in one vectorised pass (:func:`autopar.layerwise.tables.pair_tables`),
    the fixed-part tables that ``plans`` (of one pp, split and micro-batch count) need beyond
    ``tables`` and ``extra`` (None for a layout that breaks a rule; :func:`fixed_parts` then
    names it)."""
    keys = {k for plan in plans for ks in fixed_keys(plan) for k in ks}
    keys = sorted((keys | {k[:3] for k in keys}) - set(tables) - set(extra))  # and each one without vocab_tp
    if not keys:
        return
    plan = plans[0]
    strategies = [plan.candidate(p, k[0], k[1], False).model_copy(update={"vocab_tp": k[3] if len(k) > 3 else None})
                  for k in keys]
    extra.update(zip(keys, pair_tables(p, strategies)))


def fixed_parts(p: Problem, plan: LayerwisePlan, tables: dict[tuple[int, int, bool], PairTable],
                extra: dict[FixedKey, PairTable]) -> list[FixedPart]:
    """Each stage's :class:`FixedPart` (:func:`fixed_keys`) from the plan's ``tables`` and, for the
    keys with a ``vocab_tp``, ``extra``, where the missing ones are built
    (:func:`autopar.layerwise.tables.pair_table` with ``vocab_tp``).

    Raises:
        AutoparError: a layout that breaks a rule (named)."""
    def table(key: FixedKey) -> PairTable:
        if key in tables:
            return tables[key]
        if extra.get(key) is None:
            t, zero, _, *vtp = key
            extra[key] = pair_table(p, plan.pp, plan.num_microbatches, plan.layers_per_stage, t, zero, plan.sp,
                                    vocab_tp=vtp[0] if vtp else None)
            if extra[key] is None:
                check_strategy(p, plan.candidate(p, t, zero, False).model_copy(update={"vocab_tp": vtp[0] if vtp
                                                                                       else None}))
        return extra[key]

    out = []
    for i, keys in enumerate(fixed_keys(plan)):
        parts = [table(k) for k in keys]
        steps = [t.whole_step_s[i] - table(k[:3]).whole_step_s[i] + table(k[:3]).stage_step_s[i] if len(k) > 3
                 else np.full(2, t.stage_step_s[i]) for k, t in zip(keys, parts)]
        out.append(FixedPart(microbatch_s=np.mean([t.stage_microbatch_s[i] for t in parts], axis=0),
                             compute_parts_s=np.mean([t.stage_compute_parts_s[:, i] for t in parts], axis=0),
                             bytes=np.mean([t.stage_bytes[i] for t in parts], axis=0),
                             step_s=np.mean(steps, axis=0)))
    return out


def stages_alike(plan: LayerwisePlan) -> bool:
    """Whether every pipeline stage holds as many layers with the same choices (tp, ZeRO-3,
    checkpointing, Ulysses) in the same order, as a uniform layout with an even split: the case
    ``autopar estimate`` costs by the closed form rather than simulating the pipeline."""
    if len(set(plan.layers_per_stage)) > 1:
        return False
    rows = [tuple(zip(plan.tp[sl], plan.zero3[sl], plan.recompute[sl], plan.ulysses[sl])) for sl in plan.stage_slices()]
    return len(set(rows)) == 1


def stage_op_times_s(plan: LayerwisePlan, tables: dict[tuple[int, int, bool], PairTable],
                     stage_microbatch_s: list[float], fixed: list[FixedPart]) -> np.ndarray:
    """``(3, pp)`` forward, backward and recompute seconds per micro-batch of each stage, its
    communication (its time ``stage_microbatch_s`` less its compute: the layers' collectives and
    the re-sharding between them) shared out in proportion to the compute, as
    :func:`autopar.pipeline.layers.op_times_s` does for a uniform layout's stage; ``fixed``: the
    stages' :func:`fixed_parts`."""
    per_layer = [tables[(t, plan.layer_zero(i), u)] for i, (t, u) in enumerate(zip(plan.tp, plan.ulysses))]
    out = np.zeros((3, plan.pp))
    for i, sl in enumerate(plan.stage_slices()):
        compute = fixed[i].compute_parts_s[:, 1 if any(plan.recompute[sl]) else 0].copy()
        for j in range(sl.start, sl.stop):
            compute += per_layer[j].compute_parts_s[:, j, 1 if plan.recompute[j] else 0]
        total = compute.sum()
        share = compute / total if total > 0 else np.array([1.0, 0.0, 0.0])
        out[:, i] = compute + share * (stage_microbatch_s[i] - total)
    return out


def cost_from_tables(p: Problem, plan: LayerwisePlan, tables: dict[tuple[int, int, bool], PairTable],
                     memory_limit_bytes: float, simulate: bool = False,
                     fixed_tables: dict[FixedKey, PairTable] | None = None) -> PlanCost:
    """The plan's cost from its tables (module docstring); with ``simulate`` the pipeline of
    stages that differ (:func:`stages_alike` false) is simulated (1F1B) instead of taking the closed
    form, as ``autopar estimate`` does. The stages' fixed parts are :func:`fixed_parts`, the tables
    they need beyond ``tables`` kept in ``fixed_tables`` (a cache to share between calls; default:
    built for this call).

    Raises:
        AutoparError: a simulation the static schedule cannot run (see
            :func:`autopar.pipeline.makespan.batch_makespans_s`), or a fixed part's layout that
            breaks a rule."""
    m = plan.num_microbatches
    vocab = tables[vocab_key(plan)]
    fixed = fixed_parts(p, plan, tables, {} if fixed_tables is None else fixed_tables)
    per_layer = [tables[(t, plan.layer_zero(i), u)] for i, (t, u) in enumerate(zip(plan.tp, plan.ulysses))]
    col = [1 if r else 0 for r in plan.recompute]
    stage_t, stage_mem, stage_step, p2p = [], [], [], 0.0
    for i, sl in enumerate(plan.stage_slices()):
        layers = range(sl.start, sl.stop)
        fixed_col = 1 if any(plan.recompute[sl]) else 0
        t = float(fixed[i].microbatch_s[fixed_col])
        t += sum(float(per_layer[j].microbatch_s[j, col[j]]) for j in layers)
        t += sum(reshard_s(p, per_layer[j - 1], per_layer[j]) for j in layers if j > sl.start)
        static = sum(float(per_layer[j].static_bytes[j]) for j in layers)
        act = sum(float(per_layer[j].activation_bytes[j, col[j]]) for j in layers)
        stage_mem.append(static + vocab.in_flight[i] * act + float(fixed[i].bytes[fixed_col]))
        stage_step.append(float(fixed[i].step_s[fixed_col]) + sum(float(per_layer[j].step_s[j, col[j]]) for j in layers))
        stage_t.append(t)
        if i < plan.pp - 1:
            p2p = max(p2p, per_layer[sl.stop - 1].p2p_s)
    makespan = sum(stage_t) + (m - 1) * max(stage_t)
    if simulate and plan.pp > 1 and not stages_alike(plan):
        from autopar.pipeline.makespan import batch_makespans_s

        ops = stage_op_times_s(plan, tables, stage_t, fixed)[:, None, :, None]  # (3, 1 layout, pp, vpp 1)
        makespan = float(batch_makespans_s(*ops, np.zeros((1, 1)), m, "1f1b")[0, 0])
    pp_comm = (2 * (m + plan.pp - 2) * p2p + vocab.tied_grad_s) if plan.pp > 1 else 0.0
    step = float(makespan + pp_comm + max(stage_step))
    stage_mem = [float(x) for x in stage_mem]
    peak = max(stage_mem)
    return PlanCost(step_time_s=step, stage_microbatch_s=stage_t, stage_memory_bytes=stage_mem,
                    peak_memory_bytes=peak, memory_limit_bytes=memory_limit_bytes,
                    tokens_per_s_per_device=p.train.tokens_per_step / step / p.world_size)


def evaluate_plan(p: Problem, plan: LayerwisePlan, memory_limit_bytes: float | None = None) -> PlanCost:
    """Cost one layer-wise plan under autopar's model, its pipeline simulated where the stages
    differ (:func:`cost_from_tables` with ``simulate``), as ``autopar estimate`` costs a layout.

    Args:
        memory_limit_bytes: usable bytes per device (default: the device's memory).

    Raises:
        AutoparError: the plan does not fit the problem (layer count, world, batch) or one of
            its (tp, zero) pairs breaks a layout rule.
    """
    limit = p.cluster.device.memory_bytes if memory_limit_bytes is None else float(memory_limit_bytes)
    if not limit > 0:
        raise AutoparError(f"memory_limit_bytes={limit}: must be positive")
    plan.check(p)
    return cost_from_tables(p, plan, plan_tables(p, plan), limit, simulate=True)



def uniform_plan(p: Problem, s: Strategy, memory_limit_bytes: float) -> tuple[LayerwisePlan, PlanCost] | None:
    """The uniform layout ``s`` as a layer-wise plan (:meth:`LayerwisePlan.uniform`) with its cost
    (:func:`evaluate_plan` within ``memory_limit_bytes``), or None where a plan cannot hold it
    (vpp, cp, ZeRO-1, selective recompute, ...) or it does not fit. A uniform layout is a
    layer-wise plan, so ``search --layerwise`` gives it when it beats the dynamic programme's plan
    (which ranks plans by the closed-form makespan and can miss it by a little)."""
    try:
        plan = LayerwisePlan.uniform(p, s)
        cost = evaluate_plan(p, plan, memory_limit_bytes)
    except AutoparError:
        return None
    return (plan, cost) if cost.fits else None
