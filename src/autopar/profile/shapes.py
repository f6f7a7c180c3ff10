"""The operator shapes one device runs for a layout, derived from :mod:`autopar.cost.flops`.

One source of truth: GEMMs come from ``flops.attention_gemms`` / ``mlp_gemms`` /
``logits_gemm`` (grouped expert GEMMs keep their per-expert rows and expert count), attention
from the model's heads over ``tp`` at ``seq/cp`` (torch SDPA, causal), the element-wise ops at
the rows they run on and with the bytes ``flops.elementwise_bytes`` gives them: norms and the
two residual adds on the SP shard, RoPE on q and k, the MLP activation (routed experts on the
busiest expert rank's rows, as the grouped GEMM), the cross entropy on the vocab-parallel fp32
logits. Dimensions are rounded up to whole rows. :func:`layer_dims` is the key of a profiled
decoder layer. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autopar.cost import flops as F
from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs import ModelSpec
from autopar.strategy import Strategy

Op = tuple[str, dict]  # (operator name, dimensions)
ELEMENTWISE = ("rmsnorm", "layernorm", "add", "rope", "swiglu", "gelu")


def _int(x) -> int:
    return int(math.ceil(float(np.asarray(x).reshape(-1)[0]) - 1e-9))


def _ints(x, n: int) -> np.ndarray:
    """``x`` (scalar or per-row) rounded up to whole numbers, one per layout row."""
    return np.broadcast_to(np.ceil(np.asarray(x, dtype=np.float64) - 1e-9).astype(np.int64), (n,))


@dataclass
class OpRows:
    """One operator of a layer over the layout rows.

    ``dims``: integer dimensions per row; ``calls``: calls per layer (norms per layer, 2 residual
    adds, ``cp`` attention blocks under ring CP, a non-grouped GEMM's count); ``gemm``: the
    analytic GEMM it stands for; ``bytes``: forward HBM bytes of one call (element-wise ops, the
    share of ``flops.elementwise_bytes`` it replaces).
    """

    name: str
    dims: dict[str, np.ndarray]
    calls: np.ndarray | float = 1.0
    gemm: F.Gemm | None = None
    bytes: np.ndarray | float = 0.0

    @property
    def role(self) -> str:
        if self.gemm is not None:
            return "gemm"
        return "attention" if self.name == "attention" else "elementwise"

    def op(self, i: int = 0) -> Op:
        """The knowledge-base key of row ``i``."""
        return self.name, {k: int(v[i]) for k, v in self.dims.items()}


def gemm_rows(g: F.Gemm, n: int) -> OpRows:
    """A :class:`~autopar.cost.flops.Gemm` as operator rows (grouped: one call of ``g`` GEMMs)."""
    dims = {"m": _ints(g.m, n), "n": _ints(g.n, n), "k": _ints(g.k, n)}
    if g.grouped:
        return OpRows("grouped_gemm", {"g": _ints(g.count, n), **dims}, gemm=g)
    return OpRows("gemm", dims, calls=g.count, gemm=g)


def gemm_op(g: F.Gemm) -> Op:
    """The knowledge-base key of one :class:`~autopar.cost.flops.Gemm` (first layout row)."""
    return gemm_rows(g, 1).op()


def attention_rows(p: Problem, batch: LayoutBatch) -> OpRows:
    """Causal SDPA of one rank: ``b`` sequences of ``s/cp`` tokens, heads (and kv heads, at
    least one) over ``tp``; q/k width ``d`` and v width ``dv`` (MLA: nope+rope and v). Ring CP
    runs ``cp`` such blocks (the same FLOPs as causal attention of the local queries over all
    keys, Liu et al. 2023)."""
    m, n = p.model, len(batch)
    kv = m.num_attention_heads if m.mla else m.num_kv_heads
    dims = {"b": _ints(batch.mbs, n), "s": _ints(p.train.seq_len // batch.cp, n),
            "hq": _ints(m.num_attention_heads // batch.tp, n), "hkv": _ints(np.maximum(1, kv // batch.tp), n),
            "d": _ints(m.attention_head_dim, n), "dv": _ints(m.v_head_dim if m.mla else m.head_dim, n)}
    return OpRows("attention", dims, calls=batch.cp)


def attention_op(p: Problem, batch: LayoutBatch) -> Op:
    """The attention key of the first layout row (see :func:`attention_rows`)."""
    return attention_rows(p, batch).op()


def elementwise_rows(p: Problem, batch: LayoutBatch, moe: bool) -> list[OpRows]:
    """Norms, residual adds, RoPE and the MLP activation of one layer, with the forward bytes
    ``flops.elementwise_bytes`` counts for each (bf16)."""
    m, b, n_rows = p.model, F.BF16, len(batch)
    n, t, h = F.tokens(p, batch), batch.tp, m.hidden_size
    n_seq = n / np.where(batch.sp, t, 1)
    heads = m.num_attention_heads
    q_d = m.q_width / heads
    hkv = heads if m.mla else m.num_kv_heads
    seq_rows = {"rows": _ints(n_seq, n_rows), "h": _ints(h, n_rows)}
    rows = [OpRows(m.norm, seq_rows, m.norms_per_layer, bytes=b * 2 * n_seq * h),
            OpRows("add", seq_rows, 2, bytes=b * 3 * n_seq * h),
            OpRows("rope", {"rows": _ints(n, n_rows), "hq": _ints(heads // t, n_rows),
                            "hkv": _ints(np.maximum(1, hkv // t), n_rows), "d": _ints(q_d, n_rows)},
                   bytes=b * 2 * n * (m.q_width + (m.q_width if m.mla else m.kv_width)) / t)]
    act, rw = ("swiglu", 3) if m.gated_mlp else ("gelu", 2)

    def activation(r, f):
        return OpRows(act, {"rows": _ints(r, n_rows), "f": _ints(f, n_rows)}, bytes=b * rw * r * f)

    if moe:
        rows.append(activation(moe_cost.expert_rows(p, batch), m.moe_ffn_hidden_size / batch.etp))
        if m.shared_expert_ffn_hidden_size:
            rows.append(activation(n, m.shared_expert_ffn_hidden_size / t))
    else:
        rows.append(activation(n, m.ffn_hidden_size / t))
    return rows


def layer_rows(p: Problem, batch: LayoutBatch, moe: bool) -> list[OpRows]:
    """Every operator of one decoder layer (dense or MoE) over the layout rows: GEMMs, then
    attention, then the element-wise ops."""
    n = len(batch)
    gemms = [gemm_rows(g, n) for g in F.attention_gemms(p, batch) + F.mlp_gemms(p, batch, moe)]
    return gemms + [attention_rows(p, batch)] + elementwise_rows(p, batch, moe)


def layer_ops(p: Problem, batch: LayoutBatch, moe: bool) -> list[Op]:
    """Every distinct operator of one decoder layer (dense or MoE) for the first layout row."""
    return unique([r.op() for r in layer_rows(p, batch, moe)])


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


def arch(m: ModelSpec) -> str:
    """The dimensions that decide a decoder layer's work, as text (the ``arch`` of a layer key):
    hidden, heads, kv heads, head dim, FFN, activation and norm; experts, top-k, expert and
    shared FFN for MoE; the MLA ranks and head dims."""
    text = (f"h{m.hidden_size}-a{m.num_attention_heads}-kv{m.num_kv_heads}-d{m.head_dim}-f{m.ffn_hidden_size}"
            f"-{'glu' if m.gated_mlp else 'mlp'}-{m.norm}")
    if m.num_experts:
        text += f"-e{m.num_experts}k{m.num_experts_per_tok}f{m.moe_ffn_hidden_size}s{m.shared_expert_ffn_hidden_size}"
    if m.mla:
        text += f"-mla{m.q_lora_rank}.{m.kv_lora_rank}.{m.qk_nope_head_dim}.{m.qk_rope_head_dim}.{m.v_head_dim}"
    return text


def layer_dims(m: ModelSpec, tp: int, cp: int, ep: int, etp: int, mbs: int, seq: int, moe: bool, recompute: str,
               fused: bool) -> dict:
    """Key of one profiled decoder layer (``op='layer'``): the model's :func:`arch`, the shard
    (a dense layer ignores ep and etp: stored as 1 and tp), the micro-batch, the recompute option
    and whether Megatron-equivalent kernels (``fused``) or HF's own ran."""
    if not moe:
        ep, etp = 1, tp
    return {"arch": arch(m), "moe": int(moe), "tp": int(tp), "cp": int(cp), "ep": int(ep), "etp": int(etp),
            "mbs": int(mbs), "seq": int(seq), "recompute": recompute, "fused": int(fused)}
