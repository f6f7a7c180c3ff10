"""The Galvatron writer: fp8 refused with the formats that run it, bf16 written per layer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from test_bad_input import error_line_of

runner = CliRunner()



@pytest.mark.parametrize("command", [
    ["export", "--format", "galvatron", "--zero", "0"],
    ["search", "--target", "galvatron", "--top", "1"],
])
def test_galvatron_refuses_fp8(command):
    result = runner.invoke(app, command + ["--model", "llama3-8b", "--device", "h100-80gb", "--precision", "fp8"])
    err = error_line_of(result)
    assert "precision fp8" in err and "--format megatron or torchtitan" in err


def test_galvatron_bf16_still_written():
    result = runner.invoke(app, ["export", "--format", "galvatron", "--model", "llama3-8b", "--device", "h100-80gb",
                                 "--zero", "0", "--tp", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tp_sizes_enc"].split(",") == ["2"] * 32
