"""``autopar.cli.paths``: no command writes over one of its own inputs (paths compared with links
followed, files inside an output directory included), and an option given as an empty string is
refused instead of being taken as not given. Each refusal is one ``error:`` line, exit 2, and the
input file is byte for byte what it was."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from autopar.cli import app
from autopar.cli.validate import VALIDATE_FILES
from autopar.cli.paths import refuse_overwriting_inputs
from autopar.errors import AutoparError
from autopar.report.html import report_paths
from conftest import MEASUREMENTS, MODELS, SCRIPTS
from test_bad_input import LLAMA, one_line_error, runner

H100 = ["--device", "h100-80gb"]


@pytest.fixture(scope="module")
def search_result() -> str:
    result = runner.invoke(app, ["search", *LLAMA, "--top", "2", "--json"])
    assert result.exit_code == 0
    return result.stdout


@pytest.fixture
def inputs(tmp_path, monkeypatch, search_result):
    """A working directory holding every kind of input file: run.sh, c.json, r.json (a search
    result), d.yaml, m.svg (a config under a figure name), rep/result.json, o/rows.md (a CSV)."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(SCRIPTS / "pretrain_llama2_7b.sh", "run.sh")
    shutil.copy(MODELS / "llama3-8b.json", "c.json")
    shutil.copy(MODELS / "llama3-8b.json", "m.svg")
    (tmp_path / "rep").mkdir()
    shutil.copy(MODELS / "llama3-8b.json", "rep/result.json")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "rows.md").write_text("\n".join(MEASUREMENTS.read_text().splitlines()[:2]) + "\n")
    (tmp_path / "d.yaml").write_text("base: h100-80gb\n")
    (tmp_path / "r.json").write_text(search_result)
    return tmp_path


@pytest.mark.parametrize("args, needle", [
    (["export", "--format", "megatron", *H100, "--script", "run.sh", "--vocab-size", "32000", "--out", "run.sh"],
     "--out='run.sh': would overwrite the --script input;"),
    (["export", "--format", "megatron", "--from", "r.json", *LLAMA, "--out", "r.json"],
     "--out='r.json': would overwrite the --from input;"),
    (["export", "--format", "megatron", "--model", "c.json", *H100, "--out", "c.json"],
     "--out='c.json': would overwrite the --model input;"),
    (["export", "--format", "megatron", "-m", "llama3-8b", "--device-file", "d.yaml", "--out", "d.yaml"],
     "--out='d.yaml': would overwrite the --device-file input;"),
    (["export", "--format", "deepspeed", "--model", "rep/result.json", *H100, "--out", "rep/result.json"],
     "--out='rep/result.json': would overwrite the --model input;"),
    (["search", "--script", "run.sh", "--model", "c.json", *H100, "--write-script", "c.json"],
     "--write-script='c.json': would overwrite the --model input;"),
    (["search", "--script", "run.sh", "--model", "c.json", *H100, "--top", "2", "--write-script", "x.sh",
      "--device-file", "x.2.sh"], None),  # --top 2 writes x.sh and x.2.sh
    (["validate", "--csv", "o/rows.md", "--out", "o"], "--out='o': would write 'o/rows.md' over the --csv input;"),
    (["search", "--model", "rep/result.json", *H100, "--report", "rep"],
     "--report='rep': would write 'rep/result.json' over the --model input;"),
    (["balance", "--model", "m.svg", *H100, "--pp", "2", "--plot", "m.svg"],
     "--plot='m.svg': would overwrite the --model input;"),
    (["search", "--script", "run.sh", "-m", "llama3-8b", *H100, "--write-script", "rep/report.html", "--report", "rep"],
     "--report='rep': writes 'rep/report.html', which --write-script writes too"),
])
def test_an_output_that_is_an_input_is_refused_before_writing(inputs, args, needle):
    if needle is None:  # the second script of --top 2 is the device file
        (inputs / "x.2.sh").write_text("base: h100-80gb\n")
        needle = "--write-script='x.sh': would write 'x.2.sh' over the --device-file input;"
    before = {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()}
    assert needle in one_line_error(args)
    assert {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()} == before  # nothing written


@pytest.mark.parametrize("config, args, needle", [
    ("c.yaml", ["--config", "c.yaml", "export", "--format", "megatron", *LLAMA, "--out", "c.yaml"],
     "--out='c.yaml': would overwrite the --config input;"),
    ("c.yaml", ["export", "--config", "c.yaml", "--format", "torchtitan", *LLAMA, "--out", "c.yaml"],
     "--out='c.yaml': would overwrite the --config input;"),
    ("c.yaml", ["--config", "c.yaml", "search", "--script", "run.sh", *H100, "--write-script", "c.yaml"],
     "--write-script='c.yaml': would overwrite the --config input;"),
    ("rep/result.json", ["--config", "rep/result.json", "plan", *LLAMA, "--out", "rep"],
     "--out='rep': would write 'rep/result.json' over the --config input;"),
    ("rep/result.json", ["--config", "rep/result.json", "search", *LLAMA, "--report", "rep"],
     "--report='rep': would write 'rep/result.json' over the --config input;"),
    ("x.json", ["--config", "x.json", "export", "--format", "deepspeed", *LLAMA, "--out", "x.json"],
     "--out='x.json': would overwrite the --config input;"),
])
def test_an_output_over_the_config_file_is_refused(inputs, config, args, needle):
    """The --config file (on the group or on the command) is an input like --script: writing a
    launch script or result.json over it used to exit 0 and leave a bash script as the config."""
    section = args[args.index("--config") + 2] if args[0] == "--config" else args[0]
    (inputs / config).write_text(json.dumps({section: {"gbs": 64}}))
    before = {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()}
    assert needle in one_line_error(args)
    assert {p: p.read_bytes() for p in inputs.rglob("*") if p.is_file()} == before  # nothing written


