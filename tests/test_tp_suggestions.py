"""The ``--tp may be ...`` suggestion in an error lists only values the model's rules accept."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app
from conftest import MODELS
from test_bad_input import error_line_of

runner = CliRunner()


LLAMA3_8B = str(MODELS / "llama3-8b.json")  # 32 heads, 8 KV heads, ffn 14336, 8192 positions



def test_tp_suggestion_drops_values_the_kv_heads_rule_refuses():
    # 4 nodes x 8 = 32 devices: divisors 1, 2, 4, 8, 16, 32; 8 KV heads refuse 16 and 32
    result = runner.invoke(app, ["estimate", "--model", LLAMA3_8B, "--device", "h100-80gb", "--nodes", "4",
                                 "--tp", "3"])
    err = error_line_of(result)
    assert "--tp may be 1, 2, 4, 8 (" in err


def test_tp_suggestion_follows_pp_and_cp_and_moe_ffn():
    # qwen3-30b-a3b: 32 heads, 4 KV heads -> tp in 1, 2, 4; world 32 / (pp 2 * cp 2) = 8
    result = runner.invoke(app, ["estimate", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--nodes", "4",
                                 "--tp", "3", "--pp", "2", "--cp", "2"])
    assert "--tp may be 1, 2, 4 (" in error_line_of(result)
