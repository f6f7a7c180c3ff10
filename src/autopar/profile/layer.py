"""Profile the model's own decoder layer at the width one device runs (torch + transformers).

A TP=8 shard of a 70B layer is a narrower layer: :func:`sharded_config` divides the
attention heads and kv heads by ``tp`` (kv heads never below one, as Megatron replicates
them), the dense FFN by ``tp``, the routed experts by ``ep`` and their FFN by ``etp``, and the
sequence by ``cp``. :func:`build_layer` instantiates the Hugging Face decoder layer from that
config on the meta device, then materialises it on the target device, so a 70B config costs
only one layer's memory.

:func:`profile_layer` runs forward and backward under a recompute option (``none``;
``selective`` = checkpointed core attention; ``full`` = checkpointed layer, reentrant so the
kept input is visible) and records the median times, the bytes saved for backward (counted
with ``torch.autograd.graph.saved_tensors_hooks`` by distinct storage, which is what stays
allocated; parameters and the shared RoPE tables are excluded) and, on CUDA, the peak memory
above the weights and input.

Attention mapping. autopar's analytic estimate (:mod:`autopar.cost.activations`) with flash
attention on describes Megatron-Core with fused kernels. With ``fused=True`` (the default) the
layer runs the kernels of :mod:`autopar.profile.kernels` that keep what those fused kernels
keep, so its saved bytes compare term by term with the analytic ones; ``fused=False`` keeps
the HF modules as they are (``sdpa`` attention on CUDA, which is what HF training runs; its
backward is the real kernel's, so use it for timing on a GPU).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from autopar.errors import AutoparError
from autopar.profile import kernels

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Shard:
    """What one device runs of a layer: parallel degrees and the micro-batch (tokens)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    mbs: int = 1
    seq: int = 4096


@dataclass(frozen=True)
class LayerProfile:
    """Measured costs of one decoder layer on one micro-batch (seconds, bytes).

    ``bwd_s`` includes the recomputed forward; ``peak_bytes`` is None off CUDA.
    """

    fwd_s: float
    fwd_spread_s: float
    bwd_s: float
    bwd_spread_s: float
    saved_bytes: float
    peak_bytes: float | None


def raw_config(model: str) -> dict[str, Any]:
    """The HF ``config.json`` dict of a preset name or a path.

    Raises:
        AutoparError: neither a readable JSON file nor a preset.
    """
    path = Path(model)
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as err:  # not JSON, not UTF-8, [[[...]]]
            raise AutoparError(f"--model: cannot read {model!r} as a config.json "
                               f"({' '.join(str(err).split())})") from None
        if not isinstance(raw, dict):
            raise AutoparError(f"--model: {model!r} must hold a JSON object, got {type(raw).__name__}")
        return raw
    preset = resources.files("autopar") / "data" / "models" / f"{model}.json"
    if not preset.is_file():
        raise AutoparError(f"--model={model!r}: not a file and not a preset")
    return json.loads(preset.read_text())


def _divide(raw: dict[str, Any], key: str, by: int) -> None:
    if raw.get(key):
        if raw[key] % by:
            raise AutoparError(f"{key}={raw[key]} is not divisible by {by}")
        raw[key] //= by