def test_links_to_an_input_are_that_input(inputs):
    """A symlink named as the output is followed; a hard link is the same inode."""
    os.symlink("m.svg", "link.svg")
    err = one_line_error(["balance", "--model", "m.svg", *H100, "--pp", "2", "--plot", "link.svg"])
    assert "--plot='link.svg': would overwrite the --model input 'm.svg'" in err
    os.link("c.json", "hard.json")
    err = one_line_error(["export", "--format", "megatron", "--model", "c.json", *H100, "--out", "hard.json"])
    assert "--out='hard.json': would overwrite the --model input 'c.json'" in err
    os.symlink("rep", "replink")  # a link to the directory holding the input
    err = one_line_error(["search", "--model", "rep/result.json", *H100, "--report", "replink"])
    assert "would write 'replink/result.json' over the --model input 'rep/result.json'" in err
    assert json.loads((inputs / "m.svg").read_text())["model_type"] == "llama"


def test_outputs_beside_the_inputs_are_written(inputs):
    """Not an overwrite: a preset name as --model, an output directory holding an input it does not
    write, a --top family that misses the inputs."""
    result = runner.invoke(app, ["export", "--format", "megatron", *LLAMA, "--out", "llama3-8b"])
    assert result.exit_code == 0 and (inputs / "llama3-8b").read_text().startswith("#!/bin/bash")
    shutil.copy(inputs / "o" / "rows.md", inputs / "o" / "my.csv")
    result = runner.invoke(app, ["validate", "--csv", "o/my.csv", "--out", "o"])
    assert result.exit_code == 0, result.output


def test_the_output_names_checked_are_the_files_written(tmp_path):
    """``VALIDATE_FILES`` and ``report_paths`` name exactly what validate and --report write."""
    csv = tmp_path / "rows.csv"
    csv.write_text("\n".join(MEASUREMENTS.read_text().splitlines()[:2]) + "\n")
    assert runner.invoke(app, ["validate", "--csv", str(csv), "--out", str(tmp_path / "v")]).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == sorted(VALIDATE_FILES)
    assert runner.invoke(app, ["search", *LLAMA, "--top", "2", "--report", str(tmp_path / "r")]).exit_code == 0
    assert sorted((tmp_path / "r").iterdir()) == sorted(report_paths(tmp_path / "r"))


def test_refuse_overwriting_inputs_skips_what_is_not_given(tmp_path):
    (tmp_path / "a").write_text("x")
    refuse_overwriting_inputs({"--model": "llama3-8b", "--script": None}, {"--out": (None, [tmp_path / "a"])})
    a = str(tmp_path / "a")
    with pytest.raises(AutoparError, match="would overwrite the --script input; write the output somewhere else"):
        refuse_overwriting_inputs({"--script": a}, {"--out": (a, [tmp_path / "a"])})


@pytest.mark.parametrize("args", [
    ["export", "--format", "megatron", *LLAMA, "--from", ""],  # exported the default layout
    ["export", "--format", "megatron", *LLAMA, "--out", ""],  # printed to stdout
    ["export", "--format", "megatron", *LLAMA, "--script", ""],
    ["search", *LLAMA, "--script", "", "--write-script", "x.sh"],
    ["search", *LLAMA, "--write-script", ""],
    ["search", *LLAMA, "--report", ""],
    ["search", *LLAMA, "--profile-db", ""],
    ["estimate", "--model", "", *H100],
    ["estimate", *LLAMA, "--device-file", ""],
    ["estimate", *LLAMA, "--layers-per-stage", "", "--pp", "2"],  # was the default split
    ["balance", *LLAMA, "--pp", "2", "--plot", ""],
    ["balance", "--layers", ""],
    ["validate", "--csv", ""],
    ["validate", "--out", " "],
])
def test_an_empty_value_is_refused_not_taken_as_not_given(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    option = next(a for a, v in zip(args, args[1:]) if not v.strip())
    value = next(v for v in args if v.startswith("--") is False and not v.strip())
    err = one_line_error(args)
    assert err.startswith(f"error: {option}={value!r}: empty; give a value or leave {option} out"), err
    assert list(tmp_path.iterdir()) == []


def test_every_command_names_its_options_as_typed():
    """The empty-value check names the option the user typed, read from each command's typer
    declarations (``from_result`` is ``--from``), for every command and sub-command."""
    from autopar.cli.app import option_names
    from autopar.cli.commands import import_all
    from autopar.cli.profile import profile_app

    import_all()

    names = {c.callback.__name__: option_names(c.callback.__wrapped__)
             for a in (app, profile_app) for c in a.registered_commands}
    assert names["export"]["from_result"] == "--from" and names["export"]["fmt"] == "--format"
    assert names["validate"]["csv_path"] == "--csv" and names["search"]["vocab_pad"] == "--make-vocab-size-divisible-by"
    assert names["balance_command"]["flash_attention"] == "--flash-attention" and names["ops"]["db"] == "--db"
