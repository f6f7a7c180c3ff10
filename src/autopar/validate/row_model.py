"""The model of a measurements row, built from the row's own dimensions.

A MoE row whose ``model`` is a shipped preset (``deepseek-v3``, ``qwen3-30b-a3b``, ...) takes
from the preset what the CSV has no column for (MLA, router groups, shared experts, which
layers are dense, head_dim where it is decoupled from hidden/heads); every dimension the row
states replaces the preset's, so a 30-layer DeepSeek-V3 row is costed with 30 layers. Any other
row is a generic decoder from its dimensions, its architecture guessed from the model name and
recorded in ``assumed``.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from autopar.specs import ModelSpec, load_model, preset_names
from autopar.validate.cells import Unscorable, required
from autopar.validate.measurements import Row

_GATED = ("llama", "grok", "qwen", "deepseek", "mixtral")  # SwiGLU families; GPT/BLOOM/Nemotron are 2-matrix
# Nemotron-3 (8B, 22B) and Nemotron-4 (15B, 340B) share one 256k SentencePiece tokenizer and untied
# input/output embeddings (HF configs nemotron-3-8b / nemotron3-22b / Nemotron-4-340B:
# vocab_size 256000, tie_word_embeddings false). Rows that leave the vocabulary blank take it from
# here; NeMo's own model-TFLOP/s for NEMO2407-08/-09 (653, 554) imply V = 256000 with its formula.
NEMOTRON_VOCAB = 256000
GPT2_VOCAB = 51200  # GPT-2 BPE padded to 51200, Megatron-LM's GPT examples

# CSV column -> ModelSpec field, for the dimensions a row may state (``ffn`` of a MoE row is the
# expert's, ``moe_ffn_hidden_size``; see :func:`preset_model`).
COLUMNS = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
           "kv_heads": "num_kv_heads", "vocab": "vocab_size", "num_experts": "num_experts",
           "topk": "num_experts_per_tok"}
# ModelSpec field names (and the HF names its messages use) as the CSV calls them, longest first.
_FIELD_TO_COLUMN = (("max_position_embeddings", "seq_len"), ("moe_ffn_hidden_size", "ffn"),
                    ("ffn_hidden_size", "ffn"), ("num_key_value_heads", "kv_heads"),
                    *((f, c) for c, f in COLUMNS.items()))


#: ModelSpec's bound on ``num_layers``, checked before a per-layer tuple (``moe_layers``) is built.
MAX_LAYERS = next(m.le for m in ModelSpec.model_fields["num_layers"].metadata if getattr(m, "le", None))


def _check_layers(layers: int) -> None:
    """Raises Unscorable: ``layers`` above :data:`MAX_LAYERS`."""
    if layers > MAX_LAYERS:
        raise Unscorable(f"layers={layers}: expected at most {MAX_LAYERS}")


def dimensions_error(err: ValidationError) -> Unscorable:
    """ModelSpec's validation error as one line in the CSV's column names
    (``heads=32 is not a multiple of kv_heads=5``)."""
    parts = []
    for item in err.errors():
        msg = item["msg"].removeprefix("Value error, ")
        field = ".".join(str(x) for x in item["loc"])
        parts.append(f"{field}={item.get('input')!r}: {msg}" if field else msg)
    text = "; ".join(parts)
    for field, column in _FIELD_TO_COLUMN:
        text = re.sub(rf"\b{field}\b", column, text)
    return Unscorable(f"model dimensions invalid: {text}")


def model_of(row: Row, dropout: bool, assumed: list[str]) -> ModelSpec:
    """The row's model: :func:`preset_model` for a MoE row named after a MoE preset, else
    :func:`generic_model`.

    Raises:
        Unscorable: a dimension the model needs is empty, or the dimensions do not form a model
            (named by CSV column).
    """
    name = row["model"].lower()
    if name in preset_names() and row.int("num_experts") != 0:
        preset = load_model(name)
        if preset.is_moe:
            return preset_model(row, preset, assumed)
    return generic_model(row, dropout, assumed)


def preset_model(row: Row, preset: ModelSpec, assumed: list[str]) -> ModelSpec:
    """``preset`` with every dimension the row states (:data:`COLUMNS`, ``ffn`` as the routed
    experts' width) in place of the preset's. What follows from a changed dimension:

    * ``layers``: the preset's leading dense layers stay dense (DeepSeek-V3: the first 3), the
      rest are MoE; a preset with another MoE pattern is refused for another layer count.
    * ``hidden``/``heads``: head_dim = hidden / heads where the preset derives it so (Mixtral);
      MLA's per-head widths and a decoupled head_dim (Qwen3: 128 at hidden 2048, 32 heads) stay.
    * ``heads`` with ``kv_heads`` empty: an MHA/MLA preset (kv heads = heads) stays so.
    * ``ffn``: the experts' width; the dense layers' width too where the preset's are equal.

    Raises:
        Unscorable: as :func:`model_of`.
    """
    update: dict = {}
    for column, name in COLUMNS.items():
        value = row.int(column)
        if value is not None and value != getattr(preset, name):
            update[name] = value
    layers = update.get("num_layers", preset.num_layers)
    heads = update.get("num_attention_heads", preset.num_attention_heads)
    hidden = update.get("hidden_size", preset.hidden_size)
    ffn = row.int("ffn")
    if ffn is not None and ffn != preset.moe_ffn_hidden_size:
        update["moe_ffn_hidden_size"] = ffn
        if preset.ffn_hidden_size == preset.moe_ffn_hidden_size:
            update["ffn_hidden_size"] = ffn
    if "num_layers" in update:
        _check_layers(layers)
        dense = preset.num_layers - preset.num_moe_layers
        if preset.moe_layers != tuple(range(dense, preset.num_layers)):
            raise Unscorable(f"layers={layers}: {preset.name}'s MoE layer pattern does not extend to another "
                             "layer count")
        if layers <= dense:
            raise Unscorable(f"layers={layers}: {preset.name} keeps its first {dense} layers dense; its MoE layers "
                             "start after them")
        update["moe_layers"] = tuple(range(dense, layers))
    if "num_attention_heads" in update and row.int("kv_heads") is None \
            and preset.num_kv_heads == preset.num_attention_heads:
        update["num_kv_heads"] = heads
    derived_head_dim = not preset.mla and preset.head_dim * preset.num_attention_heads == preset.hidden_size
    if derived_head_dim and ("hidden_size" in update or "num_attention_heads" in update):
        if hidden % heads:
            raise Unscorable(f"hidden={hidden} is not a multiple of heads={heads} ({preset.name} derives head_dim "
                             "as hidden / heads)")
        update["head_dim"] = hidden // heads
    stated = [c for c in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "num_experts", "topk")
              if row.int(c) is not None]
    assumed.append(f"architecture from preset {preset.name} (MLA, router, shared experts, dense layers, head_dim)"
                   + (f"; row's own {', '.join(stated)}" if stated else ""))
    try:
        return ModelSpec.model_validate({**preset.model_dump(), **update})
    except ValidationError as err:
        raise dimensions_error(err) from None


def generic_model(row: Row, dropout: bool, assumed: list[str]) -> ModelSpec:
    """A decoder from the row's dimensions: SwiGLU + RMSNorm + RoPE for Llama-like names
    (:data:`_GATED`), else a GPT-style 4h MLP with LayerNorm and biases (none for Nemotron, NeMo's
    ``Nemotron4Config`` ``add_bias_linear=False``; learned positions for GPT names; parameter-free
    positions else, as RoPE and BLOOM's ALiBi are). Unstated kv_heads (= heads), ffn (= 4 hidden) and vocabulary
    (Nemotron's 256000, else GPT-2's 51200) are recorded in ``assumed``.

    Raises:
        Unscorable: layers, hidden or heads empty, hidden not a multiple of heads (head_dim
            would be fractional; ``--model`` refuses such a config the same way), a MoE row
            without topk, or dimensions ModelSpec refuses.
    """
    name = row["model"]
    low = name.lower()
    gated, gpt, nemotron = any(k in low for k in _GATED), "gpt" in low, "nemotron" in low
    why = "the model needs it"
    layers, hidden, heads = required(row, "layers", why), required(row, "hidden", why), required(row, "heads", why)
    _check_layers(layers)
    if hidden % heads:
        raise Unscorable(f"hidden={hidden} is not a multiple of heads={heads}: head_dim would be fractional")
    experts = row.int("num_experts") or 0
    topk = row.int("topk")
    if experts and not topk:
        raise Unscorable(f"topk={row['topk']!r}: a MoE row (num_experts={experts}) needs the experts per token")
    assumed.append(f"architecture from the name {name!r}: "
                   + ("gated MLP, RMSNorm, RoPE" if gated else "4h-style MLP, LayerNorm, "
                      + ("no biases" if nemotron else "biases"))
                   + (", learned positions" if gpt else ""))
    kv_heads, ffn, vocab = row.int("kv_heads"), row.int("ffn"), row.int("vocab")
    if kv_heads is None:
        kv_heads = heads
        assumed.append(f"kv_heads={heads} (= heads)")
    if ffn is None:
        ffn = 4 * hidden
        assumed.append(f"ffn={ffn} (4 hidden)")
    if vocab is None:
        vocab = NEMOTRON_VOCAB if nemotron else GPT2_VOCAB
        assumed.append(f"vocab={vocab}")
    try:
        return ModelSpec(
            name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads,
            head_dim=hidden // heads, ffn_hidden_size=ffn, vocab_size=vocab,
            tie_word_embeddings=not gated and not nemotron, gated_mlp=gated, norm="rmsnorm" if gated else "layernorm",
            linear_bias=not gated and not nemotron,
            position_embedding="learned" if gpt else "rope", max_position_embeddings=row.int("seq_len"),
            dropout=dropout, num_experts=experts, num_experts_per_tok=topk or 0,
            moe_ffn_hidden_size=ffn if experts else 0, moe_layers=tuple(range(layers)) if experts else (),
        )
    except ValidationError as err:
        raise dimensions_error(err) from None
