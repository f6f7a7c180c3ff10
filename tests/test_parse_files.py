"""autopar.parse: the JSON/YAML readers of user files. An integer of 5,000 digits (past Python's
4,300-digit conversion limit) crashed the device-file reader and made an HF config or a search
result unreadable as a whole; a valid JSON device file with a control character was "not valid
YAML/JSON". Each case below was found by the fuzz suite (tests/test_fuzz_*.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.parse import json_loads, json_or_yaml, yaml_load
from test_bad_input import LAYERS_DOC, LLAMA, one_line_error

HUGE = "9" * 5000


def test_huge_integers_read_as_infinity_and_others_exactly():
    assert json_loads(f'{{"a": {HUGE}, "b": -{HUGE}, "c": {"9" * 300}}}') == \
        {"a": float("inf"), "b": float("-inf"), "c": int("9" * 300)}
    assert yaml_load(f"a: {HUGE}\nb: 0x10\nc: 1_000\n") == {"a": float("inf"), "b": 16, "c": 1000}
    assert json_or_yaml('{"name": "\x7f"}') == {"name": "\x7f"}  # JSON; PyYAML refuses the character
    assert json_or_yaml("pp: 4\n") == {"pp": 4}
    with pytest.raises(ValueError):
        json_or_yaml("a: [1")


@pytest.mark.parametrize("text, needle", [
    (f'base: h100-80gb\nmemory_bytes: {HUGE}\n', "device.memory_bytes=inf: Input should be a finite number"),
    (f'{{"base": "h100-80gb", "gemm_efficiency": {HUGE}}}', "device.gemm_efficiency=inf"),  # ValueError traceback
])
def test_device_file_with_a_huge_integer(tmp_path, text, needle):
    path = tmp_path / "dev.yaml"
    path.write_text(text)
    assert needle in one_line_error(["estimate", "-m", "llama3-8b", "--device-file", str(path)])


def test_device_file_that_is_json_with_a_control_character(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"base": "h100-80gb", "name": "\x7f", "memory_bytes": 96e9}))
    out = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "--device-file", str(path), "--json"])
    assert out.exit_code == 0, out.stderr  # was: "not valid YAML/JSON (unacceptable character #x007f ...)"


def test_device_set_with_a_huge_integer():
    err = one_line_error(["estimate", *LLAMA, "--device-set", f"memory_bytes={HUGE}"])
    assert "device.memory_bytes=inf" in err


def test_search_result_with_a_huge_integer_names_the_key(tmp_path):
    out = CliRunner().invoke(app, ["search", *LLAMA, "--top", "1", "--json"])
    doc = json.loads(out.stdout)
    doc["layouts"][0]["strategy"]["tp"] = "HUGE"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc).replace('"HUGE"', HUGE))
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA])
    assert "tp=inf" in err and "set_int_max_str_digits" not in err  # was: "not a readable search result"


def test_layers_file_with_a_huge_integer_names_the_key(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(LAYERS_DOC).replace('"num_microbatches": 16', f'"num_microbatches": {HUGE}'))
    err = one_line_error(["balance", "--layers", str(path)])
    assert "num_microbatches=inf: expected a positive integer" in err  # was: "neither JSON nor YAML"


def test_device_file_with_an_unknown_base_names_the_base_key(tmp_path):
    """Was "--device='': unknown device", for a --device the user never gave."""
    path = tmp_path / "dev.yaml"
    path.write_text('base: ""\n')
    assert f"--device-file '{path}': base='': unknown device; known: a100-40gb" in one_line_error(
        ["estimate", "-m", "llama3-8b", "--device-file", str(path)])


def test_model_name_too_long_for_the_file_system():
    """Path.exists() raised OSError: File name too long (a traceback)."""
    err = one_line_error(["estimate", "-m", "x" * 300, "--device", "h100-80gb"])
    assert err.startswith("error: --model: cannot read 'xxx") and "(File name too long)" in err


@pytest.mark.parametrize("flag", ["--tokenizer-model", "--vocab-file", "--tokenizer-name-or-path"])
def test_script_tokenizer_path_too_long_for_the_file_system(tmp_path, flag):
    """A script's tokenizer path of 300 characters: Path.is_dir() raised OSError (a traceback);
    it is now a file autopar cannot open, so the vocabulary size is asked for."""
    from test_bad_input import BASE_SCRIPT

    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT.replace("--tokenizer-type Llama2Tokenizer", f"--tokenizer-type Llama2Tokenizer "
                                        f"{flag} {'a' * 300}", 1))
    err = one_line_error(["estimate", "--script", str(path), "--device", "h100-80gb"])
    assert "the vocabulary size is unknown" in err
