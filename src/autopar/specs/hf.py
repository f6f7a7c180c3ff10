"""Read a Hugging Face ``config.json`` (or a shipped preset) into a :class:`ModelSpec`.

Field names per architecture follow ``shared/reference/ecosystem.md`` section 5 and the
``configuration_*.py`` files of transformers. One small reader per ``model_type`` lives in the
``_READERS`` registry; an unknown ``model_type`` is an error that lists the supported ones,
never a guess. Newer spellings are accepted: ``dtype`` for ``torch_dtype``, ``rope_parameters``
for ``rope_theta``/``rope_scaling``, and text fields nested under ``text_config`` (Gemma 3).
"""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from autopar.errors import AutoparError, read_text
from autopar.specs.long_numbers import json_loads, too_large
from autopar.specs.model import MAX_LAYERS, MAX_SIZE, ModelSpec

_MISSING = object()


class _Config:
    """A config dict with field access that fails with one clear line."""

    def __init__(self, raw: dict[str, Any], source: str):
        self.raw, self.source = raw, source

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key, default)
        return default if value is None else value

    def too_large(self, key: str, value: Any) -> None:
        """Refuse a :class:`~autopar.specs.long_numbers.LongNumber` read as ``key``
        (``key=<a 5000-digit number>: too large``)."""
        why = too_large(key, value, f"a model size is at most {MAX_SIZE}, a float field at most 1e15")
        if why:
            raise AutoparError(f"{self.source}: {why}")

    def require(self, *keys: str, what: str = "") -> Any:
        """First present (non-null) of ``keys``; raises naming the first key when none is."""
        for key in keys:
            if self.raw.get(key) is not None:
                self.too_large(key, self.raw[key])
                return self.raw[key]
        hint = f" ({what})" if what else ""
        raise AutoparError(f"{self.source}: missing field '{keys[0]}'{hint}")

    def integer(self, *keys: str, what: str = "", default: Any = _MISSING, maximum: int | None = None) -> int:
        """The first present of ``keys`` as an int (``default`` when none is present).

        Raises:
            AutoparError: none present and no default, not an integer, a ``LongNumber``,
                or above ``maximum`` (checked here where a reader loops over the value, e.g.
                the layer count).
        """
        if default is not _MISSING and all(self.raw.get(k) is None for k in keys):
            return default
        key = next((k for k in keys if self.raw.get(k) is not None), keys[0])
        value = self.require(*keys, what=what)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value)):
            raise AutoparError(f"{self.source}: field '{key}'={value!r} must be an integer")
        if maximum is not None and value > maximum:
            raise AutoparError(f"{self.source}: {key}={int(value)}: must be at most {maximum}")
        return int(value)

    def boolean(self, key: str, default: bool) -> bool:
        """A JSON true/false (strings such as "false" are refused, not read as truthy)."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise AutoparError(f"{self.source}: field '{key}'={value!r} must be true or false")
        return value

    def number(self, key: str, default: float) -> float:
        """``key`` as a finite float, else ``default``.

        Raises:
            AutoparError: a :class:`~autopar.specs.long_numbers.LongNumber`, not a number, or not finite.
        """
        value = self.get(key, default)
        self.too_large(key, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise AutoparError(f"{self.source}: field '{key}'={value!r} must be a finite number")
        return float(value)

    def int_list(self, key: str) -> list[int]:
        value = self.get(key, [])
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise AutoparError(f"{self.source}: field '{key}'={value!r} must be a list of layer indices")
        return value


def _dropout(cfg: _Config) -> bool:
    """Any dropout probability > 0 (each must lie in [0, 1]: -0.5 or 5 is a typo, not "no dropout")."""
    keys = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "hidden_dropout_prob")
    rates = {k: cfg.number(k, 0.0) for k in keys}
    for key, rate in rates.items():
        if not 0 <= rate <= 1:
            raise AutoparError(f"{cfg.source}: field '{key}'={rate} must be a probability in [0, 1]")
    return any(rate > 0 for rate in rates.values())


def _norm_kind(cfg: _Config, default: str) -> str:
    if cfg.get("rms_norm_eps") is not None:
        return "rmsnorm"
    if cfg.get("layer_norm_eps") is not None or cfg.get("layer_norm_epsilon") is not None:
        return "layernorm"
    return default


def _llama_like(cfg: _Config) -> dict[str, Any]:
    """Llama, Mistral, Qwen2/3, Gemma: the common decoder fields (ecosystem.md 5.1)."""
    hidden = cfg.integer("hidden_size", what="model width")
    heads = cfg.integer("num_attention_heads")
    if heads < 1 or hidden < 1:
        raise AutoparError(f"{cfg.source}: hidden_size={hidden} and num_attention_heads={heads} must be >= 1")
    if cfg.get("head_dim") is None and hidden % heads:
        raise AutoparError(f"{cfg.source}: hidden_size={hidden} is not divisible by num_attention_heads={heads} "
                           "and there is no 'head_dim' field")
    act_key = "hidden_act" if cfg.get("hidden_act") is not None else "hidden_activation"
    act = cfg.get(act_key, "silu")
    if not isinstance(act, str):
        raise AutoparError(f"{cfg.source}: field '{act_key}'={act!r} must be a string such as 'silu'")
    return dict(
        num_layers=cfg.integer("num_hidden_layers", what="number of decoder layers", maximum=MAX_LAYERS),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=cfg.integer("num_key_value_heads", default=heads),
        head_dim=cfg.integer("head_dim", default=hidden // max(heads, 1)),
        ffn_hidden_size=cfg.integer("intermediate_size", what="MLP width"),
        vocab_size=cfg.integer("vocab_size"),
        max_position_embeddings=cfg.integer("max_position_embeddings", default=None),
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", False),
        # transformers' LlamaMLP/MistralMLP/Qwen2MLP/Gemma2MLP/MixtralBlockSparseTop2MLP/DeepseekV3MLP are always
        # gated (gate_proj, up_proj, down_proj; hidden_act only picks the gate's function): a llama-type config with
        # hidden_act "relu" still has 3 matrices. GPT-NeoX and GPT-2 override this.
        gated_mlp=True,
        norm=_norm_kind(cfg, "rmsnorm"),
        qkv_bias=cfg.boolean("attention_bias", False),
        dropout=_dropout(cfg),
    )


def _qwen2(cfg: _Config) -> dict[str, Any]:
    return {**_llama_like(cfg), "qkv_bias": True}  # implied by the architecture


def _qwen3(cfg: _Config) -> dict[str, Any]:
    return {**_llama_like(cfg), "qk_norm": True}


def _gemma(cfg: _Config) -> dict[str, Any]:
    # Gemma 2/3: pre and post norms around attention and MLP; tied embeddings by default.
    return {**_llama_like(cfg), "norms_per_layer": 4, "tie_word_embeddings": cfg.boolean("tie_word_embeddings", True)}


def _mixtral(cfg: _Config) -> dict[str, Any]:
    spec = _llama_like(cfg)
    ffn = spec["ffn_hidden_size"]  # per expert in Mixtral
    experts = cfg.integer("num_local_experts", "num_experts")
    if experts < 1:
        raise AutoparError(f"{cfg.source}: field 'num_local_experts'={experts} must be >= 1 (model_type mixtral is "
                           "a MoE model)")
    return {
        **spec,
        "num_experts": experts,
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": ffn,
        "moe_layers": tuple(range(spec["num_layers"])),
        "router_aux_loss_coeff": _aux_loss_coeff(cfg),
    }


def _aux_loss_coeff(cfg: _Config) -> float:
    """The softmax top-k router's load-balancing loss coefficient, HF ``router_aux_loss_coef``
    (transformers' ``MixtralConfig`` and ``Qwen3MoeConfig`` default: 0.001).

    Raises:
        AutoparError: a negative or non-numeric value."""
    coeff = cfg.number("router_aux_loss_coef", 0.001)
    if coeff < 0:
        raise AutoparError(f"{cfg.source}: field 'router_aux_loss_coef'={coeff} must be >= 0")
    return coeff


def _qwen3_moe(cfg: _Config) -> dict[str, Any]:
    spec = _qwen3(cfg)
    step = cfg.integer("decoder_sparse_step", default=1)
    if step < 1:
        raise AutoparError(f"{cfg.source}: field 'decoder_sparse_step'={step} must be >= 1")
    dense_only = set(cfg.int_list("mlp_only_layers"))
    outside = sorted(i for i in dense_only if not 0 <= i < spec["num_layers"])
    if outside:
        raise AutoparError(f"{cfg.source}: field 'mlp_only_layers' has {outside}: layer indices must be in "
                           f"0..{spec['num_layers'] - 1}")
    moe = tuple(i for i in range(spec["num_layers"]) if i not in dense_only and (i + 1) % step == 0)
    return {
        **spec,
        "num_experts": cfg.integer("num_experts", "num_local_experts"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": cfg.integer("moe_intermediate_size"),
        "shared_expert_ffn_hidden_size": cfg.integer("shared_expert_intermediate_size", default=0),
        "moe_layers": moe,
        "router_aux_loss_coeff": _aux_loss_coeff(cfg),
    }


def _deepseek_v3(cfg: _Config) -> dict[str, Any]:
    spec = _llama_like(cfg)
    first_dense = cfg.integer("first_k_dense_replace", default=0)
    freq = cfg.integer("moe_layer_freq", default=1)
    if freq < 1 or not 0 <= first_dense < spec["num_layers"]:
        raise AutoparError(f"{cfg.source}: moe_layer_freq={freq} must be >= 1 and first_k_dense_replace="
                           f"{first_dense} below num_hidden_layers={spec['num_layers']}")
    moe_ffn = cfg.integer("moe_intermediate_size")
    nope, rope = cfg.integer("qk_nope_head_dim"), cfg.integer("qk_rope_head_dim")
    return {
        **spec,
        "head_dim": nope + rope,
        "num_experts": cfg.integer("n_routed_experts"),
        "num_experts_per_tok": cfg.integer("num_experts_per_tok"),
        "moe_ffn_hidden_size": moe_ffn,
        "shared_expert_ffn_hidden_size": cfg.integer("n_shared_experts", default=0) * moe_ffn,
        "moe_layers": tuple(i for i in range(first_dense, spec["num_layers"]) if i % freq == 0),
        "router_bias": _topk_method(cfg) == "noaux_tc",
        **_group_routing(cfg),
        "mla": True,
        "q_lora_rank": cfg.integer("q_lora_rank", default=0),
        "kv_lora_rank": cfg.integer("kv_lora_rank"),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": cfg.integer("v_head_dim"),
        "mtp_num_layers": cfg.integer("num_nextn_predict_layers", default=0),
    }


def _group_routing(cfg: _Config) -> dict[str, Any]:
    """DeepSeek-V3's group-limited routing (``n_group`` groups, the top ``topk_group`` of them per
    token) and ``routed_scaling_factor``, with transformers' ``DeepseekV3Config`` defaults (8, 4,
    2.5) for absent keys; ``greedy`` routing and one group are not group-limited."""
    groups = cfg.integer("n_group", default=8) if _topk_method(cfg) != "greedy" else 1
    scale = cfg.number("routed_scaling_factor", 2.5)
    return {"router_num_groups": groups if groups > 1 else 0,
            "router_group_topk": cfg.integer("topk_group", default=4) if groups > 1 else 0,
            "router_topk_scaling_factor": None if scale == 1 else scale}


def _topk_method(cfg: _Config) -> str:
    """DeepSeek's router: ``noaux_tc`` (V3, with the expert score bias) or ``greedy`` /
    ``group_limited_greedy`` (V2); transformers ``configuration_deepseek_v3.py``."""
    method = cfg.get("topk_method", "noaux_tc")
    if method not in ("noaux_tc", "greedy", "group_limited_greedy"):
        raise AutoparError(f"{cfg.source}: field 'topk_method'={method!r}: allowed noaux_tc, greedy, "
                           "group_limited_greedy")
    return method


def _gpt2(cfg: _Config) -> dict[str, Any]:
    hidden = cfg.integer("n_embd", "hidden_size", what="model width")
    heads = cfg.integer("n_head", "num_attention_heads")
    if heads < 1:
        raise AutoparError(f"{cfg.source}: n_head={heads} must be >= 1")
    if hidden % heads:
        raise AutoparError(f"{cfg.source}: n_embd={hidden} is not divisible by n_head={heads}")
    return dict(
        num_layers=cfg.integer("n_layer", "num_hidden_layers", maximum=MAX_LAYERS),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        ffn_hidden_size=cfg.integer("n_inner", default=4 * hidden),  # null means 4h in GPT-2
        vocab_size=cfg.integer("vocab_size"),
        max_position_embeddings=cfg.integer("n_positions", "n_ctx"),
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", True),
        gated_mlp=False,
        norm="layernorm",
        linear_bias=True,
        position_embedding="learned",
        dropout=_dropout(cfg) or cfg.raw.get("resid_pdrop") is None,  # GPT-2 default 0.1
    )


def _gpt_neox(cfg: _Config) -> dict[str, Any]:
    spec = _llama_like(cfg)
    return {**spec, "gated_mlp": False, "norm": "layernorm", "linear_bias": True}


def _rope_theta_and_eps(cfg: _Config, fields: dict[str, Any]) -> dict[str, Any]:
    """``rope_theta`` (RoPE models only: HF ``rope_theta``, GPT-NeoX ``rotary_emb_base``, or the
    transformers 5.x ``rope_parameters`` dict, possibly keyed by layer type, whose
    ``full_attention`` entry is taken) and ``norm_eps`` (``rms_norm_eps`` / ``layer_norm_eps`` /
    ``layer_norm_epsilon``); None where the config does not say. Exported as Megatron's
    ``--rotary-base`` and ``--norm-epsilon`` (ecosystem.md 1.5); the cost model does not use them.

    Raises:
        AutoparError: a present value is not a finite number.
    """
    def number(key: str, value: Any) -> float | None:
        if value is None:
            return None
        cfg.too_large(key, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise AutoparError(f"{cfg.source}: field '{key}'={value!r} must be a finite number")
        return float(value)

    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        rope = rope["full_attention"]
    theta = cfg.get("rope_theta", cfg.get("rotary_emb_base"))
    if theta is None and isinstance(rope, dict):
        theta = rope.get("rope_theta")
    eps_key = next((k for k in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon") if cfg.get(k) is not None),
                   "rms_norm_eps")
    rope_model = fields.get("position_embedding", "rope") == "rope"
    return {"rope_theta": number("rope_theta", theta) if rope_model else None,
            "norm_eps": number(eps_key, cfg.get(eps_key))}


_READERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma2": _gemma,
    "gemma3_text": _gemma,
    "gemma3": _gemma,
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}


def _register_moe_families() -> None:
    """Add the readers of :mod:`autopar.specs.hf_moe` (GPT-OSS, GLM-4.5, Kimi-K2, Llama 4)."""
    from autopar.specs.hf_moe import READERS

    _READERS.update(READERS)


def model_from_hf_dict(raw: dict[str, Any], name: str, source: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed HF config dict.

    Raises:
        AutoparError: unknown ``model_type``, a missing or malformed field, inconsistent sizes.
    """
    source = source or name
    if "gpt_oss" not in _READERS:
        _register_moe_families()
    if not isinstance(raw, dict):
        raise AutoparError(f"{source}: a config.json must hold a JSON object, got {type(raw).__name__}")
    if raw.get("text_config") is not None and not isinstance(raw["text_config"], dict):
        raise AutoparError(f"{source}: field 'text_config'={raw['text_config']!r} must be an object of text-model "
                           "fields")
    if isinstance(raw.get("text_config"), dict):  # multimodal wrappers (Gemma 3, Llama 4 ...)
        raw = {**raw["text_config"], "model_type": raw["text_config"].get("model_type", raw.get("model_type"))}
    cfg = _Config(raw, source)
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise AutoparError(f"{source}: field 'model_type'={model_type!r} must be a string")
    if model_type is None:
        raise AutoparError(f"{source}: missing field 'model_type' (one of {', '.join(sorted(_READERS))})")
    reader = _READERS.get(model_type)
    if reader is None and f"{model_type}_text" in _READERS:  # a multimodal wrapper whose text model is missing
        raise AutoparError(f"{source}: model_type={model_type!r} wraps a text model in field 'text_config', which "
                           f"is missing; give 'text_config' (model_type {model_type}_text) or the text model's config")
    if reader is None:
        raise AutoparError(
            f"{source}: model_type={model_type!r} is not supported; supported: {', '.join(sorted(_READERS))}"
        )
    fields = reader(cfg)
    fields.update(_rope_theta_and_eps(cfg, fields))
    names = {field: next((k for k in keys if raw.get(k) is not None), keys[0]) for field, keys in _CONFIG_KEYS.items()}
    try:
        return ModelSpec.model_validate({"name": name, **fields}, context={"names": names})
    except ValidationError as err:
        raise _config_error(err, cfg, names) from None


