"""A model given as a Hugging Face ``config.json`` goes by the config's own name in the outputs,
not by the file name ``config`` every such file has."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS
from typer.testing import CliRunner

from autopar.cli import app
from autopar.specs import load_model

LLAMA_CFG = json.loads((MODELS / "llama3-8b.json").read_text())
runner = CliRunner()


def _config(folder, **extra) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, **extra}))
    return str(path)


@pytest.mark.parametrize("extra, name", [
    ({"_name_or_path": "meta-llama/Llama-3.1-8B"}, "Llama-3.1-8B"),  # a Hub id: its model part
    ({"_name_or_path": "/ckpt/runs/llama-8b-long/"}, "llama-8b-long"),  # a local folder, trailing slash
    ({}, "llama"),  # no _name_or_path: the model type
    ({"_name_or_path": ""}, "llama"),
])
def test_config_json_is_named_by_its_own_name(tmp_path, extra, name):
    assert load_model(_config(tmp_path / "Meta-Llama-3-8B", **extra)).name == name


def test_a_file_with_its_own_name_keeps_it(tmp_path):
    path = tmp_path / "llama3-8b-long.json"
    path.write_text(json.dumps(LLAMA_CFG))
    assert load_model(str(path)).name == "llama3-8b-long"


def test_search_title_names_the_config(tmp_path):
    path = _config(tmp_path / "m", _name_or_path="meta-llama/Llama-3.1-8B")
    out = runner.invoke(app, ["search", "-m", path, "--device", "h100-80gb", "--gbs", "64", "--top", "1",
                              "--tp", "1", "--pp", "1", "--cp", "1"])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0].startswith("Llama-3.1-8B (8.0 B params) on 1 x 8 h100-80gb")
