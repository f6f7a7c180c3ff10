"""How much of a layout's predicted compute the profile database backs, and from which source.

Per layout (:func:`coverage`): the share of one micro-batch's layer and output-layer compute
(forward + backward, layers weighted by how many of each kind, dense and MoE, the model has)
whose time comes from measurements, the source of each part (layer profile, operators, or the
analytic model) and the operator shapes still missing. A layer backed by its layer profile is
measured as a whole; otherwise each operator counts as measured when its shape is in the
database (or interpolated), and the element-wise work no operator covers (MoE permutation and
router scores, non-fused softmax) counts as unmeasured, as do GEMMs that run in fp8 under fp8
training (not listed as missing: ``profile ops`` measures bf16). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost import compute as C
from autopar.cost import fp8
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.profile.provider import ProfileTimes
from autopar.profile.shapes import Op, output_ops, unique
from autopar.strategy import Strategy


@dataclass
class Coverage:
    """``share`` in [0, 1] of the compute time that is measured; ``sources``: part -> source
    (``dense layer``, ``moe layer``, ``output``); ``missing``: operator shapes to profile."""

    share: float
    sources: dict[str, str]
    missing: list[Op]


def coverage(p: Problem, s: Strategy, times: ProfileTimes) -> Coverage:
    """The :class:`Coverage` of layout ``s`` under ``times`` (see the module docstring)."""
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size)
    measured = total = 0.0
    missing: list[Op] = []
    sources: dict[str, str] = {}
    n_moe = p.model.num_moe_layers
    for moe, count in ((False, p.model.num_layers - n_moe), (True, n_moe)):
        if not count:
            continue
        kind = "moe layer" if moe else "dense layer"
        with C.use_op_times(None):
            analytic = C.layer_forward_times(p, batch, moe)
        res = times.layer_result(p, batch, moe, analytic)
        if res.layer_option[0]:
            cost = float((res.times.forward_s + res.times.backward())[0])
            measured, total = measured + count * cost, total + count * cost
            sources[kind] = f"layer profile (recompute={res.layer_option[0]})"
            continue
        hits = 0
        for t in res.ops:
            cost = count * float((t.fwd_s + t.bwd_s)[0])
            total += cost
            if t.measured[0]:
                measured, hits = measured + cost, hits + 1
            elif t.rows.gemm is None or fp8.gemm_precision(p, t.rows.gemm.fp8) != "fp8":
                missing.append(t.rows.op())  # fp8 GEMMs are not listed: 'profile ops' measures bf16
        rest = 3 * float(res.other_fwd_s[0])
        total += count * rest
        sources[kind] = f"operators ({hits} of {len(res.ops)} measured" + (
            ", other element-wise work analytic)" if rest > 0 else ")")
    with C.use_op_times(None):
        head_analytic = float(C.output_forward_time_s(p, batch)[0])
    head, found = times.output_parts(p, batch)
    missing += [op for op, hit in zip(output_ops(p, batch), found[:, 0]) if not hit]
    if np.isnan(head[0]):
        total += 3 * head_analytic
        sources["output"] = "analytic"
    else:
        total += 3 * float(head[0])
        measured += 3 * float(head[0])
        sources["output"] = "operators"
    return Coverage(measured / total, sources, unique(missing))
