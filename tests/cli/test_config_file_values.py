"""``--config FILE`` values read as the command line reads them (second hostile round): YAML 1.1's
number rules (octal, base 60, ``0x``, ``_``), hyphen/underscore spellings of one key, a top level
that is no mapping, and errors that name the file, the key, the value and what is allowed."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from autopar.cli import app, main

runner = CliRunner()
BASE = ["search", "-m", "llama3-8b", "--device", "h100-80gb", "--top", "1", "--json"]


def _config(tmp_path, body: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def _search(path: str, *extra: str) -> dict:
    out = runner.invoke(app, ["--config", path, *BASE, *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _error(args: list[str], capsys) -> str:
    """The one ``error:`` line of ``autopar ARGS`` (exit 2 asserted)."""
    old, sys.argv = sys.argv, ["autopar", *args]
    try:
        with pytest.raises(SystemExit) as exit_:
            main()
    finally:
        sys.argv = old
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_a_leading_zero_gbs_is_decimal_as_on_the_command_line(tmp_path):
    # YAML 1.1 reads 010 as octal 8; --gbs 010 is 10
    doc = _search(_config(tmp_path, "search:\n  gbs: 010\n"))
    assert doc["problem"]["train"]["global_batch_size"] == 10


def test_a_gbs_range_in_the_file_is_a_range_not_a_base_60_number(tmp_path):
    # YAML 1.1 reads 16:32 as 16 * 60 + 32 = 992 (one search); --gbs-range 16:32 is 16, 32
    out = runner.invoke(app, ["--config", _config(tmp_path, "search:\n  gbs_range: 16:32\n"), *BASE[:-1]])
    assert out.exit_code == 0, out.output
    assert "992" not in out.stdout and "gbs 32" in out.stdout


@pytest.mark.parametrize("line, text", [("gbs: 1:30", "1:30"), ("gbs: 0x10", "0x10"), ("seq_len: 4_096", "4_096"),
                                        ("gbs: 2.0", "2.0")])
def test_numbers_the_command_line_refuses_are_refused_in_the_file(tmp_path, capsys, line, text):
    path = _config(tmp_path, f"search:\n  {line}\n")
    err = _error(["--config", path, *BASE], capsys)
    assert path in err and repr(line.split(":")[0]) in err and f'"{text}"' in err and "whole number" in err


def _reproduce_line(folder) -> str:
    """The ``Reproduce:`` command line of ``folder``'s report.html, HTML-unescaped."""
    import html
    import re

    text = (folder / "report.html").read_text()
    return html.unescape(re.search(r"Reproduce: <code>(.*?)</code>", text).group(1))


@pytest.mark.parametrize("from_config", [False, True])
def test_report_reproduce_line_repeats_device_set_once_per_value_and_reruns(tmp_path, monkeypatch, from_config):
    import shlex

    monkeypatch.chdir(tmp_path)
    sets = ["memory_bytes=100e9", "name=x y"]
    args = ["search", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "8", "--top", "1"]
    if from_config:
        path = _config(tmp_path, "search:\n  device_set: [memory_bytes=100e9, 'name=x y']\n")
        args = ["--config", path, *args]
    else:
        args += [w for s in sets for w in ("--device-set", s)]
    out = runner.invoke(app, [*args, "--report", "r1"])
    assert out.exit_code == 0, out.output
    line = _reproduce_line(tmp_path / "r1")
    assert "--device-set memory_bytes=100e9 --device-set 'name=x y'" in line and "[" not in line, line
    words = shlex.split(line)
    assert words[0] == "autopar"
    words[words.index("--report") + 1] = "r2"
    rerun = runner.invoke(app, words[1:])
    assert rerun.exit_code == 0, rerun.output
    first = json.loads((tmp_path / "r1" / "result.json").read_text())
    again = json.loads((tmp_path / "r2" / "result.json").read_text())
    assert again["layouts"] == first["layouts"] and "x y" in json.dumps(again)


@pytest.mark.parametrize("first, second", [("no-cp: true", "no_cp: false"), ("seq-len: 2048", "seq_len: 8192"),
                                           ("--gbs: 8", "gbs: 16")])
