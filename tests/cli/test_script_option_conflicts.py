"""An option that contradicts a script value it leaves in place names both (specs.script_cli.script_conflicts):
the errors named fields the user never gave ("recompute_layers=1 needs --recompute full", "layers_per_stage
has 4 entries but pp=2")."""

from __future__ import annotations

from pathlib import Path

from conftest import SCRIPTS
from test_bad_input import one_line_error, runner

from autopar.cli import app


def _script(tmp_path: Path, old: str, new: str) -> str:
    path = tmp_path / "job.sh"  # tp 2, pp 4, full recompute
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("--bf16\n", "--bf16 --vocab-size 32000\n")
    assert old in text
    path.write_text(text.replace(old, new))
    return str(path)


def test_recompute_option_against_the_scripts_block_count(tmp_path):
    script = _script(tmp_path, "--recompute-method uniform", "--recompute-method block")
    err = one_line_error(["estimate", "--script", script, "--device", "h100-80gb", "--recompute", "none"])
    assert err == ("error: --recompute=none conflicts with job.sh: --recompute-method block --recompute-num-layers 1 "
                   "(a count of fully recomputed layers); drop --recompute, or change the script's recompute flags")
    ok = runner.invoke(app, ["estimate", "--script", script, "--device", "h100-80gb", "--recompute", "full"])
    assert ok.exit_code == 0, ok.output


def test_pp_option_against_the_scripts_split(tmp_path):
    script = _script(tmp_path, "--num-layers 32 ", "--num-layers 32 --decoder-first-pipeline-num-layers 5 ")
    err = one_line_error(["estimate", "--script", script, "--device", "h100-80gb", "--pp", "2"])
    assert err == ("error: --pp=2 conflicts with job.sh: --decoder-first-pipeline-num-layers 5 (a split over the "
                   "script's --pipeline-model-parallel-size 4); give --layers-per-stage (or --pipeline-layout) for "
                   "pp=2, or drop --pp")
    ok = runner.invoke(app, ["estimate", "--script", script, "--device", "h100-80gb", "--pp", "2",
                             "--layers-per-stage", "16,16"])
    assert ok.exit_code == 0, ok.output
