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
