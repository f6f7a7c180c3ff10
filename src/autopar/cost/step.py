"""Step time, throughput, MFU and peak memory of layouts, from their stages.

Pipeline schedule (Narayanan et al., SC'21, sec. 2.2; Megatron ``schedules.py``), with
``t_i`` the per-micro-batch time of stage ``i`` and ``M`` micro-batches:

* 1F1B: ``sum_i t_i + (M - 1) * max_i t_i``, which is ``(M + pp - 1) * t`` for equal stages
  (bubble fraction ``(pp-1)/M``) and stays exact-enough for uneven ones; p2p is blocking, so
  each of the ``M + pp - 2`` forward and backward hand-offs on the critical path is exposed.
* interleaved 1F1B: ``(M + (pp - 1)/vpp) * max_i t_i`` (bubble shrinks by ``vpp``); p2p
  overlaps with compute except the ``pp*vpp - 1`` hand-offs of the fill and drain.
* ZB-V / DualPipeV (torchtitan): ``M * max_i t_i`` plus the schedule's simulated bubble
  (:mod:`autopar.pipeline.v_cost`); ``2 pp - 2`` exposed hand-offs (the V's turn stays on its rank).

Data-parallel traffic and the optimizer step follow the pipeline flush; the stage whose exposed
data-parallel time plus optimizer step is the longest decides (one stage's sum, not the largest
of each over two stages). ``MFU = model FLOPs per step / (step time * world * peak)`` (PaLM, appendix B), with
``peak`` the device's dense peak at the training precision (:func:`mfu_peak_flops_per_s`): the
fp8 peak for fp8 training, not the bf16 one.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from autopar.cost import stage_time as T
from autopar.cost.flops import model_flops_per_token
from autopar.cost.memory import MemoryBreakdown, stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.v_cost import v_makespans_s
from autopar.problem import Problem

TIME_KEYS = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm", "dp_comm", "optimizer")


@dataclass
class StepCosts:
    """Costs of ``n`` layouts (arrays of shape ``(n,)``); ``memory``, ``stage_times`` and
    ``stage_dp_s`` have one entry per view (stage)."""

    step_time_s: np.ndarray
    time_breakdown_s: dict[str, np.ndarray]
    peak_memory_bytes: np.ndarray
    memory: list[MemoryBreakdown]
    tokens_per_s_per_device: np.ndarray
    mfu: np.ndarray
    stage_times: list[T.StageTime] | None = None  # per view: seconds per micro-batch (estimate --detail)
    stage_dp_s: list[np.ndarray] | None = None  # per view: exposed data-parallel seconds per step


_CONCAT_ROWS = 4096  # below this many (layout, stage) rows, one pass over all views beats a pass per view


def _split(x: np.ndarray, k: int, n: int) -> list[np.ndarray]:
    """``k`` consecutive ``(n,)`` slices of a ``(k * n,)`` (or broadcastable) array."""
    full = np.broadcast_to(np.asarray(x, dtype=np.float64), (k * n,))
    return [full[j * n:(j + 1) * n] for j in range(k)]


def view_time(p: Problem, rows: LayoutBatch, stages: Stages, run: Callable[[str, Callable], Any] | None = None,
              t: T.StageTime | None = None) -> tuple[T.StageTime, np.ndarray, np.ndarray]:
    """Per-micro-batch stage times, exposed data-parallel time and optimizer time (s) of the
    ``(layout, stage)`` rows ``rows`` / ``stages`` (arrays of shape ``(n,)``).

    ``run(name, fn)`` evaluates the row-wise ``fn(rows, stages)`` (default: directly; the search
    passes :meth:`autopar.search.distinct.Distinct.run`, which costs it once per distinct key).
    ``t``: the rows' :func:`autopar.cost.stage_time.stage_time`, where the caller has it already."""
    run = run or (lambda name, fn: fn(rows, stages))
    params = run("params", lambda b, s: stage_params(p, b, s))
    t = run("stage_time", lambda b, s: T.stage_time(p, b, s)) if t is None else t
    slack = stages.index * (t.backward_s + t.recompute_s)
    optimizer = run("optimizer", lambda b, s: T.optimizer_time_s(p, b, stage_params(p, b, s)))
    return t, T.dp_exposed_s(p, rows, params, t, slack), optimizer


