"""Step time and per-stage memory of a layer-wise plan under autopar's cost model.

Stage ``i`` of the plan takes, per micro-batch, ``t_i = sum over its layers of the layer's
forward + backward + recompute time under the layer's own (tp, zero, recompute)
(:mod:`autopar.layerwise.tables`) + the re-sharding between consecutive layers of different tp
+ the stage's fixed part`` (embedding on the first stage, output layer and loss on the last,
costed at the vocabulary tp). The step is then what :mod:`autopar.cost.step` computes for a
uniform layout: the 1F1B makespan ``sum_i t_i + (m - 1) * max_i t_i`` (Narayanan et al.,
SC'21, sec. 2.2), ``2 (m + pp - 2)`` exposed activation hand-offs, the tied-embedding all-reduce,
and the slowest stage's data-parallel and optimizer time (the sum of its layers' terms).
Memory of stage ``i``: its layers' weights, gradients and optimizer state + ``min(pp - i, m)``
micro-batches of its layers' activations + the fixed part (the checkpointed variant of the fixed
part where any layer of the stage is checkpointed).
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.errors import AutoparError
from autopar.layerwise.plan import LayerwisePlan
from autopar.layerwise.tables import PairTable, pair_table, reshard_s
from autopar.problem import Problem
from autopar.rules import check_strategy


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


def cost_from_tables(p: Problem, plan: LayerwisePlan, tables: dict[tuple[int, int, bool], PairTable],
                     memory_limit_bytes: float) -> PlanCost:
    """The plan's cost from its tables (module docstring)."""
    m = plan.num_microbatches
    vocab = tables[vocab_key(plan)]
    per_layer = [tables[(t, plan.layer_zero(i), u)] for i, (t, u) in enumerate(zip(plan.tp, plan.ulysses))]
    col = [1 if r else 0 for r in plan.recompute]
    stage_t, stage_mem, stage_step, p2p = [], [], [], 0.0
    for i, sl in enumerate(plan.stage_slices()):
        layers = range(sl.start, sl.stop)
        fixed_col = 1 if any(plan.recompute[sl]) else 0
        t = float(vocab.stage_microbatch_s[i, fixed_col])
        t += sum(float(per_layer[j].microbatch_s[j, col[j]]) for j in layers)
        t += sum(reshard_s(p, per_layer[j - 1], per_layer[j]) for j in layers if j > sl.start)
        static = sum(float(per_layer[j].static_bytes[j]) for j in layers)
        act = sum(float(per_layer[j].activation_bytes[j, col[j]]) for j in layers)
        stage_mem.append(static + vocab.in_flight[i] * act + float(vocab.stage_bytes[i, fixed_col]))
        stage_step.append(float(vocab.stage_step_s[i]) + sum(float(per_layer[j].step_s[j, col[j]]) for j in layers))
        stage_t.append(t)
        if i < plan.pp - 1:
            p2p = max(p2p, per_layer[sl.stop - 1].p2p_s)
    makespan = sum(stage_t) + (m - 1) * max(stage_t)
    pp_comm = (2 * (m + plan.pp - 2) * p2p + vocab.tied_grad_s) if plan.pp > 1 else 0.0
    step = float(makespan + pp_comm + max(stage_step))
    stage_mem = [float(x) for x in stage_mem]
    peak = max(stage_mem)
    return PlanCost(step_time_s=step, stage_microbatch_s=stage_t, stage_memory_bytes=stage_mem,
                    peak_memory_bytes=peak, memory_limit_bytes=memory_limit_bytes,
                    tokens_per_s_per_device=p.train.tokens_per_step / step / p.world_size)


def evaluate_plan(p: Problem, plan: LayerwisePlan, memory_limit_bytes: float | None = None) -> PlanCost:
    """Cost one layer-wise plan under autopar's model.

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
    return cost_from_tables(p, plan, plan_tables(p, plan), limit)

