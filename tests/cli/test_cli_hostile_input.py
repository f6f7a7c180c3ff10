"""Inputs a hostile (or hurried) user gave that were ignored, written over or shown as a traceback:
``export --rank`` without ``--from``, a binary ``--config`` file, a scalar for a repeatable option in
``--config``, ``search --plot`` naming a non-PNG file (it wrote PNG bytes over the user's launch
script) and ``plan`` checking its ``--target`` and ``--out`` only after planning."""

from __future__ import annotations

import json

from test_bad_input import LLAMA, one_line_error, runner
from test_cli_config import _error
from autopar.cli import app
from conftest import SCRIPTS


def test_export_rank_without_from_is_refused():
    err = one_line_error(["export", "--format", "megatron", *LLAMA, "--tp", "2", "--rank", "2"])
    assert err.startswith("error: --rank=2 picks a layout of a search result; add --from"), err


def test_export_rank_with_from_picks_that_layout(tmp_path):
    result = runner.invoke(app, ["search", *LLAMA, "--gbs", "64", "--top", "3", "--json"])
    path = tmp_path / "result.json"
    path.write_text(result.stdout)
    second = json.loads(result.stdout)["layouts"][1]["strategy"]
    out = runner.invoke(app, ["export", "--format", "megatron", "--from", str(path), "--rank", "2", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["layout"]["strategy"]["tp"] == second["tp"]


def test_binary_config_file_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_bytes(b"\xff\xfe\x00search: {}")  # UTF-16 text or any binary: was a UnicodeDecodeError traceback
    line = _error(["--config", str(path), "search"], capsys)
    assert "run.yaml: not a text file (expected YAML or JSON)" in line, line


def test_config_scalar_for_a_repeatable_option_is_one_value(tmp_path):
    path = tmp_path / "run.yaml"
    # was "Value must be an iterable"; one --device-set of 1 byte leaves no layout that fits
    path.write_text("search: {model: llama3-8b, device: h100-80gb, device_set: memory_bytes=1}\n")
    err = one_line_error(["--config", str(path), "search"])
    assert err.startswith("error: no layout fits in 0.0 GiB per device"), err


def test_search_plot_refuses_a_name_that_is_not_png_and_leaves_the_file(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text())
    before = script.read_bytes()
    for name, needle in [(str(script), "give a file name ending in .png"), (str(tmp_path / "c.svg"), ".png"),
                         (str(tmp_path / "no" / "c.png"), "cannot write (no directory")]:
        err = one_line_error(["search", *LLAMA, "--gbs-range", "64:128", "--plot", name])
        assert err.startswith(f"error: --plot={name!r}: ") and needle in err, err
    assert script.read_bytes() == before


def test_plan_refuses_its_target_and_a_file_as_out_before_planning(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    err = one_line_error(["plan", *LLAMA, "--out", str(file)])
    assert err.startswith(f"error: --out={str(file)!r}: is a file; give a folder"), err
    assert file.read_text() == "keep me"
    err = one_line_error(["plan", *LLAMA, "--out", str(tmp_path / "p"), "--target", "nosuch"])
    assert err.startswith("error: --target='nosuch': allowed megatron,"), err
    assert not (tmp_path / "p").exists()
