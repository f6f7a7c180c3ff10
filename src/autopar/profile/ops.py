"""Operator microbenchmarks on the local device (torch; CUDA when present, else CPU).

Each operator runs forward then backward on random inputs of its shape (``shapes.Op``); the
median and spread of ``repeats`` timed runs after ``warmup`` untimed ones are stored with the
bytes the operator moves (its operands and result once). Attention is
``torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True)``; the
grouped expert GEMM is a batched GEMM of ``g`` equal groups; norms are ``F.rms_norm`` /
``F.layer_norm``; ``add`` is one residual add; ``rope`` rotates q and k (the half-rotation of
Llama's ``apply_rotary_pos_emb``) with one cos/sin table per row; the cross entropy runs on fp32
logits.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from autopar.errors import AutoparError
from autopar.profile.provenance import MeasuredOn, preset_for

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def local_device() -> tuple[str, str]:
    """(torch device string, knowledge-base device name) of this machine."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name()
    return "cpu", f"cpu:{platform.machine()}:{torch.get_num_threads()}t"


def library_versions() -> str:
    """The ``versions`` key: torch, and CUDA/cuDNN (ROCm/MIOpen on a ROCm build) when present."""
    parts = [f"torch={torch.__version__}"]
    if torch.cuda.is_available():
        runtime = f"rocm={torch.version.hip}" if torch.version.hip else f"cuda={torch.version.cuda}"
        parts += [runtime, f"cudnn={torch.backends.cudnn.version()}"]
    return " ".join(parts)


def measured_on(given_device: str | None, versions: str | None = None) -> MeasuredOn:
    """The record of this machine for the rows a profile run writes (:mod:`autopar.profile.provenance`):
    the name torch reports and its preset, ``given_device`` (the run's ``--device``, or None),
    torch, CUDA or ROCm and autopar versions. ``versions``: the rows' key (default
    :func:`library_versions`)."""
    from autopar import __version__

    name = local_device()[1]
    gpu = torch.cuda.is_available()
    return MeasuredOn(name, versions or library_versions(), name, preset_for(name), given_device, torch.__version__,
                      torch.version.cuda if gpu else None, torch.version.hip if gpu else None, __version__)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def _inputs(op: str, d: dict, dtype: torch.dtype, device: str) -> tuple[Callable[[], tuple], float]:
    """(forward closure over leaf tensors that require grad, returning its outputs; bytes moved)."""
    def leaf(*shape, dt=dtype):
        return torch.randn(*shape, dtype=dt, device=device).requires_grad_()

    size = torch.finfo(dtype).bits // 8
    if op == "gemm":
        a, b = leaf(d["m"], d["k"]), leaf(d["k"], d["n"])
        return (lambda: a @ b), size * (d["m"] * d["k"] + d["k"] * d["n"] + d["m"] * d["n"])
    if op == "grouped_gemm":
        a, b = leaf(d["g"], d["m"], d["k"]), leaf(d["g"], d["k"], d["n"])
        return (lambda: torch.bmm(a, b)), size * d["g"] * (d["m"] * d["k"] + d["k"] * d["n"] + d["m"] * d["n"])
    if op == "attention":
        q = leaf(d["b"], d["hq"], d["s"], d["d"])
        k = leaf(d["b"], d["hkv"], d["s"], d["d"])
        v = leaf(d["b"], d["hkv"], d["s"], d["dv"])
        moved = size * d["b"] * d["s"] * (d["hq"] * (d["d"] + d["dv"]) + d["hkv"] * (d["d"] + d["dv"]))
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)), moved
    if op in ("rmsnorm", "layernorm"):
        x, w = leaf(d["rows"], d["h"]), leaf(d["h"])
        norm = (lambda: F.rms_norm(x, (d["h"],), w)) if op == "rmsnorm" else (lambda: F.layer_norm(x, (d["h"],), w))
        return norm, size * 2 * d["rows"] * d["h"]
    if op == "add":
        x, y = leaf(d["rows"], d["h"]), leaf(d["rows"], d["h"])
        return (lambda: x + y), size * 3 * d["rows"] * d["h"]
    if op == "rope":
        q, k = leaf(d["rows"], d["hq"], d["d"]), leaf(d["rows"], d["hkv"], d["d"])
        cos, sin = (torch.randn(d["rows"], 1, d["d"], dtype=dtype, device=device) for _ in range(2))
        moved = size * 2 * d["rows"] * (d["hq"] + d["hkv"]) * d["d"]
        return (lambda: (_rotate(q, cos, sin), _rotate(k, cos, sin))), moved
    if op == "swiglu":
        gate, up = leaf(d["rows"], d["f"]), leaf(d["rows"], d["f"])
        return (lambda: F.silu(gate) * up), size * 3 * d["rows"] * d["f"]
    if op == "gelu":
        x = leaf(d["rows"], d["f"])
        return (lambda: F.gelu(x)), size * 2 * d["rows"] * d["f"]
    if op == "cross_entropy":
        logits = leaf(d["rows"], d["v"], dt=torch.float32)
        labels = torch.randint(0, d["v"], (d["rows"],), device=device)
        return (lambda: F.cross_entropy(logits, labels)), 4 * d["rows"] * d["v"]
    raise AutoparError(f"operator {op!r}: allowed gemm, grouped_gemm, attention, rmsnorm, layernorm, add, rope, "
                       "swiglu, gelu, cross_entropy")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(op: str, dims: dict, dtype: str, device: str, repeats: int = 5,
            warmup: int = 2) -> tuple[tuple[float, float], tuple[float, float], float]:
    """((fwd median, spread), (bwd median, spread), bytes moved) of one operator, seconds.

    Raises:
        AutoparError: unknown operator or dtype.
    """
    if dtype not in DTYPES:
        raise AutoparError(f"dtype={dtype!r}: allowed {', '.join(DTYPES)}")
    forward, moved = _inputs(op, dims, DTYPES[dtype], device)
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        _sync(device)
        start = time.perf_counter()
        out = forward()
        outs = out if isinstance(out, tuple) else (out,)
        _sync(device)
        mid = time.perf_counter()
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        _sync(device)
        if i >= warmup:
            fwd.append(mid - start)
            bwd.append(time.perf_counter() - mid)
    spread = lambda xs: (max(xs) - min(xs)) / 2  # noqa: E731
    return (statistics.median(fwd), spread(fwd)), (statistics.median(bwd), spread(bwd)), float(moved)
