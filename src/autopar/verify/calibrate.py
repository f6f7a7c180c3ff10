"""Learn from short runs: store them in the profile DB and fit the model's efficiency factors.

The analytic step time is a sum of exposed parts (:data:`autopar.cost.step.TIME_KEYS`). Each part
belongs to one factor class (:func:`classes`): ``compute`` (GEMM, attention and element-wise
kernels, and the pipeline bubble, which is idle compute time), ``optimizer`` (memory-bound Adam),
``intra_comm`` and ``inter_comm`` (collectives and point-to-point inside a node or across nodes,
by where the group's ranks sit). A measured step time ``t_i`` is modelled as ``sum_c a_c T_ic``
with ``T_ic`` the predicted seconds of class ``c`` in run ``i``; the ``a_c >= 0`` are fitted by
non-negative least squares on the relative errors (rows divided by ``t_i``; Lawson and Hanson,
*Solving Least Squares Problems*, 1974, ch. 23, as ``scipy.optimize.nnls`` implements it).
Time is inversely proportional to efficiency, so class ``c``'s efficiencies are multiplied by
``1 / a_c`` (:data:`FACTORS`; capped so that no efficiency exceeds 1).

A class is fitted only when at least ``min_runs`` runs spend at least :data:`MIN_SHARE` of their
predicted step in it; otherwise it keeps ``a_c = 1`` and is reported as not applied. One run
never moves a factor silently: each factor carries the number of runs behind it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopar.errors import AutoparError
from autopar.export.result import FIELDS
from autopar.problem import Problem
from autopar.specs import ClusterSpec, ModelSpec, TrainSpec
from autopar.strategy import Strategy

CLASSES = ("compute", "optimizer", "intra_comm", "inter_comm")
# Class -> the DeviceSpec efficiency fields it scales (autopar.specs.cluster).
FACTORS = {"compute": ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency"),
           "optimizer": ("memory_efficiency",), "intra_comm": ("intra_node_comm_efficiency",),
           "inter_comm": ("inter_node_comm_efficiency",)}
MIN_SHARE = 0.05  # a run "stands behind" a class when >= 5% of its predicted step is in it
MIN_RUNS = 3
VERIFY_RECORD = "autopar verify runs: step times of {framework} jobs on the planned --device {device}"


def problem_json(p: Problem) -> str:
    """The problem a run ran, as JSON text (model, cluster with its device, training)."""
    return json.dumps({"model": p.model.model_dump(mode="json"), "cluster": p.cluster.model_dump(mode="json"),
                       "train": p.train.model_dump(mode="json")}, sort_keys=True)


def problem_from_json(text: str) -> Problem:
    """Inverse of :func:`problem_json`."""
    doc = json.loads(text)
    return Problem(ModelSpec.model_validate(doc["model"]), ClusterSpec.model_validate(doc["cluster"]),
                   TrainSpec.model_validate(doc["train"]))


def record_runs(path: str, p: Problem, jobs: list, results: list) -> int:
    """Store each run of ``jobs`` (failed ones too, with their cause) in the profile DB at
    ``path`` under ``p``'s device and the job's framework, with a ``measured_on`` record; returns
    how many were stored."""
    from autopar import __version__
    from autopar.profile.opdb import OpDB
    from autopar.profile.provenance import MeasuredOn

    db = OpDB(path, "--record")
    device = p.cluster.device.name
    stored = 0
    try:
        for job, r in zip(jobs, results):  # a --budget-s stop leaves later jobs without a result
            stored += 1
            db.put_run(device, job.framework, problem_json(p), json.dumps(job.layout, sort_keys=True), r.to_dict(),
                       job.name)
            db.put_measured_on(MeasuredOn(device, f"verify:{job.framework}", device, device, device, None, None, None,
                                          __version__, VERIFY_RECORD.format(framework=job.framework, device=device)))
    finally:
        db.close()
    return stored


def _link(p: Problem, group: int, stride: int) -> str:
    """``intra_comm`` when a group of ``group`` ranks ``stride`` apart sits in one node."""
    return "intra_comm" if group * stride <= p.cluster.devices_per_node or p.cluster.num_nodes == 1 else "inter_comm"


def classes(p: Problem, s: Strategy, breakdown: dict[str, float]) -> dict[str, float]:
    """Predicted seconds per factor class (module docstring). Megatron's rank order is tp, cp,
    (ep within dp), dp, pp: the tp group is contiguous, cp's stride is tp, dp's tp*cp, pp's
    tp*cp*dp."""
    out = dict.fromkeys(CLASSES, 0.0)
    out["compute"] = breakdown["compute"] + breakdown["pp_bubble"]
    out["optimizer"] = breakdown["optimizer"]
    out[_link(p, s.tp, 1)] += breakdown["tp_comm"]
    out[_link(p, s.cp, s.tp)] += breakdown["cp_comm"]
    out[_link(p, s.ep, s.tp * s.cp)] += breakdown["ep_comm"]
    out[_link(p, s.dp, s.tp * s.cp)] += breakdown["dp_comm"]
    out[_link(p, s.pp, s.tp * s.cp * s.dp)] += breakdown["pp_comm"]
    return out


@dataclass
class Fit:
    """A calibration of one (device, framework). ``multipliers``: class -> efficiency
    multiplier (1 / a_c); ``runs``: class -> runs behind it; ``applied``: classes fitted;
    ``error_before`` / ``error_after``: mean |predicted - measured| / measured over the runs;
    ``residual``: the root mean square relative error after the fit."""

    device: str
    framework: str
    runs_used: int
    multipliers: dict[str, float]
    runs: dict[str, int]
    applied: dict[str, bool]
    error_before: float
    error_after: float
    residual: float

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def fit(device: str, framework: str, rows: list[tuple[Problem, Strategy, float]], min_runs: int = MIN_RUNS) -> Fit:
    """Fit the class factors to ``rows`` of (problem, layout, measured step seconds).

    Raises:
        AutoparError: no run to fit (names ``--db``'s content).
    """
    from scipy.optimize import nnls

    from autopar.estimate import estimate

    if not rows:
        raise AutoparError(f"no successful runs of {framework} on {device} stored; run autopar verify --record DB")
    T = np.zeros((len(rows), len(CLASSES)))
    t = np.array([r[2] for r in rows])
    eff = np.zeros((len(rows), len(CLASSES)))  # the largest efficiency of each class, for the cap at 1
    for i, (p, s, _) in enumerate(rows):
        e = estimate(p, s)
        T[i] = [classes(p, s, e.time_breakdown_s)[c] for c in CLASSES]
        dev = p.cluster.device
        eff[i] = [max(getattr(dev, f) or 0.0 for f in FACTORS[c]) for c in CLASSES]
    share = T / T.sum(axis=1, keepdims=True)
    runs = (share >= MIN_SHARE).sum(axis=0)
    fitted = runs >= min_runs
    a = np.ones(len(CLASSES))
    if fitted.any():
        fixed = T[:, ~fitted].sum(axis=1)
        sol, _ = nnls(T[:, fitted] / t[:, None], (t - fixed) / t)
        a[fitted] = sol
    a = np.maximum(a, eff.max(axis=0))  # efficiency x (1/a) <= 1
    before = np.abs(T.sum(axis=1) - t) / t
    after = np.abs(T @ a - t) / t
    return Fit(device, framework, len(rows), {c: float(1 / a[k]) for k, c in enumerate(CLASSES)},
               {c: int(runs[k]) for k, c in enumerate(CLASSES)}, {c: bool(fitted[k]) for k, c in enumerate(CLASSES)},
               float(before.mean()), float(after.mean()), float(np.sqrt(np.mean(after ** 2))))


def stored_rows(db, device: str, framework: str) -> list[tuple[Problem, Strategy, float]]:
    """The successful stored runs of (``device``, ``framework``) as fit rows."""
    rows = []
    for run in db.runs(device):
        if run["framework"] == framework and not run["failure"] and run["step_time_s"]:
            layout = json.loads(run["layout"])
            fields = {k: layout[k] for k in FIELDS if k in layout}
            if fields.get("pipeline_layout") is not None:  # layers_per_stage holds its stage sums
                fields.pop("layers_per_stage", None)
            for key in ("layers_per_stage", "recompute_per_stage", "recompute_modules"):
                if key in fields:
                    fields[key] = tuple(fields[key] or ()) or None
            fields = {k: v for k, v in fields.items() if v is not None}
            rows.append((problem_from_json(run["problem"]), Strategy.model_validate(fields), float(run["step_time_s"])))
    return rows


def calibrated(p: Problem, path: str | None, framework: str) -> tuple[Problem, dict[str, Any] | None]:
    """``p`` with its device's efficiencies multiplied by the applied factors stored in the
    profile DB at ``path`` for (its device, ``framework``), and a summary (factor -> multiplier,
    runs, applied; the efficiencies used; whether the DB also holds operator rows) for the output; ``(p, None)`` without a DB or a calibration."""
    if path is None:
        return p, None
    from autopar.profile.opdb import OpDB

    db = OpDB(path, "--profile-db", write=False)
    try:
        found = db.calibration(p.cluster.device.name, framework)
        operator_rows = bool(db.devices())
    finally:
        db.close()
    if not found:
        return p, None
    dev = p.cluster.device
    update = {}
    for cls, (mult, _, applied) in found.items():
        for f in FACTORS.get(cls, ()):
            if applied and getattr(dev, f) is not None:
                update[f] = min(1.0, getattr(dev, f) * mult)
    cluster = p.cluster.model_copy(update={"device": dev.model_copy(update=update)})
    summary = {"factors": {c: {"multiplier": m, "runs": n, "applied": ok} for c, (m, n, ok) in found.items()},
               "efficiencies": update, "operator_rows": operator_rows}
    return Problem(p.model, cluster, p.train), summary
