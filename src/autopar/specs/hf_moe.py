"""Hugging Face readers for the MoE families of 2025: GPT-OSS, GLM-4.5, Kimi-K2, Llama 4.

Registered into :data:`autopar.specs.hf._READERS` (by ``model_type``); field meanings follow
transformers' ``configuration_*.py`` of each family:

* ``gpt_oss`` (``GptOssConfig``): every layer MoE (``num_local_experts``, ``num_experts_per_tok``
  of width ``intermediate_size``), alternating ``layer_types`` ``sliding_attention`` /
  ``full_attention`` with ``sliding_window`` keys, biased q/k/v/o, experts and router
  (``attention_bias``; ``GptOssExperts`` has ``gate_up_proj_bias`` and ``down_proj_bias``),
  learned per-head attention ``sinks``; the router's aux-loss coefficient
  ``router_aux_loss_coef`` (0.9 in the published configs). The SwiGLU clamp (``swiglu_limit``)
  and YaRN scaling cost nothing here.
* ``glm4_moe`` (``Glm4MoeConfig``): DeepSeek-V3-style MoE (``first_k_dense_replace`` dense
  layers, ``n_routed_experts``, ``n_shared_experts`` of ``moe_intermediate_size``, sigmoid
  router with the score-correction bias, ``routed_scaling_factor``, ``n_group`` / ``topk_group``
  defaulting to 1) on GQA attention with q/k/v bias (``attention_bias``), QK norm
  (``use_qk_norm``), partial RoPE (``partial_rotary_factor``: RoPE on half of each head, an
  element-wise cost autopar does not separate) and ``num_nextn_predict_layers`` MTP layers.
* ``kimi_k2``: the DeepSeek-V3 architecture (``DeepseekV3ForCausalLM``) with its keys; read by
  the ``deepseek_v3`` reader.
* ``llama4_text`` (``Llama4TextConfig``, inside ``Llama4Config.text_config``): MoE every
  ``interleave_moe_layer_step``-th layer (``(i + 1) % step == 0``; Maverick: the odd layers),
  routed experts of ``intermediate_size`` plus one shared expert of the same width, dense
  layers of ``intermediate_size_mlp``; top-1 sigmoid routing. Chunked attention
  (``attention_chunk_size``) and the NoPE layers are not modelled: attention is costed as full
  causal, exact up to one chunk (8,192 tokens in Meta's configs).
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs import hf


def _window_layers(cfg: hf._Config, num_layers: int) -> dict[str, Any]:
    """``sliding_window`` and the indices whose ``layer_types`` entry is ``sliding_attention``.

    Raises:
        AutoparError: ``layer_types`` not a list of ``num_hidden_layers`` known kinds, or window
            layers without a positive ``sliding_window``.
    """
    kinds = cfg.get("layer_types")
    if kinds is None:
        return {}
    if not isinstance(kinds, list) or len(kinds) != num_layers or \
            any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise AutoparError(f"{cfg.source}: field 'layer_types' must list 'sliding_attention' or 'full_attention' "
                           f"for each of the num_hidden_layers={num_layers} layers")
    window = [i for i, k in enumerate(kinds) if k == "sliding_attention"]
    size = cfg.integer("sliding_window", default=0) if window else 0
    if window and size < 1:
        raise AutoparError(f"{cfg.source}: field 'sliding_window'={size!r} must be >= 1 with sliding_attention layers")
    return {"sliding_window": size, "window_layers": tuple(window)}


def gpt_oss(cfg: hf._Config) -> dict[str, Any]:
    """``model_type: gpt_oss`` (module docstring)."""
    spec = hf._llama_like(cfg)
    bias = cfg.boolean("attention_bias", True)
    return {
        **spec,
        "qkv_bias": bias,
        "linear_bias": bias,  # q/k/v/o, experts and router are all biased in GptOss
        "num_experts": cfg.integer("num_local_experts", "num_experts"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok", "experts_per_token"),
        "moe_ffn_hidden_size": spec["ffn_hidden_size"],
        "moe_layers": tuple(range(spec["num_layers"])),
        "router_aux_loss_coeff": hf._aux_loss_coeff(cfg),
        "attention_sinks": True,
        **_window_layers(cfg, spec["num_layers"]),
    }


def glm4_moe(cfg: hf._Config) -> dict[str, Any]:
    """``model_type: glm4_moe`` (module docstring): the DeepSeek-V3 MoE reader on GQA attention."""
    spec = hf._llama_like(cfg)
    first_dense = cfg.integer("first_k_dense_replace", default=1)
    if not 0 <= first_dense < spec["num_layers"]:
        raise AutoparError(f"{cfg.source}: first_k_dense_replace={first_dense} must be within the "
                           f"{spec['num_layers']} layers")
    moe_ffn = cfg.integer("moe_intermediate_size")
    groups = {"n_group": cfg.get("n_group", 1), "topk_group": cfg.get("topk_group", 1)}
    routing = hf._group_routing(hf._Config({**cfg.raw, **groups}, cfg.source))
    return {
        **spec,
        "qk_norm": cfg.boolean("use_qk_norm", False),
        "num_experts": cfg.integer("n_routed_experts"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "shared_expert_ffn_hidden_size": cfg.integer("n_shared_experts", default=1) * moe_ffn,
        "moe_layers": tuple(range(first_dense, spec["num_layers"])),
        "router_bias": True,  # Glm4MoeTopkRouter: sigmoid scores + e_score_correction_bias
        **routing,
        "mtp_num_layers": cfg.integer("num_nextn_predict_layers", default=0),
    }


def llama4_text(cfg: hf._Config) -> dict[str, Any]:
    """``model_type: llama4_text`` (module docstring)."""
    spec = hf._llama_like(cfg)
    step = cfg.integer("interleave_moe_layer_step", default=1)
    if step < 1:
        raise AutoparError(f"{cfg.source}: field 'interleave_moe_layer_step'={step} must be >= 1")
    expert_ffn = spec["ffn_hidden_size"]  # Llama4TextConfig.intermediate_size: each expert
    return {
        **spec,
        "ffn_hidden_size": cfg.integer("intermediate_size_mlp", default=expert_ffn),
        "qk_norm": cfg.boolean("use_qk_norm", False),
        "num_experts": cfg.integer("num_local_experts"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok", default=1),
        "moe_ffn_hidden_size": expert_ffn,
        "shared_expert_ffn_hidden_size": expert_ffn,  # Llama4TextMoe.shared_expert
        "moe_layers": tuple(i for i in range(spec["num_layers"]) if (i + 1) % step == 0),
        "router_aux_loss_coeff": hf._aux_loss_coeff(cfg),
        "router_sigmoid": True,  # Llama4Router: sigmoid of the top-k logits
    }


READERS = {"gpt_oss": gpt_oss, "glm4_moe": glm4_moe, "kimi_k2": hf._deepseek_v3, "llama4_text": llama4_text}