# ModelSpec field -> the config keys it is read from, in the readers' order of preference: an
# error names the first one the config holds (else the first), with the value the config holds.
_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_kv_heads": ("num_key_value_heads", "num_attention_heads", "n_head"),
    "head_dim": ("head_dim", "qk_nope_head_dim"),
    "ffn_hidden_size": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "moe_ffn_hidden_size": ("moe_intermediate_size", "intermediate_size"),
    "shared_expert_ffn_hidden_size": ("shared_expert_intermediate_size", "n_shared_experts"),
    "router_num_groups": ("n_group",),
    "router_group_topk": ("topk_group",),
    "router_aux_loss_coeff": ("router_aux_loss_coef",),
    "router_topk_scaling_factor": ("routed_scaling_factor",),
    "mtp_num_layers": ("num_nextn_predict_layers",),
    "sliding_window": ("sliding_window",),
    "num_experts_per_tok": ("num_experts_per_tok", "experts_per_token"),
    "rope_theta": ("rope_theta", "rotary_emb_base", "rope_parameters"),
    "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
}


def _config_error(err: ValidationError, cfg: _Config, names: dict[str, str]) -> AutoparError:
    """One line for a ``ModelSpec`` validation error of a config: each field is named by the
    config key it came from (``num_hidden_layers=-1``, not autopar's ``num_layers``) with the value
    the config holds (``n_shared_experts=-1``, not the derived shared-expert width); cross-field
    messages already use the keys (``ModelSpec`` names fields through the validation context)."""
    parts = []
    for item in err.errors():
        msg = item["msg"].removeprefix("Value error, ")
        if not item["loc"]:
            parts.append(msg)
            continue
        field = str(item["loc"][0])
        key = names.get(field, field)
        parts.append(f"{key}={cfg.raw.get(key, item.get('input'))!r}: {msg}")
    return AutoparError(f"{cfg.source}: " + "; ".join(parts))


