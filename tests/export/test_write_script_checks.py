"""``search --write-script``: what it changed (flag: old -> new), the least predicted gain it
rewrites for (autopar's own step-time error on similar rows) and the ``--load`` checkpoint
warning (issue 14 item 5)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.export.rewrite import rewrite_with_changes
from autopar.export.rewrite_checks import (MIN_GAIN_PCT, Baseline, checkpoint_warning, default_min_gain_pct,
                                           gain_pct)
from autopar.problem import Problem
from autopar.specs import load_device, make_cluster
from autopar.specs.script import read_script, train_spec
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem

runner = CliRunner()
LLAMA = SCRIPTS / "pretrain_llama2_7b.sh"
MIXTRAL = SCRIPTS / "pretrain_mixtral_8x7b.sh"
LLAMA_OPTS = ["--script", str(LLAMA), "--vocab-size", "32000", "--device", "h100-80gb"]


def test_min_gain_constants_are_the_validation_mape():
    """MIN_GAIN_PCT restates the target-set step-time MAPE of ``autopar validate`` on the shipped
    CSV (to its one decimal): a change of the cost model's accuracy must update it."""
    from autopar.validate import DEFAULT_CSV
    from autopar.validate.measurements import read_rows
    from autopar.validate.report import TARGET_SETS, mape
    from autopar.validate.score import THROUGHPUT, score_rows

    results = score_rows(read_rows(DEFAULT_CSV))
    for name, member, *_ in TARGET_SETS:
        errors = [r.error_pct for r in results if member(r) and r.error_pct is not None and r.metric in THROUGHPUT]
        assert MIN_GAIN_PCT[name] == pytest.approx(mape(errors), abs=0.05), name


def test_default_threshold_by_problem():
    """A problem takes its validation set's error: dense bf16, dense fp8, and MoE whatever the precision."""
    assert default_min_gain_pct(make_problem("llama3-8b")) == MIN_GAIN_PCT["bf16/fp16 dense"]
    assert default_min_gain_pct(make_problem("llama3-8b", precision="fp8")) == MIN_GAIN_PCT["fp8 dense"]
    assert default_min_gain_pct(make_problem("mixtral-8x7b", precision="fp8")) == MIN_GAIN_PCT["MoE (any precision)"]
    assert len(set(MIN_GAIN_PCT.values())) == 3


def test_gain_is_relative_to_the_scripts_step_time():
    assert gain_pct(Baseline(None, 2.0), 1.5) == pytest.approx(25.0)
    assert gain_pct(Baseline(None, 2.0), 2.2) == pytest.approx(-10.0)
    assert gain_pct(Baseline(None, None, "does not fit"), 1.0) is None


def test_changes_list_every_flag_old_and_new():
    """The edits of test_script_rewrite's llama2 case (its diff), as flag: old -> new."""
    plan = read_script(LLAMA)
    p = Problem(plan.model_spec(32000), make_cluster(load_device("h100-80gb"), 4, 8), train_spec(plan))
    s = Strategy(dp=4, tp=4, pp=2, vpp=2, schedule="interleaved", zero=0, recompute="selective", mbs=2)
    _, changes = rewrite_with_changes(plan, p, s)
    assert sorted(changes) == sorted([
        ("--tensor-model-parallel-size (via TP=)", "2", "4"), ("--pipeline-model-parallel-size (via PP=)", "4", "2"),
        ("--sequence-parallel", "on", "(removed)"), ("--num-virtual-stages-per-pipeline-rank", "(absent)", "2"),
        ("--use-distributed-optimizer", "on", "(removed)"), ("--micro-batch-size", "1", "2"),
        ("--recompute-granularity", "full", "selective"), ("--recompute-method", "uniform", "(removed)"),
        ("--recompute-num-layers", "1", "(removed)"), ("--nnodes (via NNODES=)", "2", "4")])


