"""``autopar balance`` refusals are one line naming the user's option (found by
tests/fuzz/test_fuzz_layout_options.py): the layout header was printed on stdout before a refusal, and
``--options 64`` was reported as ``recompute='64'``. (How the memory limit is named, and the options
``--layers`` refuses: tests/cli/test_ignored_options.py.)"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from test_bad_input import LAYERS_DOC, LLAMA

runner = CliRunner()


@pytest.mark.parametrize("extra, needle", [
    (["--memory-limit-gib", "31"], "error: --memory-limit-gib=31: no split of 32 layers over pp=2 fits"),
    (["--device-set", "memory_bytes=30e9"], "error: device h100-80gb memory (27.9 GiB): no split"),
    (["--options", "64"], "error: --options='64': '64' not among the recompute options none, selective, full"),
    (["--options", "none,bogus"], "error: --options='none,bogus': 'bogus' not among the recompute options"),
])
def test_balance_refusal_is_one_line_naming_the_option(extra, needle):
    out = runner.invoke(app, ["balance", *LLAMA, "--pp", "2", *extra])
    assert out.exit_code == 2
    assert out.stdout == ""  # no layout header before the error
    assert out.stderr.strip().startswith(needle) and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_balance_layers_file_unknown_option(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(LAYERS_DOC))
    out = runner.invoke(app, ["balance", "--layers", str(path), "--options", "none,full,x"])
    assert out.exit_code == 2 and "--options='none,full,x': 'x' not among" in out.stderr


def test_balance_header_still_printed_on_success():
    out = runner.invoke(app, ["balance", *LLAMA, "--pp", "2"])
    assert out.exit_code == 0 and out.stdout.startswith("llama3-8b (32 layers) on 8 h100-80gb: tp 1, pp 2")
