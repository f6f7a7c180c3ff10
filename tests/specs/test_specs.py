"""Model and device specs: parameter counts against published sizes, HF field variants, errors."""

from __future__ import annotations

import json

import pytest

from autopar.errors import AutoparError
from autopar.specs import load_device, load_model, make_cluster, model_from_hf_dict
from conftest import MODELS

# Parameter counts from shared/reference/ecosystem.md 5.2 (our own count from the published
# fields; it reproduces the published sizes), and the issue text for Llama-2-70B.
PUBLISHED = {
    "llama2-7b": 6.74e9, "llama2-13b": 13.02e9, "llama3-8b": 8.03e9, "llama3-70b": 70.55e9,
    "llama3.1-405b": 405.85e9, "mixtral-8x7b": 46.70e9, "mixtral-8x22b": 140.62e9, "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.71e9, "qwen3-8b": 8.19e9, "deepseek-v3": 671.03e9, "gpt3-175b": 174.6e9,
    "gemma2-9b": 9.24e9, "qwen3-30b-a3b": 30.53e9,
}


def test_llama2_70b_exact_parameter_count():
    assert load_model(str(MODELS / "llama2-70b.json")).num_params == 68_976_648_192


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_shared_model_matches_its_published_size(name):
    model = load_model(str(MODELS / f"{name}.json"))
    assert model.num_params == pytest.approx(PUBLISHED[name], rel=0.001)


def test_active_parameters_of_moe_models():
    # Mixtral-8x7B: 12.88 B active (ecosystem.md 5.2); DeepSeek-V3: 37.6 B active (report), MTP ~11.5 B.
    assert load_model("mixtral-8x7b").num_active_params == pytest.approx(12.88e9, rel=0.002)
    ds = load_model("deepseek-v3")
    assert ds.num_active_params == pytest.approx(37.6e9, rel=0.01)
    assert ds.mtp_params() == pytest.approx(11.5e9, rel=0.02)


def test_hf_fields_are_honoured_not_defaulted():
    qwen3 = load_model("qwen3-8b")
    assert (qwen3.head_dim, qwen3.qk_norm, qwen3.num_kv_heads) == (128, True, 8)
    gemma = load_model("gemma2-9b")
    assert gemma.head_dim == 256 and gemma.q_width == 16 * 256 != gemma.hidden_size
    assert gemma.tie_word_embeddings and gemma.norms_per_layer == 4
    gpt3 = load_model("gpt3-175b")
    assert gpt3.ffn_hidden_size == 4 * 12288 and not gpt3.gated_mlp and gpt3.norm == "layernorm"
    assert load_model("qwen2.5-7b").qkv_bias
    ds = load_model("deepseek-v3")
    assert ds.mla and ds.moe_layers[0] == 3 and ds.num_moe_layers == 58 and ds.shared_expert_ffn_hidden_size == 2048


def test_newer_spellings_and_nested_text_config():
    base = json.loads((MODELS / "llama3-8b.json").read_text())
    newer = {k: v for k, v in base.items() if k not in ("torch_dtype", "rope_theta")}
    newer |= {"dtype": "bfloat16", "rope_parameters": {"rope_theta": 500000, "rope_type": "default"}}
    nested = {"model_type": "gemma3", "text_config": {**base, "model_type": "gemma3_text", "head_dim": 128}}
    assert model_from_hf_dict(newer, "n").num_params == load_model("llama3-8b").num_params
    assert model_from_hf_dict(nested, "g").num_layers == 32


@pytest.mark.parametrize("raw, needle", [
    ({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 2, "vocab_size": 8},
     "missing field 'intermediate_size'"),
    ({"model_type": "bert"}, "model_type='bert' is not supported"),
    ({"hidden_size": 8}, "missing field 'model_type'"),
    ({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": -2,
      "intermediate_size": 16, "vocab_size": 8}, "bad: num_hidden_layers=-2: Input should be greater than 0"),
    ({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 3,
      "num_hidden_layers": 2, "intermediate_size": 16, "vocab_size": 8}, "num_key_value_heads=3"),
])
def test_bad_configs_raise_one_clear_line(raw, needle):
    with pytest.raises(AutoparError) as err:
        model_from_hf_dict(raw, "bad")
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_devices_and_overrides(tmp_path):
    h100 = load_device("h100-80gb")
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    with pytest.raises(AutoparError, match="has no fp8 peak"):
        load_device("a100-80gb").peak("fp8")
    with pytest.raises(AutoparError, match="unknown device"):
        load_device("v100")
    custom = tmp_path / "gpu.yaml"
    custom.write_text("base: h100-80gb\nmemory_bytes: 96e9\npeak_flops:\n  bf16: 800e12\n")
    dev = load_device(None, str(custom), ["inter_node_bandwidth_bytes_per_s=25e9"])
    assert (dev.memory_bytes, dev.peak("bf16"), dev.peak("fp8")) == (96e9, 800e12, 1978.9e12)
    assert dev.inter_node_bandwidth_bytes_per_s == 25e9
    with pytest.raises(AutoparError, match="device.memory_bytes"):
        load_device("h100-80gb", overrides=["memory_bytes=-1"])
    with pytest.raises(AutoparError, match="--nodes=0"):
        make_cluster(h100, 0, 8)
    assert make_cluster(load_device("gb200"), 18, None).fast_domain_size == 72
