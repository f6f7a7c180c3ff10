"""Step time, throughput, MFU and peak memory of layouts, from their stages.

Pipeline schedule (Narayanan et al., SC'21, sec. 2.2; Megatron ``schedules.py``), with
``t_i`` the per-micro-batch time of stage ``i`` and ``M`` micro-batches:

* 1F1B: ``sum_i t_i + (M - 1) * max_i t_i``, which is ``(M + pp - 1) * t`` for equal stages
  (bubble fraction ``(pp-1)/M``) and stays exact-enough for uneven ones; p2p is blocking, so
  each of the ``M + pp - 2`` forward and backward hand-offs on the critical path is exposed.
* interleaved 1F1B: ``(M + (pp - 1)/vpp) * max_i t_i`` (bubble shrinks by ``vpp``); p2p
  overlaps with compute except the ``pp*vpp - 1`` hand-offs of the fill and drain.

Data-parallel traffic and the optimizer step follow the pipeline flush; the slowest stage
decides. ``MFU = model FLOPs per step / (step time * world * peak)`` (PaLM, appendix B).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost import stage_time as T
from autopar.cost.flops import model_flops_per_token
from autopar.cost.memory import MemoryBreakdown, stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.problem import Problem
from autopar.strategy import LayoutBatch

TIME_KEYS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm", "dp_comm", "optimizer")


@dataclass
class StepCosts:
    """Costs of ``n`` layouts (arrays of shape ``(n,)``); ``memory`` has one breakdown per view."""

    step_time_s: np.ndarray
    time_breakdown_s: dict[str, np.ndarray]
    peak_memory_bytes: np.ndarray
    memory: list[MemoryBreakdown]
    tokens_per_s_per_device: np.ndarray
    mfu: np.ndarray


def evaluate(p: Problem, batch: LayoutBatch, views: list[Stages], counts: list[np.ndarray]) -> StepCosts:
    """Cost ``batch`` from stage ``views``; ``counts[j]`` is how many pipeline stages view ``j``
    stands for (it weights the sum in the 1F1B makespan; 0 means the view is a duplicate)."""
    times, memories, dp, opt = [], [], [], []
    for view in views:
        params = stage_params(p, batch, view)
        t = T.stage_time(p, batch, view)
        times.append(t)
        memories.append(stage_memory(p, batch, view))
        slack = view.index * (t.backward_s + t.recompute_s)
        dp.append(T.dp_exposed_s(p, batch, params, t, slack))
        opt.append(T.optimizer_time_s(p, batch, params))

    totals = np.stack([t.total_s for t in times])
    bottleneck = np.argmax(totals, axis=0)
    rows = np.arange(len(batch))
    t_max = totals[bottleneck, rows]
    m = batch.num_microbatches.astype(np.float64)
    one_f_one_b = sum(c * tot for c, tot in zip(counts, totals)) + (m - 1) * t_max
    interleaved = (m + (batch.pp - 1) / batch.vpp) * t_max
    makespan = np.where(batch.vpp > 1, interleaved, one_f_one_b)

    p2p = T.p2p_time_s(p, batch)
    handoffs = np.where(batch.vpp > 1, batch.pp * batch.vpp - 1, m + batch.pp - 2)
    pp_comm = np.where(batch.pp > 1, 2 * handoffs * p2p, 0.0)
    dp_comm = np.max(np.stack(dp), axis=0)
    optimizer = np.max(np.stack(opt), axis=0)

    def at_bottleneck(field: str) -> np.ndarray:
        return m * np.stack([getattr(t, field) for t in times])[bottleneck, rows]

    breakdown = {
        "compute": at_bottleneck("compute_s"),
        "tp_comm": at_bottleneck("tp_s"),
        "cp_comm": at_bottleneck("cp_s"),
        "ep_comm": at_bottleneck("ep_s"),
        "pp_bubble": makespan - m * t_max,
        "pp_comm": pp_comm,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
    }
    step = makespan + pp_comm + dp_comm + optimizer
    peak = np.max(np.stack([mem.total_bytes for mem in memories]), axis=0)
    tokens = p.train.tokens_per_step
    tps = tokens / step / p.world_size
    mfu = model_flops_per_token(p) * tokens / (step * p.world_size * p.cluster.device.peak(p.train.precision))
    return StepCosts(step, breakdown, peak, memories, tps, mfu)