def sharded_config(raw: dict[str, Any], shard: Shard, layer_index: int):
    """A transformers config of ``layer_index + 1`` layers whose widths are one shard's.

    Raises:
        AutoparError: a width is not divisible by its degree, or top-k exceeds the local experts.
    """
    from transformers import AutoConfig

    raw = dict(raw)
    kind = raw["model_type"]
    heads = raw["num_attention_heads"]
    if not raw.get("kv_lora_rank"):  # MHA/GQA: keep the per-head width when heads are split
        raw.setdefault("head_dim", raw["hidden_size"] // heads)
    _divide(raw, "num_attention_heads", shard.tp)
    raw["num_key_value_heads"] = max(1, raw.get("num_key_value_heads", heads) // shard.tp)
    expert_keys = ("num_local_experts", "n_routed_experts", "num_experts")
    if any(raw.get(k) for k in expert_keys):
        for key in expert_keys:
            _divide(raw, key, shard.ep)
        local = next(raw[k] for k in expert_keys if raw.get(k))
        if raw.get("num_experts_per_tok", 0) > local:
            raise AutoparError(f"ep={shard.ep}: top-k {raw['num_experts_per_tok']} exceeds {local} local experts")
        _divide(raw, "moe_intermediate_size", shard.etp)
        _divide(raw, "shared_expert_intermediate_size", shard.tp)
        raw["n_group"], raw["topk_group"] = 1, 1  # group-limited routing needs all experts
        _divide(raw, "intermediate_size", shard.etp if kind == "mixtral" else shard.tp)
    else:
        _divide(raw, "intermediate_size", shard.tp)
    raw.update(num_hidden_layers=layer_index + 1, vocab_size=128, attention_dropout=0.0)
    raw.pop("quantization_config", None)
    return AutoConfig.for_model(kind, **{k: v for k, v in raw.items() if k != "model_type"})


def build_layer(raw: dict[str, Any], shard: Shard, moe: bool, device: str, dtype: torch.dtype,
                fused: bool = True) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder layer, rotary embedding) of one shard, materialised on ``device``.

    The whole model skeleton is built on the meta device (no memory), one layer is moved to
    ``device`` and initialised (normal(0, 0.02) matrices, unit norms).

    Raises:
        AutoparError: the model has no layer of the requested kind (``moe``).
    """
    from transformers import AutoModel

    from autopar.specs import model_from_hf_dict

    spec = model_from_hf_dict(raw, name=raw.get("model_type", "model"))
    if moe:
        if not spec.moe_layers:
            raise AutoparError(f"{spec.name}: has no MoE layer")
        index = spec.moe_layers[0]
    else:
        index = next((i for i in range(spec.num_layers) if not spec.is_moe_layer(i)), None)
        if index is None:
            raise AutoparError(f"{spec.name}: has no dense layer")
    config = sharded_config(raw, shard, index)
    if fused:
        kernels.register()
        config._attn_implementation = kernels.FLASH
        config._experts_implementation = kernels.GROUPED
    else:
        config._attn_implementation = "sdpa"
    with torch.device("meta"):
        skeleton = AutoModel.from_config(config)
    layer = skeleton.layers[index].to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if param.dim() == 1:
                param.fill_(0.0 if name.endswith("bias") else 1.0)
            else:
                param.normal_(0.0, 0.02)
        for name, buf in layer.named_buffers():
            buf.zero_()
    layer.train()
    if fused:
        kernels.install(layer)
    with torch.device(device):
        rotary = type(skeleton.rotary_emb)(config=config)
    return layer, rotary


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def saved_for_backward(fn, exclude: set[int]) -> tuple[Any, int]:
    """(``fn()``, bytes of the distinct storages autograd saved while running it)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile_layer(layer: torch.nn.Module, rotary: torch.nn.Module, shard: Shard, recompute: str,
                  device: str, dtype: torch.dtype, repeats: int = 3, warmup: int = 1) -> LayerProfile:
    """Time forward and backward of ``layer`` on ``mbs x seq/cp`` tokens under ``recompute``.

    Raises:
        AutoparError: unknown recompute option, or ``seq`` not divisible by ``cp``.
    """
    from torch.utils.checkpoint import checkpoint

    if recompute not in RECOMPUTE:
        raise AutoparError(f"--recompute={recompute!r}: allowed {', '.join(RECOMPUTE)}")
    if shard.seq % shard.cp:
        raise AutoparError(f"--seq-len={shard.seq} is not divisible by cp={shard.cp}")
    tokens = shard.seq // shard.cp
    hidden = layer.self_attn.config.hidden_size
    for module in layer.modules():
        module._autopar_selective = recompute == "selective"
    positions = torch.arange(tokens, device=device).unsqueeze(0).expand(shard.mbs, -1)
    x = torch.randn(shard.mbs, tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    cos, sin = rotary(x, positions)
    exclude = _storages(layer.parameters()) | _storages(layer.buffers()) | _storages((cos, sin))

    def run(inp):
        return layer(inp, attention_mask=None, position_embeddings=(cos, sin), position_ids=positions)

    def forward():
        if recompute == "full":
            return checkpoint(run, x, use_reentrant=True)
        return run(x)

    fwd, bwd, saved, peak = [], [], 0, None
    for i in range(warmup + repeats):
        _sync(device)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        out, saved = saved_for_backward(forward, exclude)
        _sync(device)
        mid = time.perf_counter()
        out.backward(torch.ones_like(out))
        _sync(device)
        end = time.perf_counter()
        x.grad = None
        layer.zero_grad(set_to_none=True)
        if i >= warmup:
            fwd.append(mid - start)
            bwd.append(end - mid)
            if device.startswith("cuda"):
                peak = max(peak or 0, torch.cuda.max_memory_allocated() - base)
        del out
    return LayerProfile(statistics.median(fwd), _spread(fwd), statistics.median(bwd), _spread(bwd),
                        float(saved), None if peak is None else float(peak))


def _spread(values: list[float]) -> float:
    """Half the range of the repeats (seconds); 0 for one repeat."""
    return (max(values) - min(values)) / 2


def analytic_layer_bytes(raw: dict[str, Any], shard: Shard, recompute: str, moe: bool) -> float:
    """autopar's activation bytes of the same layer and micro-batch (flash attention, no SP):
    ``attention_bytes + mlp_bytes``, or ``layer_input_bytes`` under full recompute."""
    import numpy as np

    from autopar.cost import activations as act
    from autopar.layout_batch import LayoutBatch
    from autopar.problem import Problem
    from autopar.specs import TrainSpec, load_device, make_cluster, model_from_hf_dict
    from autopar.strategy import Strategy

    spec = model_from_hf_dict(raw, name=raw.get("model_type", "model"))
    world = shard.tp * shard.cp * max(1, shard.ep * shard.etp // (shard.tp * shard.cp))
    problem = Problem(spec, make_cluster(load_device("h100-80gb"), 1, world),
                      TrainSpec(global_batch_size=shard.mbs, seq_len=shard.seq, flash_attention=True))
    strategy = Strategy(dp=world // (shard.tp * shard.cp), tp=shard.tp, cp=shard.cp, ep=shard.ep, etp=shard.etp,
                        mbs=shard.mbs, recompute=recompute)
    batch = LayoutBatch.from_strategy(strategy, shard.mbs * strategy.dp)
    if recompute == "full":
        return float(act.layer_input_bytes(problem, batch)[0])
    selective = np.array([recompute == "selective"])
    return float((act.attention_bytes(problem, batch, selective) + act.mlp_bytes(problem, batch, moe, selective))[0])
