"""``--config FILE`` (issue 19 item 5): options from YAML or JSON, a section per command, the
command line overriding the file, unknown sections and keys refused with one line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autopar.cli import app, main
from test_search_constraints import ENUMERATED  # llama3-8b on 8 H100, derived there by hand

runner = CliRunner()
SEARCH = {"model": "llama3-8b", "device": "h100-80gb", "nodes": 1, "gbs": 8, "seq-len": 4096, "top": 2,
          "json": True, "zero": 1, "pp": [1, 2]}


def _write(tmp_path, name: str, data: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if name.endswith(".json") else "\n".join(
        f"{section}:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in opts.items()) for section, opts in data.items()))
    return str(path)


def test_yaml_section_supplies_the_options_and_the_command_line_wins(tmp_path):
    path = _write(tmp_path, "run.yaml", {"search": SEARCH, "estimate": {"tp": 2}})
    doc = json.loads(runner.invoke(app, ["search", "--config", path]).stdout)
    # the file's pp: [1, 2] is --pp 1,2; zero: 1 then removes 3 of the 4 ZeRO stages of what is left
    left = ENUMERATED - doc["constraints"]["--pp 1,2"]
    assert doc["constraints"]["--zero 1"] == left * 3 // 4
    assert len(doc["layouts"]) == 2 and doc["problem"]["train"]["global_batch_size"] == 8
    out = runner.invoke(app, ["search", "--config", path, "--zero", "0,1", "--top", "1"])
    doc = json.loads(out.stdout)
    assert "--zero 0,1" in doc["constraints"] and len(doc["layouts"]) == 1


def test_json_file_before_the_command_and_estimate_section(tmp_path):
    path = _write(tmp_path, "run.json", {"estimate": {"model": "llama3-8b", "device": "h100-80gb", "nodes": 1,
                                                      "gbs": 8, "tp": 2, "json": True}})
    out = runner.invoke(app, ["--config", path, "estimate"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["strategy"]["tp"] == 2


def _error(args: list[str], capsys) -> str:
    try:
        main_args = args
        import sys

        old, sys.argv = sys.argv, ["autopar", *main_args]
        try:
            main()
        finally:
            sys.argv = old
    except SystemExit as exit_:
        assert exit_.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    return err[0]


def test_unknown_key_names_the_key_and_the_section(tmp_path, capsys):
    path = _write(tmp_path, "bad.yaml", {"search": {"tpp": 4}})
    line = _error(["search", "--config", path], capsys)
    assert "unknown key 'tpp' in section 'search'" in line and "tp," in line


def test_unknown_section_and_unreadable_files(tmp_path, capsys):
    path = _write(tmp_path, "bad.yaml", {"serch": {"tp": 4}})
    assert "unknown section 'serch'; allowed" in _error(["search", "--config", path], capsys)
    assert "cannot read" in _error(["search", "--config", str(tmp_path / "none.yaml")], capsys)
    broken = tmp_path / "broken.json"
    broken.write_text("{search: ")
    assert "not valid JSON" in _error(["--config", str(broken), "devices"], capsys)


def test_a_bad_value_in_the_file_is_refused_like_the_option(tmp_path, capsys):
    path = _write(tmp_path, "bad.yaml", {"search": {**SEARCH, "zero": 5}})
    assert "--zero='5': must be an integer in 0..3" in _error(["search", "--config", path], capsys)


def test_true_false_for_an_option_that_takes_a_value_is_refused(tmp_path, capsys):
    """YAML ``gbs: true`` was read by click as ``int(True)`` = 1 (a search at gbs 1), ``top: false``
    as 0 and ``memory_margin: true`` as 1.0; --device-file refuses true/false for a number, and so
    does --config, naming the key, the section and the option."""
    for key, value in [("gbs", True), ("top", False), ("nodes", True), ("memory_margin", True), ("pp", [1, True]),
                       ("model", True)]:
        path = _write(tmp_path, "bool.yaml", {"search": {**SEARCH, key: value}})
        line = _error(["--config", path, "search"], capsys)
        option = "--" + key.replace("_", "-")
        assert f"key {key!r} in section 'search' is {json.dumps(value)}: {option} takes a value, not true/false" \
            in line, line


def test_true_false_for_a_flag_is_read(tmp_path):
    path = _write(tmp_path, "flag.yaml", {"search": {**SEARCH, "no_cp": True, "top": 1}})
    out = runner.invoke(app, ["--config", path, "search"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["layouts"]) == 1
