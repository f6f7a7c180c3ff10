"""Measured times in the planner: the provider behind ``--profile-db``.

:class:`ProfileTimes` is installed with :func:`autopar.cost.compute.use_op_times`; while it is,
:func:`autopar.cost.compute.layer_forward_times` and ``output_forward_time_s`` hand it their
analytic times and get back times with every measured part swapped in. Two sources, per layout
row:

1. **Layer profile** (``autopar profile layer --hf``): used when the database holds the decoder
   layer the row runs exactly (:func:`autopar.profile.shapes.layer_dims`: same model dimensions,
   tp/cp/ep/etp, mbs, sequence, device; bf16, not under fp8 training). It includes the
   element-wise work and the launch gaps that a sum of operators misses. Its recompute row is
   ``full`` for fully recomputed layouts (falling back to ``none``) and ``none`` otherwise: HF's
   SDPA attention is not checkpointed under ``--hf``, so a ``selective`` row times the same as
   ``none``, and the stage adds the recomputed core attention from the operators as usual.
   Corrections, from the operator times of the same row: the profiled layer runs one causal block
   of ``s/cp`` tokens, ring CP runs ``cp`` (add ``cp-1`` attention blocks); it runs norms and
   residual adds on all tokens, SP on ``1/tp`` of them (subtract ``tp-1`` times the SP-shard
   norms and adds). A ``full`` row's backward includes the recomputed forward, which the stage
   adds itself (:func:`autopar.cost.stage_time.stage_time`), so it is subtracted here. The
   forward is split into GEMM and attention (the operator times) and the rest (element-wise
   work and gaps), scaled down together if the layer is faster than its GEMMs and attention.
   ``--fused`` rows are not used for time: their attention materialises the score matrix in
   fp32 to keep exactly what FlashAttention keeps (for the saved-bytes check), far slower than
   the real kernel. A layer at another shape is not interpolated: its GEMMs scale linearly,
   attention quadratically in the tokens and the per-kernel overhead not at all, so no single
   work measure interpolates it; the operators, which do interpolate, cover those rows.
2. **Operators** (``autopar profile ops``): each GEMM (dense and grouped), the attention core
   (``cp`` blocks under CP), the norms, residual adds, RoPE and MLP activation take the
   database's forward and backward seconds when the shape is measured or log-log interpolated
   (:meth:`OpDB.lookup`), the roofline otherwise. GEMMs that run in fp8 under fp8 training stay
   analytic (``profile ops`` measures bf16). Element-wise work without an operator (MoE
   permutation and router scores, the softmax of non-fused attention, router kernels) stays
   analytic: ``analytic.elementwise_s`` minus the analytic share of the replaced operators.

Fast in a search: a layout's per-device compute depends only on :data:`SHAPE_COLUMNS`, so the
hooks cost the distinct combinations of those columns (``np.unique``, a few hundred among tens
of thousands of layouts) and scatter the results back; each distinct operator shape is looked up
once per session (memoised). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopar.cost import attention as attn
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import fp8, window
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.profile.opdb import OpDB, OpTime
from autopar.profile.shapes import Op, OpRows, gemm_rows, layer_dims, layer_rows

SHAPE_COLUMNS = ("tp", "cp", "ep", "etp", "mbs", "sp", "recompute")  # all a device's compute shapes depend on


def distinct_rows(batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(index of one row per distinct :data:`SHAPE_COLUMNS` combination, the combination of
    each row), so ``x[first][inverse]`` spreads per-combination values back over the batch."""
    cols = [np.asarray(getattr(batch, c), dtype=np.int64) for c in SHAPE_COLUMNS]
    radix = [int(c.max(initial=0)) + 1 for c in cols]
    if np.prod(radix, dtype=object) < 2**62:  # mixed-radix code of the columns: a fast 1-D unique
        key = np.zeros(len(batch), dtype=np.int64)
        for col, base in zip(cols, radix):
            key = key * base + col
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        _, first, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@dataclass
class Timed:
    """One operator of a layer over the layout rows: seconds per layer (all its calls) forward
    and backward, measured or analytic, and which rows are measured."""

    rows: OpRows
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    measured: np.ndarray  # bool per row


@dataclass
class LayerResult:
    """A layer's times with their sources: the operators, the analytic element-wise rest
    (``other_fwd_s``), and per row the layer-profile option used (``""``: none)."""

    times: C.LayerTimes
    ops: list[Timed]
    other_fwd_s: np.ndarray
    layer_option: np.ndarray  # str per row


