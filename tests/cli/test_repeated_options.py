"""An option given twice on the command line, or a key given twice in a --config file, is refused:
click (and YAML/JSON) kept the last one without a word, so ``estimate -m a -m b`` estimated b and
``search --tp 2 --tp 4`` searched tp 4 only."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from test_cli_config import _error

H100 = ["--device", "h100-80gb"]


@pytest.mark.parametrize("args, needle", [
    (["estimate", "-m", "llama2-7b", "--model", "llama3-8b", *H100], "--model given more than once: give it once "
     "(the command line keeps only one value)"),
    (["search", "-m", "llama2-7b", *H100, "--tp", "2", "--tp", "4"], "--tp given more than once: give it once; a set "
     "of values is one comma-separated value, e.g. --tp 2,4"),
    (["search", "-m", "llama2-7b", *H100, "--sp", "--no-sp"], "--sp/--no-sp given more than once"),
    (["export", "--format", "megatron", "-m", "llama2-7b", *H100, "--out", "a.sh", "--out", "b.sh"],
     "--out given more than once"),
    (["--config", "a.yaml", "--config", "b.yaml", "devices"], "--config given more than once"),
    (["profile", "comm", "--db", "a.db", "--db", "b.db"], "--db given more than once"),
])
def test_an_option_given_twice_is_refused(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    assert _error(args, capsys).startswith(f"error: {needle}")
    assert list(tmp_path.iterdir()) == []


def test_repeatable_options_still_repeat():
    res = CliRunner().invoke(app, ["estimate", "-m", "llama2-7b", *H100, "--device-set", "memory_bytes=85899345920",
                                   "--device-set", "framework_overhead_bytes=0", "--json"])
    assert res.exit_code == 0, res.output


def test_a_yaml_or_json_config_with_a_key_twice_is_refused(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("search: {gbs: 64}\nestimate: {tp: 2}\nsearch: {gbs: 128}\n")
    assert "not valid YAML (duplicate key 'search' on lines 1 and 3 (YAML keeps only the last; give each key " \
           "once))" in _error(["--config", str(tmp_path / "c.yaml"), "search", "-m", "llama2-7b", *H100], capsys)
    (tmp_path / "c.json").write_text('{"search": {"gbs": 64, "gbs": 8}}')
    assert "not valid JSON (duplicate key 'gbs' (JSON keeps only the last; give each key once))" \
        in _error(["--config", str(tmp_path / "c.json"), "search", "-m", "llama2-7b", *H100], capsys)


def test_yaml_merge_keys_are_not_duplicates():
    from autopar.specs.long_numbers import yaml_load

    assert yaml_load("base: &b {gbs: 64, top: 2}\nsearch:\n  <<: *b\n  gbs: 128\n")["search"] == {"gbs": 128, "top": 2}
