"""Measured operator times in the planner: the provider behind ``--profile-db``.

:class:`ProfileTimes` is installed with :func:`autopar.cost.compute.use_op_times`; while it is,
:func:`autopar.cost.compute.layer_forward_times` and ``output_forward_time_s`` hand it their
analytic times and get back times where every GEMM (dense and grouped), the attention core and
the output layer + cross entropy are replaced by the knowledge base's forward and backward
seconds when the shape is measured (or interpolated, see :meth:`OpDB.lookup`). Element-wise
work inside a layer (norms, activation, residuals, RoPE) stays analytic: it is a few percent
of a layer and the roofline covers it. Attention under CP is ``cp`` times the causal SDPA of
the ``s/cp`` local tokens (ring attention does the same FLOPs in ``cp`` blocks).

Lookups are cached per distinct shape, and layouts sharing a shape share the lookup, so the
vectorised search pays one dictionary access per distinct shape. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.problem import Problem
from autopar.profile.opdb import OpDB, OpTime
from autopar.profile.shapes import Op, attention_op, gemm_op, output_ops
from autopar.strategy import LayoutBatch, Strategy


@dataclass
class Part:
    """One operator of a layer over the layout rows: analytic forward, and the result."""

    op: Op
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    measured: np.ndarray  # bool per row


@dataclass
class ProfileTimes:
    """Operator times from ``db`` for ``device`` in ``dtype``; the rest stays analytic."""

    db: OpDB
    device: str
    dtype: str
    _memo: dict = field(default_factory=dict)

    def _lookup(self, op: Op) -> OpTime | None:
        key = (op[0], tuple(sorted(op[1].items())))
        if key not in self._memo:
            self._memo[key] = self.db.lookup(self.device, op[0], op[1], self.dtype)
        return self._memo[key]

    def _part(self, rows: list[Op], analytic: np.ndarray, scale: np.ndarray | float = 1.0) -> Part:
        found = [self._lookup(op) for op in rows]
        hit = np.array([f is not None for f in found])
        fwd = np.array([f.fwd_s if f else 0.0 for f in found]) * scale
        bwd = np.array([f.bwd_s if f else 0.0 for f in found]) * scale
        analytic = np.broadcast_to(analytic, hit.shape)
        return Part(rows[0], np.where(hit, fwd, analytic), np.where(hit, bwd, 2 * analytic), hit)

    def parts(self, p: Problem, batch: LayoutBatch, moe: bool) -> list[Part]:
        """The GEMMs and attention of one layer, per layout row (measured or analytic)."""
        out = []
        for g in F.attention_gemms(p, batch) + F.mlp_gemms(p, batch, moe):
            rows = [gemm_op(_row(g, i)) for i in range(len(batch))]
            out.append(self._part(rows, C.gemm_time_s(p, g)))
        rows = [attention_op(p, batch.take(np.array([i]))) for i in range(len(batch))]
        out.append(self._part(rows, C.attention_time_s(p, F.attention_core_flops(p, batch)), batch.cp))
        return out

    def layer(self, p: Problem, batch: LayoutBatch, moe: bool, analytic: C.LayerTimes) -> C.LayerTimes:
        """``analytic`` with the measured GEMM and attention times swapped in."""
        parts = self.parts(p, batch, moe)
        gemm = sum(x.fwd_s for x in parts[:-1])
        backward = sum(x.bwd_s for x in parts) + 2 * analytic.elementwise_s
        return C.LayerTimes(gemm_s=gemm, attention_s=parts[-1].fwd_s, elementwise_s=analytic.elementwise_s,
                            backward_s=backward)

    def output(self, p: Problem, batch: LayoutBatch, analytic_s: np.ndarray) -> np.ndarray:
        """Forward seconds of the output GEMM + cross entropy: measured when both are."""
        found = [[self._lookup(op) for op in output_ops(p, batch.take(np.array([i])))] for i in range(len(batch))]
        measured = np.array([sum(f.fwd_s for f in row) if all(row) else np.nan for row in found])
        return np.where(np.isnan(measured), analytic_s, measured)


def _row(g: F.Gemm, i: int) -> F.Gemm:
    pick = lambda x: np.asarray(x).reshape(-1)[i] if np.ndim(x) else x  # noqa: E731
    return F.Gemm(pick(g.m), pick(g.n), pick(g.k), pick(g.count), fp8=g.fp8, grouped=g.grouped)


def coverage(p: Problem, s: Strategy, times: ProfileTimes) -> tuple[float, list[Op]]:
    """(share of one layout's per-micro-batch layer + output compute time (forward + backward)
    that comes from measurements, the operators still missing).

    Layers are weighted by how many of each kind (dense, MoE) the model has; element-wise work
    counts as unmeasured.
    """
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size)
    measured = total = 0.0
    missing: list[Op] = []
    n_moe = p.model.num_moe_layers
    for moe, count in ((False, p.model.num_layers - n_moe), (True, n_moe)):
        if not count:
            continue
        parts = times.parts(p, batch, moe)
        elementwise = 3 * float(C.memory_time_s(p, F.elementwise_bytes(p, batch, moe))[0])
        for x in parts:
            cost = float((x.fwd_s + x.bwd_s)[0])
            total += count * cost
            measured += count * cost if x.measured[0] else 0.0
            if not x.measured[0]:
                missing.append(x.op)
        total += count * elementwise
    for op in output_ops(p, batch):
        if times._lookup(op) is None:
            missing.append(op)
    head = 3 * float(C.output_forward_time_s(p, batch)[0])
    total += head
    measured += head if not any(op in missing for op in output_ops(p, batch)) else 0.0
    return measured / total, missing
