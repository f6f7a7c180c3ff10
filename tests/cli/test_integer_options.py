"""One reading of a typed integer (``autopar.integers``): an optional sign and the ASCII digits
0-9. Python's ``int()`` read ``--tp 1_0`` as 10 and ``search --tp ２`` as 2, ``estimate --tp 2.0``
was accepted and ``tp: 2.0`` in a config refused; now each is refused everywhere."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.integers import is_integer_text, read_integer
from test_bad_input import one_line_error
from test_cli_config import _error

LLAMA = ["-m", "llama2-7b", "--device", "h100-80gb"]
RULE = "expected a whole number in the ASCII digits 0-9 (no '_', decimal point or exponent)"


@pytest.mark.parametrize("text, value", [("4", 4), ("+4", 4), ("-1", -1), (" 2", 2), ("007", 7),
                                         ("1_0", None), ("２", None), ("2.0", None), ("0x2", None), ("2e0", None),
                                         ("", None), ("٣", None), ("²", None)])
def test_read_integer(text, value):
    assert read_integer(text) == value and is_integer_text(text) == (value is not None)


@pytest.mark.parametrize("value", ["1_0", "２", "2.0"])
def test_an_int_option_refuses_what_int_would_stretch_to(value, capsys):
    assert _error(["estimate", *LLAMA, "--tp", value], capsys).startswith(f"error: --tp={value!r}: {RULE}")
    assert _error(["search", *LLAMA, "--top", value], capsys).startswith(f"error: --top={value!r}: {RULE}")


@pytest.mark.parametrize("value", ["1_0", "２", "2.0", "2,1_0"])
def test_a_constraint_set_refuses_them_too(value):
    assert one_line_error(["search", *LLAMA, "--tp", value]) == (
        f"error: --tp={value!r}: {RULE} in 1..1048576, or a comma-separated set of them, e.g. 1,2,4")


def test_other_integer_lists_refuse_them():
    assert "--gbs-range='1_28:256': integers expected" in one_line_error(["search", *LLAMA, "--gbs-range", "1_28:256"])
    assert "--layers-per-stage='1_6,16': expected integers" in one_line_error(
        ["estimate", *LLAMA, "--pp", "2", "--layers-per-stage", "1_6,16"])


def test_a_config_refuses_2_0_and_reads_2(tmp_path, capsys):
    for section in ("estimate", "search"):
        path = tmp_path / f"{section}.json"
        path.write_text(json.dumps({section: {"tp": 2.0}}))
        line = _error(["--config", str(path), section, *LLAMA], capsys)  # estimate's int, search's set
        assert (f"key 'tp' in section 'estimate' is 2.0: {RULE}" if section == "estimate" else
                f"--tp='2.0': {RULE} in 1..1048576") in line, line
    path.write_text(json.dumps({"estimate": {"tp": 2, "json": True}}))
    res = CliRunner().invoke(app, ["--config", str(path), "estimate", *LLAMA])
    assert res.exit_code == 0 and json.loads(res.stdout)["strategy"]["tp"] == 2
