"""``warning:`` lines print only when the command succeeds; a failing command prints its one error line alone."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app
from conftest import MODELS
from test_bad_input import error_line_of

runner = CliRunner()


LLAMA3_8B = str(MODELS / "llama3-8b.json")  # 32 heads, 8 KV heads, ffn 14336, 8192 positions



def test_seq_len_beyond_positions_that_then_fails_prints_only_the_error():
    # 16M tokens on 8 H100: nothing fits; the max-positions warning must not precede the error
    result = runner.invoke(app, ["search", "--model", LLAMA3_8B, "--device", "h100-80gb", "--seq-len", "16000000"])
    assert "no layout fits" in error_line_of(result)


def test_seq_len_beyond_positions_that_succeeds_keeps_the_warning():
    result = runner.invoke(app, ["estimate", "--model", LLAMA3_8B, "--device", "h100-80gb", "--seq-len", "16384",
                                 "--tp", "8", "--recompute", "full", "--gbs", "8"])
    assert result.exit_code == 0, result.output
    assert "warning: --seq-len 16384 exceeds the model's max_position_embeddings 8192" in result.stderr