def test_two_spellings_of_one_key_are_refused_as_a_duplicate(tmp_path, capsys, first, second):
    path = _config(tmp_path, f"search:\n  {first}\n  {second}\n")
    err = _error(["--config", path, *BASE], capsys)
    a, b = first.split(":")[0], second.split(":")[0]
    option = "--" + b.replace("_", "-")
    assert f"keys {a!r} and {b!r} in section 'search' are both {option}: give it once" in err, err


@pytest.mark.parametrize("body, kind", [("- 1\n", "a list"), ("[]\n", "a list"), ("0\n", '"0"'),
                                        ("''\n", '""'), ("false\n", "false")])
def test_a_top_level_that_is_no_mapping_is_refused(tmp_path, capsys, body, kind):
    path = _config(tmp_path, body)
    err = _error(["--config", path, *BASE], capsys)
    assert f"{path}: the top level must map names to values ('name: value' lines), got {kind}" in err, err


def test_an_empty_config_file_is_no_options(tmp_path):
    doc = _search(_config(tmp_path, ""), "--gbs", "8")
    assert doc["problem"]["train"]["global_batch_size"] == 8


def test_gbs_range_with_gbs_is_refused(capsys):
    # the range's searches ignored --gbs 64 (a search per gbs 16..256 ran, exit 0)
    err = _error([*BASE[:3], "--device", "h100-80gb", "--gbs-range", "16:256", "--gbs", "64"], capsys)
    assert "--gbs-range='16:256' searches each gbs of its range; --gbs=64 is one gbs: drop one of them" in err, err


def test_gbs_range_in_a_config_with_gbs_on_the_command_line_is_refused(tmp_path, capsys):
    path = _config(tmp_path, "search:\n  gbs_range: 16:64\n")
    err = _error(["--config", path, *BASE[:5], "--gbs", "64"], capsys)
    assert "--gbs-range='16:64'" in err and "--gbs=64" in err, err


@pytest.mark.parametrize("line, message", [
    # was click's "Invalid value for '--gbs': Input should be a valid integer, ... (got '64,128')"
    ("gbs: [64, 128]", "key 'gbs' in section 'search' is [64, 128]: --gbs takes one whole number, not a list"),
    # was "Input should be a valid number, unable to parse string as a number"
    ('memory_margin: "10%"', "key 'memory_margin' in section 'search' is \"10%\": --memory-margin takes a number"),
    # was "Input should be a valid boolean, unable to interpret input"
    ('flash_attention: "nope"', ("key 'flash_attention' in section 'search' is \"nope\": "
                                 "--flash-attention/--no-flash-attention is a flag: give true or false")),
])
def test_a_value_of_the_wrong_kind_names_the_file_key_value_and_what_is_allowed(tmp_path, capsys, line, message):
    path = _config(tmp_path, f"search:\n  {line}\n")
    err = _error(["--config", path, *BASE], capsys)
    assert f"{path}: {message}" in err and "Input should be" not in err, err


def test_memory_margin_in_a_config_is_still_read(tmp_path):
    doc = _search(_config(tmp_path, "search:\n  memory_margin: 0.2\n  flash_attention: true\n"), "--gbs", "8")
    assert doc["problem"]["train"]["global_batch_size"] == 8


def test_device_set_unknown_field_names_the_option_and_lists_the_fields(capsys):
    err = _error([*BASE, "--device-set", "mem_gib=1"], capsys)
    assert "--device-set='mem_gib=1': unknown device field 'mem_gib'; allowed: name, description" in err, err
    assert "memory_bytes" in err


@pytest.mark.parametrize("value, message", [
    ("tp=", "--explain='tp=': tp='': one value per key, a whole number in 1..1048576 (e.g. tp=4)"),
    ("tp=1,2", "--explain='tp=1,2': '2' is not key=value; --explain takes one value per key"),
    ("recompute=x", "recompute='x': one value per key, none, selective, full (e.g. recompute=none)"),
])
def test_explain_errors_ask_for_one_value_per_key_not_a_set(capsys, value, message):
    err = _error([*BASE, "--explain", value], capsys)
    assert message in err and "comma-separated set" not in err, err


def test_gbs_range_with_four_parts_says_so(capsys):
    err = _error([*BASE[:5], "--gbs-range", "16:64:16:2"], capsys)
    assert "--gbs-range='16:64:16:2': 4 ':'-separated numbers; give 2 or 3" in err and "FIRST <= LAST" not in err