@dataclass
class ProfileTimes:
    """Measured times from ``db`` for ``device`` in ``dtype``; the rest stays analytic."""

    db: OpDB
    device: str
    dtype: str
    _memo: dict = field(default_factory=dict)
    _last: tuple = ()  # (batch, first, inverse) of the last batch seen: stage views share one

    def _distinct(self, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
        """:func:`distinct_rows`, reused while the hooks see the same batch object."""
        if not self._last or self._last[0] is not batch:
            self._last = (batch, *distinct_rows(batch))
        return self._last[1], self._last[2]

    def lookup(self, op: Op) -> OpTime | None:
        """The database time of one operator (memoised per distinct shape)."""
        key = (op[0], tuple(sorted(op[1].items())))
        if key not in self._memo:
            self._memo[key] = self.db.lookup(self.device, op[0], op[1], self.dtype)
        return self._memo[key]

    def _rows(self, name: str, dims: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(forward s, backward s, found) of ``name`` per row; NaN where not found."""
        keys = list(dims)
        cols = np.stack([np.broadcast_to(dims[k], (n,)) for k in keys], axis=1)
        distinct, inverse = np.unique(cols, axis=0, return_inverse=True)
        found = [self.lookup((name, dict(zip(keys, map(int, row))))) for row in distinct]
        fwd = np.array([f.fwd_s if f else np.nan for f in found])[inverse.reshape(-1)]
        bwd = np.array([f.bwd_s if f else np.nan for f in found])[inverse.reshape(-1)]
        return fwd, bwd, ~np.isnan(fwd)

    def _time(self, p: Problem, r: OpRows, n: int) -> Timed:
        """A GEMM or element-wise operator, timed per row."""
        if r.gemm is not None:
            analytic = C.gemm_time_s(p, r.gemm)
        else:
            analytic = C.memory_time_s(p, r.bytes) * r.calls
        analytic = np.broadcast_to(np.asarray(analytic, dtype=np.float64), (n,))
        if r.gemm is not None and fp8.gemm_precision(p, r.gemm.fp8) == "fp8":
            return Timed(r, analytic, 2 * analytic, np.zeros(n, dtype=bool))
        fwd, bwd, hit = self._rows(r.name, r.dims, n)
        calls = np.broadcast_to(np.asarray(r.calls, dtype=np.float64), (n,))
        return Timed(r, np.where(hit, fwd * calls, analytic), np.where(hit, bwd * calls, 2 * analytic), hit)

    def ops(self, p: Problem, batch: LayoutBatch, moe: bool, analytic: C.LayerTimes) -> tuple[list[Timed], np.ndarray]:
        """(every operator of one layer, timed; the analytic element-wise forward no operator covers)."""
        n = len(batch)
        timed = [self._attention(p, batch, r) if r.role == "attention" else self._time(p, r, n)
                 for r in layer_rows(p, batch, moe)]
        covered = sum(C.memory_time_s(p, t.rows.bytes) * t.rows.calls for t in timed if t.rows.role == "elementwise")
        total = np.broadcast_to(analytic.elementwise_s, (n,))
        other = np.broadcast_to(total - covered, (n,))
        other = np.where(other > 1e-9 * total, other, 0.0)  # rounding of an exactly covered sum is no work
        return timed, other

    def _attention(self, p: Problem, batch: LayoutBatch, r: OpRows) -> Timed:
        """The attention core per row: ``cp`` measured blocks, or the analytic fused kernel."""
        n = len(batch)
        efficiency = window.mixed_block_efficiency(p.model, p.train.seq_len, attn.block_efficiency(p, batch))
        analytic = np.broadcast_to(C.attention_time_s(p, F.attention_core_flops(p, batch), efficiency), (n,))
        fwd, bwd, hit = self._rows(r.name, r.dims, n)
        if p.model.window_layers:  # the profiled causal SDPA has no window: its time is not these layers'
            hit = np.zeros_like(hit)
        return Timed(r, np.where(hit, fwd * batch.cp, analytic), np.where(hit, bwd * batch.cp, 2 * analytic), hit)

    def _layer_profile(self, p: Problem, batch: LayoutBatch, moe: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(forward s, backward s, recompute option used or "") of the profiled layer per row."""
        n = len(batch)
        none = (np.full(n, np.nan), np.full(n, np.nan), np.full(n, "", dtype=object))
        if self.dtype != "bf16" or p.train.precision == "fp8":
            return none
        cols = np.stack([np.broadcast_to(np.asarray(c, dtype=np.int64), (n,)) for c in
                         (batch.tp, batch.cp, batch.ep, batch.etp, batch.mbs, batch.recompute == 2)], axis=1)
        distinct, inverse = np.unique(cols, axis=0, return_inverse=True)
        found = []
        for tp, cp, ep, etp, mbs, full in distinct.tolist():
            hit = None
            for option in (["full", "none"] if full else ["none"]):
                dims = layer_dims(p.model, tp, cp, ep, etp, mbs, p.train.seq_len, moe, option, fused=False)
                if (t := self.lookup(("layer", dims))) is not None:
                    hit = (t.fwd_s, t.bwd_s, option)
                    break
            found.append(hit or (np.nan, np.nan, ""))
        inverse = inverse.reshape(-1)
        return (np.array([f[0] for f in found])[inverse], np.array([f[1] for f in found])[inverse],
                np.array([f[2] for f in found], dtype=object)[inverse])

    def layer_result(self, p: Problem, batch: LayoutBatch, moe: bool, analytic: C.LayerTimes) -> LayerResult:
        """The layer's times per row (layer profile, else operators) with their sources."""
        timed, other = self.ops(p, batch, moe, analytic)
        gemm = sum(t.fwd_s for t in timed if t.rows.role == "gemm")
        attn = next(t for t in timed if t.rows.role == "attention")
        elementwise = [t for t in timed if t.rows.role == "elementwise"]
        ops_elem = sum(t.fwd_s for t in elementwise) + other
        ops_bwd = sum(t.bwd_s for t in timed) + 2 * other

        f_meas, b_meas, option = self._layer_profile(p, batch, moe)
        hit = option != ""
        if not hit.any():
            times = C.LayerTimes(gemm_s=gemm, attention_s=attn.fwd_s, elementwise_s=ops_elem, backward_s=ops_bwd)
            return LayerResult(times, timed, other, option)
        cp, tp = batch.cp, batch.tp
        seq_ops = [t for t in elementwise if t.rows.name in (p.model.norm, "add")]
        sp_extra = np.where(batch.sp, tp - 1, 0)
        fwd = f_meas + (cp - 1) * attn.fwd_s / cp - sp_extra * sum(t.fwd_s for t in seq_ops)
        bwd = (b_meas - np.where(option == "full", f_meas, 0.0) + (cp - 1) * attn.bwd_s / cp
               - sp_extra * sum(t.bwd_s for t in seq_ops))
        core = gemm + attn.fwd_s
        scale = np.clip(fwd / core, 0.0, 1.0)
        times = C.LayerTimes(
            gemm_s=np.where(hit, gemm * scale, gemm),
            attention_s=np.where(hit, attn.fwd_s * scale, attn.fwd_s),
            elementwise_s=np.where(hit, np.maximum(fwd - core, 0.0), ops_elem),
            backward_s=np.where(hit, np.maximum(bwd, 0.0), ops_bwd),
        )
        return LayerResult(times, timed, other, option)

    def layer(self, p: Problem, batch: LayoutBatch, moe: bool, analytic: C.LayerTimes) -> C.LayerTimes:
        """``analytic`` with the measured layer or operator times swapped in (the hook), costed
        once per distinct :data:`SHAPE_COLUMNS` combination."""
        first, inverse = self._distinct(batch)
        n = len(batch)
        pick = {k: np.broadcast_to(getattr(analytic, k), (n,))[first]
                for k in ("gemm_s", "attention_s", "elementwise_s")}
        result = self.layer_result(p, batch.take(first), moe, C.LayerTimes(**pick))
        t = result.times
        # A row nothing measures keeps the analytic backward (with its own element-wise and fp8-cast
        # bytes, autopar.cost.elementwise_backward / fp8_backward), not twice the forward.
        measured = (result.layer_option != "") | np.any(
            [np.broadcast_to(op.measured, (len(first),)) for op in result.ops], axis=0)
        analytic_bwd = np.broadcast_to(analytic.backward(), (n,))[first]
        backward = np.where(measured, t.backward_s, analytic_bwd)
        return C.LayerTimes(gemm_s=t.gemm_s[inverse], attention_s=t.attention_s[inverse],
                            elementwise_s=t.elementwise_s[inverse], backward_s=backward[inverse])

    def output_parts(self, p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
        """(forward seconds of the output GEMM + cross entropy where both are measured, else NaN;
        per operator the rows found: shape (2, rows))."""
        n = len(batch)
        logits = gemm_rows(F.logits_gemm(p, batch), n)
        g_fwd, _, g_hit = self._rows(logits.name, logits.dims, n)
        ce = {"rows": np.broadcast_to(np.ceil(F.tokens(p, batch) - 1e-9).astype(np.int64), (n,)),
              "v": np.broadcast_to(np.ceil(p.padded_vocab(batch.tp) / batch.tp - 1e-9).astype(np.int64), (n,))}
        c_fwd, _, c_hit = self._rows("cross_entropy", ce, n)
        return np.where(g_hit & c_hit, g_fwd + c_fwd, np.nan), np.stack([g_hit, c_hit])

    def output(self, p: Problem, batch: LayoutBatch, analytic_s: np.ndarray) -> np.ndarray:
        """Forward seconds of the output GEMM + cross entropy: measured when both are."""
        first, inverse = self._distinct(batch)
        measured, _ = self.output_parts(p, batch.take(first))
        return np.where(np.isnan(measured[inverse]), analytic_s, measured[inverse])