def _cost_views(p: Problem, batches: list[LayoutBatch], views: list[Stages]) -> tuple[list, list, list, list]:
    """Stage times, memories, exposed DP time and optimizer time of each view, from one
    vectorised pass over the views' concatenated rows."""
    k, n = len(views), len(batches[0])
    rows = LayoutBatch.concat(batches)
    stages = Stages(*(np.concatenate([getattr(v, f) for v in views]) for f in ("index", "start", "layers")))
    for name in ("mtp", "in_flight"):  # set only where every view has them (all_stages rows)
        if all(getattr(v, name) is not None for v in views):
            setattr(stages, name, np.concatenate([getattr(v, name) for v in views]))
    t, dp_s, opt_s = view_time(p, rows, stages)
    mem = stage_memory(p, rows, stages)
    dp, opt = _split(dp_s, k, n), _split(opt_s, k, n)
    t_parts = {f.name: _split(getattr(t, f.name), k, n) for f in fields(T.StageTime)}
    m_parts = {f.name: _split(getattr(mem, f.name), k, n) for f in fields(MemoryBreakdown)}
    times = [T.StageTime(**{name: part[j] for name, part in t_parts.items()}) for j in range(k)]
    memories = [MemoryBreakdown(**{name: part[j] for name, part in m_parts.items()}) for j in range(k)]
    return times, memories, dp, opt


def evaluate(p: Problem, batch: LayoutBatch, views: list[Stages], counts: list[np.ndarray],
             view_batches: list[LayoutBatch] | None = None) -> StepCosts:
    """Cost ``batch`` from stage ``views``; ``counts[j]`` is how many pipeline stages view ``j``
    stands for (it weights the sum in the 1F1B makespan; 0 means the view is a duplicate).

    ``view_batches[j]`` (default ``batch``): the layouts as costed on view ``j``, e.g. each
    stage with its own recompute option (``estimate``). Few rows (one layout's stages) are
    costed in one pass over all views, many (the search) view by view.
    """
    k = len(views)
    batches = view_batches or [batch] * k
    groups = [range(k)] if k * len(batch) <= _CONCAT_ROWS else [range(j, j + 1) for j in range(k)]
    times, memories, dp, opt = [], [], [], []
    for group in groups:
        for out, part in zip((times, memories, dp, opt),
                             _cost_views(p, [batches[j] for j in group], [views[j] for j in group])):
            out.extend(part)
    peak = np.max(np.stack([mem.total_bytes for mem in memories]), axis=0)
    return combine(p, batch, counts, times, dp, opt, peak, memories)


def evaluate_stages_many(p: Problem, layouts: list[tuple[LayoutBatch, Stages]]) -> list[StepCosts]:
    """:func:`evaluate` of several layouts given stage by stage, each as ``(rows, stages)``: the
    layout repeated once per pipeline stage (row ``j`` with stage ``j``'s own recompute option)
    and its stages (:func:`autopar.cost.stage.all_stages`), each stage a view of its own counted
    once, as ``autopar estimate`` costs them. The stages of all layouts are costed in one
    vectorised pass (every cost term is row-wise), then each layout is combined alone, so each
    result equals its own ``evaluate(p, rows[0], views, [ones(1)] * pp, rows_by_stage)`` (which
    costs a layout's few rows in one pass too) while the per-pass overhead is paid once.

    Layouts whose stages set different optional fields (``mtp``, ``in_flight``) are costed in
    separate passes, since a concatenation keeps a field only where every layout has it."""
    out: list[StepCosts | None] = [None] * len(layouts)
    kinds: dict[tuple[bool, bool], list[int]] = {}
    for i, (_, stages) in enumerate(layouts):
        kinds.setdefault((stages.mtp is not None, stages.in_flight is not None), []).append(i)
    for (has_mtp, has_in_flight), members in kinds.items():
        rows = LayoutBatch.concat([layouts[i][0] for i in members])
        parts = [layouts[i][1] for i in members]
        stages = Stages(*(np.concatenate([getattr(v, f) for v in parts]) for f in ("index", "start", "layers")))
        stages.mtp = np.concatenate([v.mtp for v in parts]) if has_mtp else None
        stages.in_flight = np.concatenate([v.in_flight for v in parts]) if has_in_flight else None
        times, memories, dp, opt = _split_rows(p, rows, stages)
        at = 0
        for i in members:
            k = len(layouts[i][0])
            span = slice(at, at + k)
            at += k
            mem = memories[span]
            peak = np.max(np.stack([m.total_bytes for m in mem]), axis=0)
            out[i] = combine(p, layouts[i][0].take(np.zeros(1, dtype=np.int64)), [np.ones(1)] * k, times[span],
                             dp[span], opt[span], peak, mem)
    return out  # type: ignore[return-value]


