"""The operator shapes one device runs for a layout, derived from :mod:`autopar.cost.flops`.

One source of truth: GEMMs come from ``flops.attention_gemms`` / ``mlp_gemms`` /
``logits_gemm`` (grouped expert GEMMs keep their per-expert rows and expert count), attention
from the model's heads over ``tp`` at ``seq/cp`` (torch SDPA, causal), norms and the MLP
activation at the rows they run on (norms on the SP shard), the cross entropy on the
vocab-parallel fp32 logits. Row counts are rounded up to whole rows. No torch here.
"""

from __future__ import annotations

import math

import numpy as np

from autopar.cost import flops as F
from autopar.problem import Problem
from autopar.strategy import LayoutBatch, Strategy

Op = tuple[str, dict]  # (operator name, dimensions)


def _int(x) -> int:
    return int(math.ceil(float(np.asarray(x).reshape(-1)[0]) - 1e-9))


def gemm_op(g: F.Gemm) -> Op:
    """The knowledge-base key of one :class:`~autopar.cost.flops.Gemm` (first layout row)."""
    dims = {"m": _int(g.m), "n": _int(g.n), "k": _int(g.k)}
    if g.grouped:
        return "grouped_gemm", {"g": _int(g.count), **dims}
    return "gemm", dims


def attention_op(p: Problem, batch: LayoutBatch) -> Op:
    """Causal SDPA of one rank: ``b`` sequences of ``s/cp`` tokens, heads (and kv heads, at
    least one) over ``tp``; q/k width ``d`` and v width ``dv`` (MLA: nope+rope and v)."""
    m, t = p.model, int(batch.tp[0])
    kv = m.num_attention_heads if m.mla else m.num_kv_heads
    return "attention", {"b": int(batch.mbs[0]), "s": p.train.seq_len // int(batch.cp[0]),
                         "hq": m.num_attention_heads // t, "hkv": max(1, kv // t),
                         "d": m.attention_head_dim, "dv": m.v_head_dim if m.mla else m.head_dim}


def layer_ops(p: Problem, batch: LayoutBatch, moe: bool) -> list[Op]:
    """Every distinct operator of one decoder layer (dense or MoE) for the first layout row."""
    m = p.model
    n = _int(F.tokens(p, batch))
    t = int(batch.tp[0])
    rows_sp = _int(n / (t if bool(batch.sp[0]) else 1))
    ops = [gemm_op(g) for g in F.attention_gemms(p, batch) + F.mlp_gemms(p, batch, moe)]
    ops.append(attention_op(p, batch))
    ops.append((m.norm, {"rows": rows_sp, "h": m.hidden_size}))
    act = "swiglu" if m.gated_mlp else "gelu"
    if moe:
        k = m.num_experts_per_tok
        ops.append((act, {"rows": n * k, "f": _int(m.moe_ffn_hidden_size / batch.etp[0])}))
        if m.shared_expert_ffn_hidden_size:
            ops.append((act, {"rows": n, "f": _int(m.shared_expert_ffn_hidden_size / t)}))
    else:
        ops.append((act, {"rows": n, "f": _int(m.ffn_hidden_size / t)}))
    return ops


def output_ops(p: Problem, batch: LayoutBatch) -> list[Op]:
    """The output layer GEMM and the vocab-parallel cross entropy of the last stage."""
    n = _int(F.tokens(p, batch))
    vocab = _int(p.padded_vocab(batch.tp) / batch.tp)
    return [gemm_op(F.logits_gemm(p, batch)), ("cross_entropy", {"rows": n, "v": vocab})]


def strategy_ops(p: Problem, s: Strategy) -> list[Op]:
    """Distinct operators of one layout (its dense and MoE layers and its output layer)."""
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size)
    kinds = [False] if not p.model.is_moe else sorted({p.model.is_moe_layer(i) for i in range(p.model.num_layers)})
    ops = [op for moe in kinds for op in layer_ops(p, batch, moe)] + output_ops(p, batch)
    return unique(ops)


def unique(ops: list[Op]) -> list[Op]:
    """``ops`` without repeats, in first-seen order."""
    seen, out = set(), []
    for name, dims in ops:
        key = (name, tuple(sorted(dims.items())))
        if key not in seen:
            seen.add(key)
            out.append((name, dims))
    return out
