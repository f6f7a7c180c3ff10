"""Errors about a Hugging Face ``config.json`` name the key the user wrote, with the value written
there (not autopar's ``ModelSpec`` field or a value derived from it), and an input path that is
not a regular file is named by what it is, not "does not exist"."""

from __future__ import annotations

import json
import os
import re

import pytest

from conftest import MODELS
from test_bad_input import LLAMA, one_line_error

LLAMA_CFG = json.loads((MODELS / "llama3-8b.json").read_text())
DEEPSEEK_CFG = json.loads((MODELS / "deepseek-v3.json").read_text())
MIXTRAL_CFG = json.loads((MODELS / "mixtral-8x7b.json").read_text())
QWEN_MOE_CFG = json.loads((MODELS / "qwen3-30b-a3b.json").read_text())
GPT2_CFG = {"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
            "vocab_size": 50257}


def _estimate(tmp_path, text: str) -> str:
    path = tmp_path / "c.json"
    path.write_text(text)
    return one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])


@pytest.mark.parametrize("base, changes, needle", [
    (LLAMA_CFG, {"num_hidden_layers": -1}, "c.json: num_hidden_layers=-1: Input should be greater than 0"),
    (LLAMA_CFG, {"num_hidden_layers": 0}, "c.json: num_hidden_layers=0: Input should be greater than 0"),
    (LLAMA_CFG, {"num_key_value_heads": 0}, "c.json: num_key_value_heads=0: Input should be greater than 0"),
    (LLAMA_CFG, {"intermediate_size": -5}, "c.json: intermediate_size=-5: Input should be greater than 0"),
    (LLAMA_CFG, {"rope_theta": -1}, "c.json: rope_theta=-1: Input should be greater than 0"),
    (LLAMA_CFG, {"rms_norm_eps": 2}, "c.json: rms_norm_eps=2: Input should be less than 1"),
    # a derived width: the key and its own value, not shared_expert_ffn_hidden_size=-2048
    (DEEPSEEK_CFG, {"n_shared_experts": -1}, "c.json: n_shared_experts=-1: Input should be greater than or equal to 0"),
    (DEEPSEEK_CFG, {"n_routed_experts": 3}, "c.json: num_experts_per_tok=8 must be in 1..3 (n_routed_experts)"),
    (MIXTRAL_CFG, {"router_aux_loss_coef": 1e9}, "c.json: router_aux_loss_coef=1000000000.0: Input should be less"),
    (DEEPSEEK_CFG, {"n_group": 7}, "c.json: n_group=7 with topk_group=4: the groups must split n_routed_experts=256"),
    (QWEN_MOE_CFG, {"moe_intermediate_size": 0}, "c.json: moe_intermediate_size=0 must be > 0 for a MoE model"),
    (QWEN_MOE_CFG, {"num_experts_per_tok": 200}, "c.json: num_experts_per_tok=200 must be in 1..128 (num_experts)"),
    (GPT2_CFG, {"n_layer": 0}, "c.json: n_layer=0: Input should be greater than 0"),
    (GPT2_CFG, {"n_positions": -1}, "c.json: n_positions=-1: Input should be greater than 0"),
    # checked while reading: the MoE layer list of 10^9 layers was built before the range check
    (MIXTRAL_CFG, {"num_hidden_layers": 10**9}, "c.json: num_hidden_layers=1000000000: must be at most 10000"),
])
def test_range_errors_name_the_config_key(tmp_path, base, changes, needle):
    err = _estimate(tmp_path, json.dumps({**base, **changes}))
    assert needle in err, err
    internal = r"(?<![a-z_])(num_layers|ffn_hidden_size|num_kv_heads|router_num_groups|norm_eps|mtp_num_layers)="
    assert not re.search(internal, err) and "c.json." not in err, err


@pytest.mark.parametrize("make, needle", [
    (lambda p: os.mkfifo(p), "not a regular file (a named pipe (FIFO))"),  # read() blocked forever
    (lambda p: (os.symlink(p.name + ".b", p), os.symlink(p.name, str(p) + ".b")), "is a symlink loop"),
    (lambda p: os.symlink("gone.json", p), "is a broken symlink (to 'gone.json', which does not exist)"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: None, "does not exist"),
])
@pytest.mark.parametrize("option, extra", [
    ("--model", ["--device", "h100-80gb"]),
    ("--script", ["--device", "h100-80gb"]),
    ("--device-file", ["-m", "llama3-8b"]),
])
def test_an_input_that_is_not_a_regular_file_is_named_by_kind(tmp_path, make, needle, option, extra):
    path = tmp_path / "in.json"
    make(path)
    err = one_line_error(["estimate", option, str(path), *extra])
    assert needle in err and err.startswith(f"error: {option}="), err


@pytest.mark.parametrize("args", [
    ["export", "--format", "megatron", *LLAMA, "--from", "{f}"],
    ["balance", "--layers", "{f}"],
])
def test_a_fifo_as_a_result_or_layers_file_is_refused_not_read(tmp_path, args):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    err = one_line_error([a.replace("{f}", str(fifo)) for a in args])
    assert "not a regular file (a named pipe (FIFO))" in err


def test_dev_null_as_model_is_a_character_device():
    assert "--model='/dev/null': not a regular file (a character device)" in one_line_error(
        ["estimate", "-m", "/dev/null", "--device", "h100-80gb"])


def test_a_multimodal_wrapper_without_its_text_config_names_text_config(tmp_path):
    """Llama 4's wrapper (model_type llama4) keeps the text model in ``text_config``; without it
    the error names that key (the fuzz suite's case), not only the unsupported model_type."""
    err = _estimate(tmp_path, json.dumps({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4"}))
    assert "'text_config', which is missing" in err and "llama4_text" in err, err