def _split_rows(p: Problem, rows: LayoutBatch, stages: Stages) -> tuple[list, list, list, list]:
    """Stage times, memories, exposed DP time and optimizer time of each of the ``(layout, stage)``
    rows as a view of one row, from one vectorised pass (:func:`_cost_views` with a view per row)."""
    k = len(rows)
    t, dp_s, opt_s = view_time(p, rows, stages)
    mem = stage_memory(p, rows, stages)
    t_parts = {f.name: _split(getattr(t, f.name), k, 1) for f in fields(T.StageTime)}
    m_parts = {f.name: _split(getattr(mem, f.name), k, 1) for f in fields(MemoryBreakdown)}
    times = [T.StageTime(**{name: part[j] for name, part in t_parts.items()}) for j in range(k)]
    memories = [MemoryBreakdown(**{name: part[j] for name, part in m_parts.items()}) for j in range(k)]
    return times, memories, _split(dp_s, k, 1), _split(opt_s, k, 1)


_LAST_FLOPS: list = [None, 0.0]  # the last Problem combined and its model FLOPs per token


def _flops_per_token(p: Problem) -> float:
    """:func:`model_flops_per_token` of ``p``, kept for the last problem (a frozen dataclass of
    frozen specs): a search re-costs its top layouts with many :func:`evaluate` calls on one
    problem, and the count walks every layer in Python."""
    if _LAST_FLOPS[0] is not p:
        _LAST_FLOPS[:] = [p, model_flops_per_token(p)]
    return _LAST_FLOPS[1]


def mfu_peak_flops_per_s(p: Problem) -> float:
    """The peak FLOP/s per device that MFU divides by: the device's dense (no 2:4 sparsity) peak at
    the training precision, :meth:`~autopar.specs.cluster.DeviceSpec.peak` of ``p.train.precision``:
    bf16's (989e12 on h100-80gb) for bf16, fp8's (1,979e12) for fp8 training whatever its recipe
    (the nvfp4 recipe's fp4 linear layers included: its precision is fp8, as Megatron-LM's
    ``--fp4-format`` keeps the other layers in fp8/bf16).

    Raises:
        AutoparError: the device has no peak for the precision (e.g. fp8 on A100)."""
    return p.cluster.device.peak(p.train.precision)


def step_lower_bound_s(num_microbatches: np.ndarray, first_stage: T.StageTime | np.ndarray) -> np.ndarray:
    """A lower bound of :func:`combine`'s step time (s, ``(n,)``) from one stage's time:
    ``num_microbatches * t`` with ``t`` the per-micro-batch total of any of the layout's stages
    (a :class:`~autopar.cost.stage_time.StageTime`, or its ``total_s``; e.g. the largest over
    the stages costed so far), ``(n,)`` each.

    Proof (every term of :func:`combine` is a sum of non-negative times), with ``t_max >= t`` the
    slowest view, one that stands for a stage (a view counted 0 times repeats one that is counted):
    the 1F1B makespan ``sum_j c_j t_j + (M - 1) t_max >= t_max + (M - 1) t_max``, the interleaved
    one ``(M + (pp - 1)/vpp) t_max >= M t_max``, a V schedule's ``(M + bubble) t_max`` with a
    simulated bubble ``>= 0`` too; the hand-offs, the exposed data-parallel time and the optimizer
    step add ``>= 0``. Checked against :func:`evaluate` on random layouts by
    ``tests/cost/test_step_lower_bound.py``."""
    total = first_stage.total_s if isinstance(first_stage, T.StageTime) else first_stage
    return num_microbatches.astype(np.float64) * total


