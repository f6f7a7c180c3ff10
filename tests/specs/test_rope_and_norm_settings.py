"""RoPE base and norm epsilon: read from HF configs and scripts, stated in the exports."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import WRITERS
from autopar.specs.hf import model_from_hf_dict
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem


def test_script_rotary_base_and_norm_epsilon_survive_into_the_printed_arguments(tmp_path):
    """`search --script pretrain_mixtral_8x7b.sh` printed Megatron arguments without the script's
    --rotary-base 1000000 (Megatron's default is 10000): the reader dropped it."""
    src = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()
    script = tmp_path / "mix.sh"
    script.write_text(src.replace("--rotary-base 1000000", "--rotary-base 1000000\n    --norm-epsilon 1e-5"))
    spec = read_script(script).model_spec()
    assert (spec.rope_theta, spec.norm_eps) == (1e6, 1e-5)
    out = CliRunner().invoke(app, ["search", "--script", str(script), "--device", "h100-80gb", "--top", "1"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "--rotary-base 1000000" in out.output and "--norm-epsilon 1e-05" in out.output


def test_megatron_export_states_rope_base_and_norm_epsilon():
    """Megatron's defaults are --rotary-base 10000 and --norm-epsilon 1e-5 (ecosystem.md 1.5); the
    HF configs say 500000 / 1e-5 (Llama 3), 1000000 / 1e-6 (Qwen3), so without the flags the
    exported run trains a different network. GPT-3 (learned positions) gets no rotary base."""
    def flag(model: str, name: str) -> str | None:
        words = WRITERS["megatron"](make_problem(model, gbs=64, seq=2048), Strategy(dp=8)).split()
        return words[words.index(name) + 1] if name in words else None

    assert (flag("llama3-70b", "--rotary-base"), flag("llama3-70b", "--norm-epsilon")) == ("500000", "1e-05")
    assert (flag("qwen3-30b-a3b", "--rotary-base"), flag("qwen3-30b-a3b", "--norm-epsilon")) == ("1000000", "1e-06")
    assert flag("gpt3-175b", "--rotary-base") is None


def test_hf_rope_theta_spellings():
    """transformers 5.x writes ``rope_parameters`` (possibly keyed by layer type) instead of a
    top-level ``rope_theta``; a non-number is one error line naming the field."""


    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 100}
    assert model_from_hf_dict({**base, "rope_theta": 1e6}, "x").rope_theta == 1e6
    assert model_from_hf_dict({**base, "rope_parameters": {"rope_theta": 5e5}}, "x").rope_theta == 5e5
    keyed = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}
    assert model_from_hf_dict({**base, "rope_parameters": keyed}, "x").rope_theta == 1e6
    assert model_from_hf_dict(base, "x").rope_theta is None
    with pytest.raises(AutoparError, match="field 'rope_theta'='big' must be a finite number"):
        model_from_hf_dict({**base, "rope_theta": "big"}, "x")