def test_changes_list_the_max_connections_export_megatron_fsdp_refuses():
    """The llama2 script exports CUDA_DEVICE_MAX_CONNECTIONS=1; Megatron-FSDP (zero 2) asserts it
    is not 1, so the rewrite sets CUDA's default 8 and lists it with the flags it changed."""
    plan = read_script(LLAMA)
    p = Problem(plan.model_spec(32000), make_cluster(load_device("h100-80gb"), 2, 8), train_spec(plan))
    text, changes = rewrite_with_changes(plan, p, Strategy(dp=4, tp=2, pp=2, sp=True, zero=2, mbs=1))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8\n" in text
    assert ("CUDA_DEVICE_MAX_CONNECTIONS", "1", "8") in changes


def test_changes_list_the_max_connections_export_tp_needs(tmp_path):
    """Without the export, a tp 2 layout gets ``export CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron
    asserts it for tp > 1), listed as set from unset."""
    script = tmp_path / "noenv.sh"
    script.write_text(LLAMA.read_text().replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", ""))
    plan = read_script(script)
    p = Problem(plan.model_spec(32000), make_cluster(load_device("h100-80gb"), 2, 8), train_spec(plan))
    text, changes = rewrite_with_changes(plan, p, Strategy(dp=4, tp=2, pp=2, sp=True, zero=1, mbs=1))
    assert text.startswith("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    assert ("CUDA_DEVICE_MAX_CONNECTIONS", "(unset)", "1") in changes


def test_cli_prints_the_changes_and_warns_about_the_checkpoint(tmp_path):
    out = tmp_path / "new.sh"
    res = runner.invoke(app, ["search", *LLAMA_OPTS, "--top", "1", "--write-script", str(out), "--min-gain-pct", "1"])
    assert res.exit_code == 0, res.output
    err = res.stderr.splitlines()
    assert err[0].startswith(f"wrote {out} (#1, predicted ") and "% faster than the script's layout: " in err[0]
    assert re.search(r" s vs \d+\.\d{3} s per step, \d+\.\d% less time\):$", err[0])  # the gain's two step times
    new = read_script(out).layout
    for flag, key in (("--tensor-model-parallel-size (via TP=)", "tp"), ("--pipeline-model-parallel-size (via PP=)",
                                                                         "pp")):
        old = read_script(LLAMA).layout[key]
        assert (f"  {flag}: {old} -> {new[key]}" in err) == (old != new[key])
    warnings = [line for line in err if line.startswith("warning:")]
    moved = (new["tp"], new["pp"]) != (2, 4) or new["zero"] >= 2  # zero 2/3: --ckpt-format fsdp_dtensor
    assert len(warnings) == int(moved)
    assert all("--load ./model_weights/llama2-7b-tp2-pp4 holds a checkpoint" in w for w in warnings)


def test_cli_says_a_gain_below_the_threshold_writes_nothing_and_exits_0(tmp_path):
    """A gain below --min-gain-pct is an outcome of the search, not bad input (exit 2 is for bad
    input): the ranking is printed, one stderr line says why nothing was written, exit 0."""
    out = tmp_path / "new.sh"
    res = runner.invoke(app, ["search", "--script", str(MIXTRAL), "--device", "h100-80gb", "--top", "1",
                              "--write-script", str(out), "--min-gain-pct", "100"])
    err = res.stderr.strip().splitlines()
    assert res.exit_code == 0, res.output
    assert len(err) == 1 and err[0].startswith(f"not written: {out}: the best layout is predicted ")
    assert "faster than the script's own" in err[0]
    assert err[0].endswith("below --min-gain-pct 100; pretrain_mixtral_8x7b.sh is left as it is (pass a lower "
                           "--min-gain-pct to rewrite anyway)")
    assert "Best layouts" in res.stdout and not out.exists()


def test_a_script_layout_that_cannot_run_is_always_rewritten(tmp_path):
    """tp 2 x pp 4 of the llama2 script needs 8 devices; on 4 it cannot run, so any layout gains."""
    out = tmp_path / "new.sh"
    res = runner.invoke(app, ["search", *LLAMA_OPTS, "--nodes", "1", "--devices-per-node", "4", "--top", "1",
                              "--write-script", str(out), "--min-gain-pct", "100"])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(f"wrote {out} (#1, the script's own layout cannot run here (")


@pytest.mark.parametrize("args, needle", [
    (["--min-gain-pct", "5"], "--min-gain-pct=5 applies to --write-script only"),
    (["--min-gain-pct", "-1", "--write-script", "x.sh"], "--min-gain-pct=-1.0: must be a percentage in 0..100"),
])
def test_bad_min_gain_is_one_error_line(args, needle):
    res = runner.invoke(app, ["search", *LLAMA_OPTS, "--top", "1", *args])
    assert res.exit_code == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output


def _plan(tmp_path, text: str):
    path = tmp_path / "run.sh"
    path.write_text(text)
    return read_script(path)


def test_checkpoint_warning_per_format(tmp_path):
    base = LLAMA.read_text()
    plan = read_script(LLAMA)  # tp 2 pp 4, --load $CKPT_LOAD_DIR, default --ckpt-format torch_dist
    assert checkpoint_warning(plan, {"tp": 2, "pp": 4, "ep": 1}, "torch_dist") is None
    same_format = checkpoint_warning(plan, {"tp": 8, "pp": 4, "ep": 1}, "torch_dist")
    assert "(tp 2 -> 8 in the rewritten script)" in same_format and "dist-checkpointing reshards" in same_format
    fsdp = checkpoint_warning(plan, {"tp": 2, "pp": 4, "ep": 1}, "fsdp_dtensor")
    assert "--ckpt-format torch_dist -> fsdp_dtensor" in fsdp and "convert-torch-dist-to-fsdp-dtensor" in fsdp
    legacy = _plan(tmp_path, base.replace("--bf16\n", "--bf16 \\\n    --ckpt-format torch\n"))
    assert "tools/checkpoint/convert.py" in checkpoint_warning(legacy, {"tp": 1, "pp": 4, "ep": 1}, "torch")
    no_load = _plan(tmp_path, base.replace("    --load $CKPT_LOAD_DIR \\\n", ""))
    assert checkpoint_warning(no_load, {"tp": 8, "pp": 1, "ep": 1}, "fsdp_dtensor") is None


def test_min_gain_help_is_built_from_the_constant():
    """The help said 4.5 / 5.7 / 16.3 while MIN_GAIN_PCT held 4.4 / 5.9 / 16.3 (a new user's report)."""
    from autopar.cli.search_options import MIN_GAIN_HELP

    for kind, pct in MIN_GAIN_PCT.items():
        assert f"{pct:g} {kind}" in MIN_GAIN_HELP
    stale = {"4.5", "5.7"} - {f"{pct:g}" for pct in MIN_GAIN_PCT.values()}  # the report's figures, unless current
    assert not any(figure in MIN_GAIN_HELP for figure in stale)


def test_refusal_says_which_figure_is_the_threshold_and_which_the_band():
    """Mixtral on H100: the default threshold is the MAPE on every MoE row (16.3), the table's ≈1
    band the MAPE on the MoE bf16 Hopper rows (problem_certainty): the refusal names both."""
    from autopar.export.rewrite import _band_aside
    from autopar.report.ties import problem_certainty

    p = make_problem("mixtral-8x7b", nodes=4)
    step = problem_certainty(p).step_time
    assert step.band_pct != MIN_GAIN_PCT["MoE (any precision)"]
    aside = _band_aside(p, MIN_GAIN_PCT["MoE (any precision)"])
    assert aside == (f" (the table's ±{step.band_pct:g}% band is the MAPE on the {len(step.rows)} {step.group}, "
                     "the rows most like this problem)")
    assert _band_aside(p, step.band_pct) == ""  # one figure: nothing to tell apart
