"""``autopar balance`` refusals are one line naming the user's option (found by
tests/test_fuzz_layout_options.py): the layout header was printed on stdout before a refusal,
``--options 64`` was reported as ``recompute='64'`` and ``--memory-limit-gib 31`` as
``memory_limit_bytes=31.0 GiB``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from test_bad_input import LAYERS_DOC, LLAMA

runner = CliRunner()


@pytest.mark.parametrize("extra, needle", [
    (["--memory-limit-gib", "31"], "error: --memory-limit-gib=31.0 GiB: no split of 32 layers over pp=2 fits"),
    (["--device-set", "memory_bytes=30e9"], "error: --memory-limit-gib=27.9 GiB: no split"),  # the device's default
    (["--options", "64"], "error: --options='64': '64' not among the recompute options none, selective, full"),
    (["--options", "none,bogus"], "error: --options='none,bogus': 'bogus' not among the recompute options"),
])
def test_balance_refusal_is_one_line_naming_the_option(extra, needle):
    out = runner.invoke(app, ["balance", *LLAMA, "--pp", "2", *extra])
    assert out.exit_code == 2
    assert out.stdout == ""  # no layout header before the error
    assert out.stderr.strip().startswith(needle) and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_balance_layers_file_limit_keeps_its_key(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps({**LAYERS_DOC, "memory_limit_bytes": 1e9}))
    out = runner.invoke(app, ["balance", "--layers", str(path)])
    assert out.exit_code == 2 and out.stderr.startswith("error: memory_limit_bytes=0.9 GiB: no split"), out.stderr
    out = runner.invoke(app, ["balance", "--layers", str(path), "--options", "none,full,x"])
    assert out.exit_code == 2 and "--options='none,full,x': 'x' not among" in out.stderr


def test_balance_header_still_printed_on_success():
    out = runner.invoke(app, ["balance", *LLAMA, "--pp", "2"])
    assert out.exit_code == 0 and out.stdout.startswith("llama3-8b (32 layers) on 8 h100-80gb: tp 1, pp 2")


@pytest.mark.parametrize("extra", [["--precision", "junk"], ["--devices-per-node", "0"], ["--vocab-size", "-1"],
                                   ["--device-set", "memory_bytes=1"], ["--no-flash-attention"],
                                   ["--make-vocab-size-divisible-by", "64"]])
def test_balance_layers_refuses_the_options_it_ignored(tmp_path, extra):
    """The README says model and cluster options are refused with --layers; these were accepted
    and ignored (issue 13; found again by tests/test_fuzz_layers_file.py)."""
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(LAYERS_DOC))
    out = runner.invoke(app, ["balance", "--layers", str(path), *extra])
    option = extra[0].replace("--no-", "--")
    assert out.exit_code == 2 and out.stderr.startswith(f"error: --layers with {option}: the layer file gives"), \
        out.stderr
