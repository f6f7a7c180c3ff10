"""``autopar plan`` (issue 19 item 5, Tinker's one-shot mode): profiling skipped or refused with the
reason on a machine without the planned GPU, the search, and one folder with the search JSON and
every ranked layout in the target's form, equal to what ``autopar export --from`` writes; its
``--config`` section."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS
from json_schema_support import assert_valid
from typer.testing import CliRunner

from autopar.cli import app
from autopar.oneshot import no_accelerator_reason, plan_paths

runner = CliRunner()
PROBLEM = ["--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096"]
NO_GPU = no_accelerator_reason()
needs_no_gpu = pytest.mark.skipif(NO_GPU is None, reason="this machine has a GPU: plan would profile")


@needs_no_gpu
@pytest.mark.parametrize("target, names", [
    ("galvatron", ["rank1.json", "rank2.json"]),
    ("torchtitan", ["rank1.toml", "rank2.toml"]),
    ("deepspeed", ["rank1/ds_config.json", "rank1/megatron_deepspeed_args.sh", "rank2/ds_config.json",
                   "rank2/megatron_deepspeed_args.sh"]),
])
def test_plan_writes_the_search_and_each_layout(tmp_path, target, names):
    out = tmp_path / "plan"
    result = runner.invoke(app, ["plan", *PROBLEM, "--target", target, "--top", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"profiling skipped: {NO_GPU}; planning with the analytic model" in " ".join(result.output.split())
    doc = json.loads((out / "result.json").read_text())
    assert doc["target"] == target and len(doc["layouts"]) == 2
    assert_valid("search", doc)  # the document `search --json` prints
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(["result.json", *names])
    if target == "deepspeed":
        return
    for rank in (1, 2):  # each file is what `autopar export --from result.json --rank N` writes
        export = runner.invoke(app, ["export", "--format", target, "--from", str(out / "result.json"), "--rank",
                                     str(rank), *PROBLEM])
        assert export.exit_code == 0, export.output
        assert (out / f"rank{rank}{'.json' if target == 'galvatron' else '.toml'}").read_text() == export.stdout


@needs_no_gpu
def test_plan_profile_on_refuses_without_a_gpu(tmp_path):
    result = runner.invoke(app, ["plan", *PROBLEM, "--out", str(tmp_path / "p"), "--profile", "on"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: --profile on: cannot profile here: {NO_GPU}"]
    assert not (tmp_path / "p").exists()


def test_plan_profile_mode_checked(tmp_path):
    result = runner.invoke(app, ["plan", *PROBLEM, "--out", str(tmp_path / "p"), "--profile", "maybe"])
    assert result.exit_code == 2 and "--profile='maybe': allowed auto, on, off" in result.output


def test_plan_refuses_to_overwrite_its_input(tmp_path):
    """A folder whose rank1.json is the --model config would overwrite the input."""
    out = tmp_path / "p"
    out.mkdir()
    cfg = out / "rank1.json"
    cfg.write_text((MODELS / "llama3-8b.json").read_text())
    result = runner.invoke(app, ["plan", "--model", str(cfg), "--device", "h100-80gb", "--target", "galvatron",
                                 "--out", str(out)])
    assert result.exit_code == 2
    assert result.output == (f"error: --out={str(out)!r}: would write {str(cfg)!r} over the --model input; write the "
                             "output somewhere else\n")


def test_plan_paths_name_every_file(tmp_path):
    assert [p.name for p in plan_paths(tmp_path, "sapp", 2)] == ["result.json", "profile.db", "rank1.json",
                                                                  "rank2.json"]


@needs_no_gpu
def test_plan_reads_its_config_section(tmp_path):
    out = tmp_path / "from-config"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"plan:\n  model: llama3-8b\n  device: h100-80gb\n  gbs: 64\n  target: megatron\n  top: 1\n"
                   f"  out: {json.dumps(str(out))}\n  profile: 'off'\n")
    result = runner.invoke(app, ["--config", str(cfg), "plan"])
    assert result.exit_code == 0, result.output
    assert "profiling skipped: --profile off" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["rank1.sh", "result.json"]
    assert json.loads((out / "result.json").read_text())["target"] == "megatron"
