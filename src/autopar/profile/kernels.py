"""Megatron-equivalent fused kernels for Hugging Face modules (torch; CPU or CUDA).

autopar's activation model (:mod:`autopar.cost.activations`) describes what Megatron-Core keeps
for backward with its fused kernels. Hugging Face's eager modules keep other tensors: the eager
RMSNorm keeps three fp32 intermediates, the unfused SwiGLU keeps ``silu(gate)`` besides gate and
up, eager/SDPA-math attention keeps the ``s x s`` probabilities, and SDPA's output is copied
again before the output projection. To measure the layer as Megatron runs it, these autograd
functions save exactly what the fused kernels save, and :func:`install` swaps them into a
Hugging Face decoder layer:

================  ==========================================  ==============================
HF piece          replaced by                                 saved for backward
================  ==========================================  ==============================
attention         ``autopar_fused_attention``              q, k, v, output (b,s,h,d), fp32
                                                              log-sum-exp (FlashAttention-2,
                                                              Dao 2023, alg. 1-2)
``*RMSNorm``      :class:`RMSNormFn` (Apex/TE fused norm)     input, fp32 1/rms per token
MLP ``act*up``    :class:`SwiGLUFn` (Megatron                 gate and up (the fc1 output)
                  ``bias_swiglu_impl``)
routed experts    ``autopar_grouped`` (ExpertsInterface):     permuted tokens, per-expert fc1
                  permute, grouped GEMMs, unpermute           output, fc2 input, fc2 output
================  ==========================================  ==============================

The backward passes are the textbook ones (flash attention recomputes ``P`` from the
log-sum-exp), so gradients match the eager modules (tested against autograd).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

FLASH = "autopar_fused_attention"  # no "flash" in the name: transformers would look for a kernel
GROUPED = "autopar_grouped"


class FlashAttentionFn(torch.autograd.Function):
    """Causal attention that keeps what FlashAttention keeps.

    Shapes: q ``(b, hq, s, d)``, k ``(b, hkv, s, d)``, v ``(b, hkv, s, dv)`` with ``hq % hkv == 0``
    (GQA: query head ``i`` reads kv head ``i // (hq/hkv)``); returns ``(b, s, hq, dv)``.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale):
        groups = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        scores = torch.matmul(q.float(), kr.float().transpose(-1, -2)) * scale
        s_q, s_k = scores.shape[-2:]
        causal = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        scores = scores.masked_fill(~causal, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vr.float()).to(q.dtype)
        out = out.transpose(1, 2).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.groups = scale, groups
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        groups, scale = ctx.groups, ctx.scale
        kr, vr = k.repeat_interleave(groups, 1).float(), v.repeat_interleave(groups, 1).float()
        qf, d_out, o = q.float(), grad.transpose(1, 2).float(), out.transpose(1, 2).float()
        scores = torch.matmul(qf, kr.transpose(-1, -2)) * scale
        s_q, s_k = scores.shape[-2:]
        causal = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(s_k - s_q)
        prob = torch.exp(scores.masked_fill(~causal, float("-inf")) - lse.unsqueeze(-1))
        d_v = torch.matmul(prob.transpose(-1, -2), d_out)
        d_prob = torch.matmul(d_out, vr.transpose(-1, -2))
        d_scores = prob * (d_prob - (d_out * o).sum(-1, keepdim=True)) * scale
        d_q = torch.matmul(d_scores, kr)
        d_k = torch.matmul(d_scores.transpose(-1, -2), qf)

        def fold(x, like):  # sum the gradients of the query heads that shared a kv head
            b, h, s, d = x.shape
            return x.view(b, h // groups, groups, s, d).sum(2).to(like.dtype)

        return d_q.to(q.dtype), fold(d_k, k), fold(d_v, v), None


def flash_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface entry: causal :class:`FlashAttentionFn` (mask and dropout ignored:
    the profiled layers are causal and train without attention dropout). With
    ``module._autopar_selective`` the call is checkpointed as Megatron's selective recompute
    does: only q, k, v stay (reentrant checkpoint, so the kept inputs are visible to
    ``saved_tensors_hooks``)."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if getattr(module, "_autopar_selective", False):
        return checkpoint(FlashAttentionFn.apply, query, key, value, scale, use_reentrant=True), None
    return FlashAttentionFn.apply(query, key, value, scale), None


class RMSNormFn(torch.autograd.Function):
    """``w * x / rms(x)`` over the last dim, keeping the input and fp32 ``1/rms`` per row."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        gw = grad.float() * weight.float()
        d_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        d_w = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return d_x.to(x.dtype), d_w.to(weight.dtype), None


class SwiGLUFn(torch.autograd.Function):
    """``silu(gate) * up``, keeping only gate and up (``silu`` is recomputed in backward)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        g = gate.float()
        sig = torch.sigmoid(g)
        d_gate = grad.float() * up.float() * sig * (1 + g * (1 - sig))
        return d_gate.to(gate.dtype), (grad.float() * g * sig).to(up.dtype)


def grouped_experts(self, hidden_states, top_k_index, top_k_weights):
    """ExpertsInterface entry (Megatron ``MoEAlltoAllTokenDispatcher`` + grouped MLP, one rank).

    Shapes: hidden ``(n, h)``, indices and weights ``(n, k)``; experts ``gate_up_proj``
    ``(E, 2f, h)`` and ``down_proj`` ``(E, h, f)``. Tokens are permuted into expert order (one
    copy of ``n*k`` rows), run through each expert with :class:`SwiGLUFn`, concatenated,
    scaled by their routing weights and summed back per token (Megatron ``unpermute``).
    """
    k = top_k_index.shape[-1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    permuted = hidden_states[order // k]
    counts = torch.bincount(flat, minlength=self.num_experts).tolist()
    outputs, start = [], 0
    for expert, count in enumerate(counts):
        if count:
            rows = permuted[start:start + count]
            gate, up = F.linear(rows, self.gate_up_proj[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(SwiGLUFn.apply(gate, up), self.down_proj[expert]))
            start += count
    weights = top_k_weights.reshape(-1)[order].unsqueeze(-1).to(hidden_states.dtype)
    combined = torch.cat(outputs) * weights
    # scatter_add keeps only the index for backward (index_add would keep its whole source)
    index = (order // k).unsqueeze(-1).expand(-1, hidden_states.shape[-1])
    return torch.zeros_like(hidden_states).scatter_add(0, index, combined)


def _rmsnorm_forward(self, x):
    return RMSNormFn.apply(x, self.weight, self.variance_epsilon)


def _swiglu_mlp_forward(self, x):
    return self.down_proj(SwiGLUFn.apply(self.gate_proj(x), self.up_proj(x)))


def install(layer: torch.nn.Module) -> dict[str, int]:
    """Swap the fused kernels into ``layer`` (in place) and return how many modules of each kind
    were patched. The layer's config must select ``FLASH`` / ``GROUPED`` (see ``register``)."""
    patched = {"rmsnorm": 0, "swiglu": 0}
    for module in layer.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon"):
            module.forward = _rmsnorm_forward.__get__(module)
            patched["rmsnorm"] += 1
        elif all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            module.forward = _swiglu_mlp_forward.__get__(module)
            patched["swiglu"] += 1
    return patched


def register() -> None:
    """Register ``autopar_fused_attention`` and ``autopar_grouped`` with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    AttentionInterface.register(FLASH, flash_attention)
    ALL_EXPERTS_FUNCTIONS.register(GROUPED, grouped_experts)