def preset_names() -> list[str]:
    """Names of the model presets shipped in ``autopar/data/models``."""
    folder = resources.files("autopar") / "data" / "models"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def config_name(raw: Any, path: Path) -> str:
    """The name a ``config.json`` at ``path`` goes by in titles and messages: the last part of its
    ``_name_or_path`` (what ``transformers``' ``save_pretrained`` writes: ``meta-llama/Llama-3.1-8B``
    gives ``Llama-3.1-8B``), else the file's own name when it is not the default ``config``
    (``llama3-8b-long.json``), else its ``model_type`` (``llama``; a multimodal wrapper's
    ``text_config`` one when the top level has none), else the folder that holds it; ``config``
    only when none of these says anything."""
    if isinstance(raw, dict):
        given = raw.get("_name_or_path")
        if isinstance(given, str) and (last := given.strip().rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]):
            return last
    if path.stem != "config":
        return path.stem
    if isinstance(raw, dict):
        text = raw.get("text_config")
        kind = raw.get("model_type") or (text.get("model_type") if isinstance(text, dict) else None)
        if isinstance(kind, str) and kind.strip():
            return kind.strip()
    return path.resolve().parent.name or path.stem


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (``llama3-70b``) or a path to an HF ``config.json``.

    Raises:
        AutoparError: unreadable file, invalid JSON, unknown preset, or an invalid config.
    """
    if not name_or_path.strip():
        raise AutoparError(f"--model={name_or_path!r}: empty; give a config.json path or a preset name")
    path = Path(name_or_path)
    if path.suffix == ".json" or os.path.lexists(path):  # lexists: a broken link or a loop is a path too
        if os.path.isdir(path):  # False for a name the file system cannot hold: read_text names that
            raise AutoparError(f"--model={name_or_path!r}: is a directory; give its config.json")
        text = read_text(path, "--model", "expected a config.json")  # a FIFO, /dev/null, a link loop: by kind
        try:
            raw = json_loads(text)
        except json.JSONDecodeError as err:
            raise AutoparError(f"--model={name_or_path!r}: not valid JSON ({err})") from None
        except RecursionError:  # [[[...]]]
            raise AutoparError(f"--model={name_or_path!r}: nested too deeply to be a config.json") from None
        return model_from_hf_dict(raw, name=config_name(raw, path), source=str(path))
    if name_or_path not in preset_names():
        raise AutoparError(
            f"--model={name_or_path!r}: not a file and not a preset; presets: {', '.join(preset_names())}"
        )
    text = (resources.files("autopar") / "data" / "models" / f"{name_or_path}.json").read_text()
    return model_from_hf_dict(json.loads(text), name=name_or_path)
