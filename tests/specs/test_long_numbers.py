"""A number literal of thousands of digits in a config, device file, ``--device-set`` or search
result is one ``error:`` line naming the key as "too large", never Python's
``sys.set_int_max_str_digits()`` advice or a traceback (:mod:`autopar.specs.long_numbers`)."""

from __future__ import annotations

import json

import pytest

from autopar.cli import app
from autopar.specs.long_numbers import LongNumber, json_loads, json_or_yaml, yaml_load
from conftest import MODELS
from test_bad_input import LAYERS_DOC, LLAMA, one_line_error, runner

LLAMA_CFG = json.loads((MODELS / "llama3-8b.json").read_text())
DIGITS = "7" * 5000


def test_long_literals_are_kept_as_text_and_short_ones_parsed():
    assert json_loads('{"a": 123, "b": -%s, "c": 1.5}' % DIGITS) == {"a": 123, "b": LongNumber("-" + DIGITS), "c": 1.5}
    assert repr(json_loads(DIGITS)) == "<a 5000-digit number>"
    assert yaml_load(f"a: {DIGITS}\nb: 0x1f\nc: 1_000\nd: 10\n") == {"a": LongNumber(DIGITS), "b": 31, "c": 1000, "d": 10}
    assert json_loads("1" * 30) == int("1" * 30) and isinstance(json_loads("1" * 31), LongNumber)


@pytest.mark.parametrize("key", ["vocab_size", "num_hidden_layers", "rope_theta", "attention_dropout"])
def test_a_config_number_too_long_is_too_large_by_key(tmp_path, key):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**LLAMA_CFG, key: 1}).replace(f'"{key}": 1', f'"{key}": ' + DIGITS))
    err = one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])
    assert f"c.json: {key}=<a 5000-digit number>: too large" in err and "set_int_max_str_digits" not in err
    assert len(err) < 300


def test_a_long_number_under_a_key_autopar_does_not_read_is_ignored(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(LLAMA_CFG)[:-1] + ', "pad_token_id": ' + DIGITS + "}")
    result = runner.invoke(app, ["estimate", "-m", str(path), "--device", "h100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    default = runner.invoke(app, ["estimate", *LLAMA, "--json"])
    assert json.loads(result.stdout)["step_time_s"] == json.loads(default.stdout)["step_time_s"]


@pytest.mark.parametrize("setting, needle", [
    (f"memory_bytes={DIGITS}", "device.memory_bytes=<a 5000-digit number>: too large"),  # was a traceback
    (f"peak_flops.bf16={DIGITS}", "device.peak_flops.bf16=<a 5000-digit number>: too large"),
])
def test_device_values_too_long(tmp_path, setting, needle):
    assert needle in one_line_error(["estimate", *LLAMA, "--device-set", setting])
    path = tmp_path / "d.yaml"
    path.write_text("base: h100-80gb\n" + (setting.replace("=", ": ") if "." not in setting.split("=")[0]
                                          else f"peak_flops:\n  bf16: {DIGITS}\n"))
    assert needle in one_line_error(["estimate", "-m", "llama3-8b", "--device-file", str(path)])


@pytest.mark.parametrize("key", ["tp", "gbs"])
def test_a_search_result_number_too_long(tmp_path, key):
    out = runner.invoke(app, ["search", *LLAMA, "--top", "1", "--json"])
    doc = json.loads(out.stdout)
    doc["layouts"][0]["strategy"][key] = 123456789
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc).replace("123456789", DIGITS))
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA])
    assert f"--from='{path}': layout 1 {key}=<a 5000-digit number>: too large" in err


def test_json_or_yaml_reads_json_yaml_refuses():
    assert json_or_yaml('{"name": "\x7f", "a": %s}' % DIGITS) == {"name": "\x7f", "a": LongNumber(DIGITS)}
    assert json_or_yaml(f"pp: 4\nb: {DIGITS}\n") == {"pp": 4, "b": LongNumber(DIGITS)}
    with pytest.raises(ValueError):
        json_or_yaml("a: [1")


def test_device_file_that_is_json_with_a_control_character(tmp_path):
    """Was "not valid YAML/JSON (unacceptable character #x007f ...)": PyYAML refuses DEL in a string."""
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"base": "h100-80gb", "name": "\x7f", "memory_bytes": 96e9}))
    out = runner.invoke(app, ["estimate", "-m", "llama3-8b", "--device-file", str(path), "--json"])
    assert out.exit_code == 0, out.output


@pytest.mark.parametrize("key", ["num_microbatches", "memory_limit_bytes"])
def test_a_layers_file_number_too_long(tmp_path, key):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps({**LAYERS_DOC, key: 1}).replace(f'"{key}": 1', f'"{key}": {DIGITS}'))
    err = one_line_error(["balance", "--layers", str(path)])
    assert f"{key}=<a 5000-digit number>: too large" in err  # was "neither JSON nor YAML (Exceeds the limit ...)"
