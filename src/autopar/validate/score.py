"""Predict what each measured row reports, in the row's own units and FLOP definition.

Metrics (``measured_metric`` column):

* ``step_time`` (s), ``tokens_per_s_per_gpu``, ``mfu`` (%, autopar's model FLOPs);
* ``model_tflops_per_gpu``: Megatron-LM's ``num_floating_point_operations`` of 2024 (r0.8):
  forward + 2x backward of every GEMM and of attention *without* halving for the causal mask;
* ``tflops_per_gpu_incl_recompute``: Narayanan et al. SC'21 eq. 3 (hardware FLOPs): the same
  with one more forward of every layer for full recompute (the logits are not recomputed);
* ``peak_mem_per_gpu``: peak bytes of the worst stage (GiB; the BLOOM sweep's "GB" are the
  ``/2**30`` numbers DeepSpeed's memory report prints under that label);
* ``oom_observed``: 1 when the layout is predicted not to fit;
* ``layer_fwd_bwd_time`` (ms): forward + backward (+ recompute) of one decoder layer, with its
  TP collectives, on a middle pipeline stage.

A row that cannot be scored (a metric without a prediction, a cell autopar cannot map, a
layout the rules refuse) is listed with its reason, not scored; :func:`score_row` never raises
for one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost import flops as F
from autopar.cost.stage import Stages
from autopar.cost.stage_time import stage_time
from autopar.errors import AutoparError
from autopar.estimate import Estimate, estimate
from autopar.layout_batch import LayoutBatch
from autopar.progress import advance, phase
from autopar.validate.rows import Case, Row, Unscorable, to_case

GIB = 2**30
METRICS = ("step_time", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "tflops_per_gpu_incl_recompute", "mfu",
           "peak_mem_per_gpu", "layer_fwd_bwd_time", "oom_observed")
THROUGHPUT = ("step_time", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "tflops_per_gpu_incl_recompute", "mfu",
              "layer_fwd_bwd_time")


@dataclass
class Result:
    """One row's outcome: ``predicted`` is None when the row was not scored (``reason`` says why)."""

    row: Row
    case: Case | None
    predicted: float | None
    reason: str = ""

    @property
    def measured(self) -> float:
        return float(self.row["measured_value"])

    @property
    def metric(self) -> str:
        return self.row["measured_metric"]

    @property
    def error_pct(self) -> float | None:
        """Signed error of the prediction, 100 * (predicted - measured) / measured; None for
        unscored and boolean (OOM) rows."""
        if self.predicted is None or self.metric == "oom_observed":
            return None
        return error_pct(self.predicted, self.measured)


def error_pct(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def _one_batch() -> LayoutBatch:
    ones = {k: np.ones(1, dtype=np.int64) for k in (
        "dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "recompute_layers", "num_microbatches")}
    return LayoutBatch(**ones, sp=np.zeros(1, dtype=bool), recompute=np.zeros(1, dtype=np.int64))


def reported_flops_per_step(case: Case, with_recompute: bool) -> float:
    """Megatron-style FLOPs per step: 3 passes (+1 layer forward with recompute) of every GEMM,
    attention s^2 counted in full (not halved), logits at the unpadded vocabulary."""
    p, one = case.problem, _one_batch()
    m, seq = p.model, p.train.seq_len
    layers = 0.0
    for i in range(m.num_layers):
        ops = F.attention_gemms(p, one) + F.mlp_gemms(p, one, m.is_moe_layer(i))
        layers += float(sum(g.flops for g in ops)[0]) + 2 * float(F.attention_core_flops(p, one)[0])
    logits = 2.0 * seq * m.hidden_size * m.vocab_size
    passes = 4 if with_recompute else 3
    return (passes * layers + 3 * logits) / seq * p.train.tokens_per_step


def layer_time_s(case: Case) -> float:
    """Forward + backward (+ recompute) of one decoder layer on a middle stage, one micro-batch."""
    p = case.problem
    batch = LayoutBatch.from_strategy(case.strategy, p.train.global_batch_size)
    batch.pp = np.array([3])  # a middle stage: neither the embedding nor the output layer
    stage = Stages(index=np.array([1]), start=np.array([0]), layers=np.array([1]))
    return float(stage_time(p, batch, stage).total_s[0])


def predict(case: Case, est: Estimate) -> float:
    """The row's metric as autopar predicts it (in the row's units)."""
    metric, world = case.row["measured_metric"], case.problem.world_size
    if metric == "step_time":
        return est.step_time_s
    if metric == "tokens_per_s_per_gpu":
        return est.tokens_per_s_per_device
    if metric == "mfu":
        return 100 * est.mfu
    if metric in ("model_tflops_per_gpu", "tflops_per_gpu_incl_recompute"):
        flops = reported_flops_per_step(case, metric == "tflops_per_gpu_incl_recompute")
        return flops / est.step_time_s / world / 1e12
    if metric == "peak_mem_per_gpu":
        return est.peak_memory_bytes / GIB
    if metric == "oom_observed":
        return 0.0 if est.fits else 1.0
    if metric == "layer_fwd_bwd_time":
        return 1e3 * layer_time_s(case)
    raise Unscorable(f"metric {metric!r} has no prediction")


def score_row(row: Row, cache: dict) -> Result:
    """Map, estimate (once per distinct run, ``cache`` keyed by problem and layout) and predict
    one row. Never raises for a bad row: the result then has ``predicted=None`` and the reason
    (:class:`~autopar.validate.rows.Unscorable`'s, or the rules' refusal of the layout)."""
    try:
        if row["measured_metric"] not in METRICS:
            raise Unscorable(f"measured_metric={row['measured_metric']!r}: no prediction for it (FLOP definition "
                             f"not given); scored metrics: {', '.join(METRICS)}")
        case = to_case(row)
        key = repr((case.problem, case.strategy))
        if key not in cache:
            cache[key] = estimate(case.problem, case.strategy)
        return Result(row, case, predict(case, cache[key]))
    except Unscorable as err:
        return Result(row, None, None, str(err))
    except AutoparError as err:
        return Result(row, None, None, f"layout rejected: {err}")


def score_rows(rows: list[Row]) -> list[Result]:
    """:func:`score_row` for every row, in order, sharing one estimate cache."""
    cache: dict = {}
    results = []
    with phase("validate", total=len(rows), description="scoring the measurement rows"):
        for r in rows:
            results.append(score_row(r, cache))
            advance()
    return results
