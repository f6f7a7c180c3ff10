"""``estimate``: memory and time of one layout, stage by stage, as plain Python values."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from autopar.cost.stage import Stages, all_stages
from autopar.cost.stage_time import p2p_time_s
from autopar.cost.step import TIME_KEYS, StepCosts, evaluate_stages_many
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layout import layout_of, split_fields
from autopar.pipeline.makespan import simulated_costs_many
from autopar.problem import Problem
from autopar.rules import check_strategy
from autopar.strategy import Strategy

DEFAULT_MEMORY_MARGIN = 0.10  # a layout above 90% of device memory is "marginal"


@dataclass(frozen=True)
class StageMemory:
    """Per-device memory of one pipeline stage (bytes; ``params`` is an element count;
    ``recompute`` the stage's recompute option)."""

    stage: int
    layers: int
    recompute: str
    params: float
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    total_bytes: float


@dataclass(frozen=True)
class StageTiming:
    """Time of one pipeline stage (Tinker's ``--detail``): seconds per micro-batch of its forward,
    backward and recomputed forward (compute, :mod:`autopar.cost.stage_time`), its exposed TP, CP
    and EP collectives and one pipeline send (``p2p_s``, 0 with pp 1); ``busy_s`` is
    ``num_microbatches`` times their sum, the send counted only under 1F1B (blocking; interleaved
    and V schedules overlap it with compute, :mod:`autopar.cost.step`, so ``busy_s`` never exceeds
    the step); ``dp_comm_s`` the data-parallel traffic it leaves exposed per step. The step is not
    their sum: the pipeline adds its bubble (``time_breakdown_s``)."""

    stage: int
    layers: int
    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    p2p_s: float
    busy_s: float
    dp_comm_s: float


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one layout.

    ``fits``: peak <= device memory. ``marginal``: fits, but above ``1 - memory_margin`` of it
    (real runs at that level often fail from fragmentation; ranked after comfortable ones).
    """

    strategy: Strategy
    num_microbatches: int
    step_time_s: float
    tokens_per_s_per_device: float
    mfu: float
    peak_memory_bytes: float
    device_memory_bytes: float
    fits: bool
    marginal: bool
    memory_per_stage: list[StageMemory]
    time_breakdown_s: dict[str, float] = field(default_factory=dict)
    time_per_stage: list[StageTiming] = field(default_factory=list)

    def layers_per_stage(self) -> list[int]:
        """Decoder layers per pipeline rank as the JSON gives them: the layout's own
        ``layers_per_stage``, else (a flexible ``pipeline_layout``, e.g. DeepSeek-V3's
        ``Et|(tt|)*30mL``) each stage's sum over its chunks; empty without pipelining."""
        if self.strategy.layers_per_stage:
            return list(self.strategy.layers_per_stage)
        return [m.layers for m in self.memory_per_stage] if self.strategy.pp > 1 else []

    def to_dict(self, global_batch_size: int, detail: bool = False) -> dict[str, Any]:
        """The stable JSON form documented in the README; ``detail`` adds ``time_per_stage``
        (:class:`StageTiming` per stage, ``estimate --detail``)."""
        s = self.strategy
        strategy = {
            "dp": s.dp, "tp": s.tp, "pp": s.pp, "vpp": s.vpp, "cp": s.cp, "ep": s.ep, "etp": s.expert_tp,
            "mbs": s.mbs, "gbs": global_batch_size, "num_microbatches": self.num_microbatches,
            "zero": s.zero, "sp": s.sp, "recompute": s.recompute, "recompute_layers": s.recompute_layers,
            "schedule": s.schedule, "layers_per_stage": self.layers_per_stage(),
            "recompute_per_stage": list(s.recompute_per_stage) if s.recompute_per_stage else None,
            "recompute_modules": list(s.recompute_modules),
            "account_for_embedding": s.account_for_embedding, "account_for_loss": s.account_for_loss,
            "tp_comm_overlap": s.tp_comm_overlap, "cp_comm_type": s.cp_comm_type, "cp_a2a": s.cp_a2a,
            "pipeline_layout": s.pipeline_layout, "vocab_tp": s.vocab_tp_size, "vocab_sp": s.vocab_sp,
            "tp_consecutive": s.tp_consecutive,
            "moe_dispatcher": s.moe_dispatcher, "moe_ep_overlap": s.moe_ep_overlap,
        }
        extra = {"time_per_stage": [asdict(t) for t in self.time_per_stage]} if detail else {}
        return {
            "strategy": strategy,
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "fits": self.fits,
            "marginal": self.marginal,
            "memory_per_stage": [asdict(m) for m in self.memory_per_stage],
            "time_breakdown_s": self.time_breakdown_s,
            **extra,
        }


def estimate(p: Problem, s: Strategy, memory_margin: float = DEFAULT_MEMORY_MARGIN) -> Estimate:
    """Cost one explicit layout on every pipeline stage (:func:`estimate_many` for one layout).

    Raises:
        LayoutError: the layout breaks a validity rule (every broken rule is named).
    """
    return estimate_many(p, [s], memory_margin)[0]


def estimate_many(p: Problem, strategies: list[Strategy], memory_margin: float = DEFAULT_MEMORY_MARGIN) -> list[Estimate]:
    """Cost explicit layouts on every pipeline stage, each exactly as alone.

    Each stage is costed with its own layer count and recompute option
    (:attr:`Strategy.stage_recompute`). When stages differ (uneven layer counts or per-stage
    recompute) the closed-form makespan of :mod:`autopar.cost.step` no longer holds and the
    pipeline is simulated stage by stage, the layouts of one pipeline shape together
    (:func:`autopar.pipeline.makespan.simulated_costs_many`).

    Raises:
        LayoutError: a layout breaks a validity rule (every broken rule is named).
    """
    costed, uneven, staged = [], [], []
    for s in strategies:
        check_strategy(p, s)
        if s.layers_per_stage is None and s.pipeline_layout is None:  # write the split out
            if s.account_for_embedding or s.account_for_loss:
                s = s.model_copy(update={"layers_per_stage": layout_of(p, s).layers_per_stage})
            else:
                s = s.model_copy(update=split_fields(layout_of(p, s)))
        batch, stages = all_stages(p, s)  # row i: stage i with its own recompute option
        if s.pp > 1 and (len(set(stages.layers.tolist())) > 1 or s.recompute_per_stage):  # uneven: simulate
            uneven.append(len(costed))
        costed.append((s, batch, stages))
        staged.append((batch, stages))
    # every layout's stages in one pass, each combined alone (as evaluate(p, batch[0], views, ...) would)
    costed = [(*item, costs) for item, costs in zip(costed, evaluate_stages_many(p, staged))]
    for i, costs in zip(uneven, simulated_costs_many(p, [costed[i] for i in uneven])):
        costed[i] = (*costed[i][:3], costs)
    return [_estimate(p, *item, memory_margin) for item in costed]


def _estimate(p: Problem, s: Strategy, batch: LayoutBatch, stages: Stages, costs: StepCosts,
              memory_margin: float) -> Estimate:
    """The :class:`Estimate` of layout ``s`` from its ``costs`` (``batch``/``stages``: the layout
    repeated per stage and its stages, :func:`autopar.cost.stage.all_stages`)."""
    per_stage = [
        StageMemory(
            stage=i, layers=int(stages.layers[i]), recompute=s.stage_recompute[i], params=float(mem.params[0]),
            weights_bytes=float(mem.weights_bytes[0]), grads_bytes=float(mem.grads_bytes[0]),
            optimizer_bytes=float(mem.optimizer_bytes[0]), activations_bytes=float(mem.activations_bytes[0]),
            other_bytes=float(mem.other_bytes[0]), total_bytes=float(mem.total_bytes[0]),
        )
        for i, mem in enumerate(costs.memory)
    ]
    m = s.num_microbatches(p.train.global_batch_size)
    p2p = float(p2p_time_s(p, batch.take(np.zeros(1, dtype=np.int64)))[0]) if s.pp > 1 else 0.0
    timing = []
    for i, (t, dp) in enumerate(zip(costs.stage_times or [], costs.stage_dp_s or [])):
        parts = [float(x[0]) for x in (t.forward_s, t.backward_s, t.recompute_s, t.tp_s, t.cp_s, t.ep_s)]
        # the sends are blocking under 1F1B; interleaved and V schedules overlap them with compute
        # (autopar.cost.step), so there they are not busy time
        exposed_p2p = p2p if s.vpp == 1 else 0.0
        timing.append(StageTiming(i, int(stages.layers[i]), *parts, p2p_s=p2p, busy_s=m * (sum(parts) + exposed_p2p),
                                  dp_comm_s=float(dp[0])))
    capacity = p.cluster.device.memory_bytes
    peak = float(costs.peak_memory_bytes[0])
    return Estimate(
        strategy=s,
        num_microbatches=s.num_microbatches(p.train.global_batch_size),
        step_time_s=float(costs.step_time_s[0]),
        tokens_per_s_per_device=float(costs.tokens_per_s_per_device[0]),
        mfu=float(costs.mfu[0]),
        peak_memory_bytes=peak,
        device_memory_bytes=capacity,
        fits=peak <= capacity,
        marginal=(1 - memory_margin) * capacity < peak <= capacity,
        memory_per_stage=per_stage,
        time_breakdown_s={k: float(costs.time_breakdown_s[k][0]) for k in TIME_KEYS},
        time_per_stage=timing,
    )