def makespan_lower_bound_s(num_microbatches: np.ndarray, pp: np.ndarray, vpp: np.ndarray, counts: list[np.ndarray],
                           totals: list[np.ndarray], v_shaped: np.ndarray | bool = False) -> np.ndarray:
    """A lower bound of :func:`combine`'s step time (s, ``(n,)``) from per-micro-batch totals
    ``totals`` (s, one ``(n,)`` per bounding view, each at most that view's stage time, e.g. a
    floor; a view counted 0 times repeats one that is counted) and the views' ``counts``: the
    pipeline makespan of :func:`combine`, ``sum_j c_j t_j + (M - 1) t_max`` for 1F1B and
    ``(M + (pp - 1)/vpp) t_max`` interleaved, and ``M t_max`` under a V schedule.

    Proof: both makespans are non-decreasing in every ``t_j`` (non-negative coefficients, and
    ``t_max`` is non-decreasing), so totals at most the stage times give at most
    :func:`combine`'s makespan, which it adds non-negative hand-off, data-parallel and optimizer
    times to; a V schedule's ``(M + bubble) t_max`` with a simulated bubble ``>= 0``
    (:func:`step_lower_bound_s`). With the stage times themselves, the bound is the makespan."""
    t_max = np.max(np.stack(totals), axis=0)
    m = num_microbatches.astype(np.float64)
    one_f_one_b = sum(c * tot for c, tot in zip(counts, totals)) + (m - 1) * t_max
    interleaved = (m + (pp - 1) / vpp) * t_max
    return np.where(v_shaped, m * t_max, np.where(vpp > 1, interleaved, one_f_one_b))


def combine(p: Problem, batch: LayoutBatch, counts: list[np.ndarray], times: list[T.StageTime],
            dp: list[np.ndarray], opt: list[np.ndarray], peak: np.ndarray,
            memories: list[MemoryBreakdown]) -> StepCosts:
    """The step costs of ``batch`` from its views' stage ``times``, exposed data-parallel times
    ``dp`` and optimizer times ``opt`` (one ``(n,)`` entry per view; ``counts`` as in
    :func:`evaluate`) and its ``peak`` memory (bytes): the pipeline makespan of the module
    docstring plus the hand-offs, the data-parallel traffic and the optimizer step of the slowest
    stage."""
    totals = np.stack([t.total_s for t in times])
    bottleneck = np.argmax(totals, axis=0)
    rows = np.arange(len(batch))
    t_max = totals[bottleneck, rows]
    m = batch.num_microbatches.astype(np.float64)
    one_f_one_b = sum(c * tot for c, tot in zip(counts, totals)) + (m - 1) * t_max
    interleaved = (m + (batch.pp - 1) / batch.vpp) * t_max
    makespan = np.where(batch.vpp > 1, interleaved, one_f_one_b)
    if np.any(batch.v_shaped):
        at = lambda field: np.stack([getattr(t, field) for t in times])[bottleneck, rows]  # noqa: E731
        compute, backward = np.maximum(at("compute_s"), 1e-30), at("backward_s")
        v_shaped = v_makespans_s(batch.v_schedule, batch.pp, batch.num_microbatches, t_max, at("forward_s") / compute,
                                 0.5 * backward / np.maximum(backward + at("recompute_s"), 1e-30))
        makespan = np.where(batch.v_shaped, v_shaped, makespan)

    p2p = T.p2p_time_s(p, batch)
    handoffs = np.where(batch.vpp > 1, batch.pp * batch.vpp - 1, m + batch.pp - 2)
    handoffs = np.where(batch.v_shaped, 2 * batch.pp - 2, handoffs)
    # Activation/gradient hand-offs on the critical path, plus the once-per-step all-reduce of a
    # tied embedding between the first and the last stage.
    pp_comm = np.where(batch.pp > 1, 2 * handoffs * p2p, 0.0) + T.tied_embedding_grad_s(p, batch)
    # After the flush each stage reduces its gradients and steps its optimizer; the step ends with the
    # stage whose two together take longest (not the largest of each, which two stages may hold).
    dp_views, opt_views = np.stack(dp), np.stack(opt)
    last = np.argmax(dp_views + opt_views, axis=0)
    dp_comm, optimizer = dp_views[last, rows], opt_views[last, rows]

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
    tokens = p.train.tokens_per_step
    tps = tokens / step / p.world_size
    mfu = _flops_per_token(p) * tokens / (step * p.world_size * mfu_peak_flops_per_s(p))
    return StepCosts(step, breakdown, peak, memories, tps, mfu, stage_times=times, stage_dp_s=dp)
