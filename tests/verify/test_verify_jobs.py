"""autopar verify's job writer: Megatron short-run scripts and torchtitan TOMLs; the user's files untouched."""

from __future__ import annotations

import json
import tomllib

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.search.grid import for_target
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from autopar.verify.jobs import Job, write_jobs
from conftest import SCRIPTS, make_problem

SCRIPT = SCRIPTS / "pretrain_llama2_7b.sh"


def _script_problem():
    from autopar.cli.inputs import problem_from_options

    return problem_from_options(None, "h100-80gb", None, None, None, None, None, None, None, None, None, str(SCRIPT), 32000)


def test_megatron_job_has_the_layout_and_the_short_run_flags(tmp_path):
    before = SCRIPT.read_text()
    p = _script_problem()  # 2 nodes x 8, gbs 256, seq 4096
    s = Strategy(dp=4, tp=4, pp=1, mbs=1, sp=True, zero=1)
    [job] = write_jobs(p, [(1, estimate(p, s))], tmp_path / "v", "megatron", script=SCRIPT, iters=7)
    text = (tmp_path / "v" / job.name / "job.sh").read_text()
    assert SCRIPT.read_text() == before
    back = read_script(tmp_path / "job.sh", text)
    got = back.strategy(16, 32)
    assert (got.tp, got.pp, got.dp) == (4, 1, 4)
    a = back.args
    assert a.integer("--train-iters", 0) == 7 and a.integer("--log-interval", 0) == 1 and a.integer("--eval-iters", 9) == 0
    assert a.has("--mock-data") and a.has("--log-throughput")
    for gone in ("--save", "--load", "--data-path", "--save-interval"):
        assert not a.has(gone), gone
    assert f"--tensorboard-dir {job.folder}/tensorboard" in text
    doc = json.loads((tmp_path / "v" / job.name / "job.json").read_text())
    assert doc["argv"] == ["bash", f"{job.folder}/job.sh"] and doc["layout"]["tp"] == 4
    assert Job.load(job.folder).predicted["step_time_s"] == pytest.approx(estimate(p, s).step_time_s)


def test_megatron_job_keeps_the_scripts_data_when_asked(tmp_path):
    p = _script_problem()
    s = Strategy(dp=2, tp=2, pp=4, mbs=1, sp=True, zero=1)
    [job] = write_jobs(p, [(2, estimate(p, s))], tmp_path, "megatron", script=SCRIPT, mock_data=False)
    a = read_script(SCRIPT, (tmp_path / job.name / "job.sh").read_text()).args
    assert a.has("--data-path") and not a.has("--mock-data") and job.name.startswith("02-tp2-pp4")


def test_torchtitan_job_merges_the_users_toml(tmp_path):
    base = tmp_path / "llama3_8b.toml"
    base.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nsteps = 1000\nseq_len = 1024\n'
                    '[checkpoint]\nenable = true\nfolder = "ckpt"\n')
    p = for_target(make_problem("llama3-8b", gbs=16, seq=4096), "torchtitan")
    s = Strategy(dp=4, tp=2, pp=1, mbs=2, sp=True, zero=3)
    [job] = write_jobs(p, [(1, estimate(p, s))], tmp_path / "v", "torchtitan", toml=base, iters=5)
    doc = tomllib.loads((tmp_path / "v" / job.name / "job.toml").read_text())
    assert (doc["model"]["name"], doc["model"]["flavor"]) == ("llama3", "8B")
    assert doc["training"]["steps"] == 5 and doc["training"]["seq_len"] == 4096 and doc["training"]["dataset"] == "c4_test"
    assert doc["parallelism"]["tensor_parallel_degree"] == 2 and doc["parallelism"]["data_parallel_shard_degree"] == 4
    assert doc["checkpoint"]["enable"] is False and doc["job"]["dump_folder"] == job.folder
    assert job.argv[-5:] == ["torchtitan.train", "--job.config_file", f"{job.folder}/job.toml", "--training.steps", "5"]


def test_bad_job_options(tmp_path):
    p = _script_problem()
    e = estimate(p, Strategy(dp=4, tp=4, pp=1, mbs=1, sp=True, zero=1))
    with pytest.raises(AutoparError, match=r"--iters=2: allowed 3\.\.1000"):
        write_jobs(p, [(1, e)], tmp_path, "megatron", script=SCRIPT, iters=2)
    with pytest.raises(AutoparError, match="needs --toml"):
        write_jobs(p, [(1, e)], tmp_path, "torchtitan")
    write_jobs(p, [(1, e)], tmp_path, "megatron", script=SCRIPT)
    with pytest.raises(AutoparError, match="exists"):
        write_jobs(p, [(1, e)], tmp_path, "megatron", script=SCRIPT)


def test_cli_verify_writes_the_top_jobs(tmp_path):
    out = tmp_path / "v"
    res = CliRunner().invoke(app, ["verify", "--script", str(SCRIPT), "--device", "h100-80gb", "--vocab-size", "32000", "--top", "2",
                                   "--out", str(out), "--launcher", "none"])
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*/job.sh"))) == 2
    res = CliRunner().invoke(app, ["verify", "--script", str(SCRIPT), "--launcher", "pbs", "--out", str(out)])
    assert res.exit_code == 2 and "--launcher='pbs': allowed local, slurm, none" in res.output


def test_cli_verify_from_a_result_takes_its_problem_and_checks_the_workdir(tmp_path):
    """``--from`` needs no device or cluster options (the result carries its problem); a
    ``--workdir`` that does not exist is refused before any job folder is written."""
    res = CliRunner().invoke(app, ["search", "--script", str(SCRIPT), "--device", "h100-80gb", "--vocab-size", "32000",
                                   "--top", "3", "--json"])
    assert res.exit_code == 0, res.output
    result = tmp_path / "result.json"
    result.write_text(res.stdout)
    out = tmp_path / "v"
    common = ["verify", "--script", str(SCRIPT), "--vocab-size", "32000", "--from", str(result), "--top", "2",
              "--launcher", "none"]
    base = [*common, "--out", str(out)]
    res = CliRunner().invoke(app, [*base, "--workdir", str(tmp_path / "no-such-checkout")])
    assert res.exit_code == 2 and "--workdir=" in res.output and "not an existing folder" in res.output
    assert not out.exists()
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 0, res.output
    assert len(list(out.glob("*/job.sh"))) == 2
    res = CliRunner().invoke(app, [*common, "--device", "a100-80gb", "--out", str(tmp_path / "v2")])
    assert res.exit_code == 2 and "--device" in res.output


def test_search_verify_needs_a_script():
    res = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "16", "--top", "1",
                                   "--verify", "1"])
    assert res.exit_code == 2 and "--verify needs --script" in res.output


def test_small_run_job_has_fewer_layers_and_devices(tmp_path):
    from autopar.verify.shrink import shrink

    p = _script_problem()  # 32 layers on 2 x 8
    small = shrink(p, Strategy(dp=2, tp=2, pp=4, mbs=1, sp=True, zero=1), 4)  # pp 2, dp 1, 8 layers per stage
    [job] = write_jobs(small.problem, [(1, estimate(small.problem, small.strategy))], tmp_path, "megatron",
                       script=SCRIPT, stands_for={1: {"layout": "tp2 pp4 dp2", "note": ""}})
    back = read_script(SCRIPT, (tmp_path / job.name / "job.sh").read_text())
    assert back.model_fields["num_layers"] == 16 and (back.num_nodes, back.devices_per_node) == (1, 4)
    got = back.strategy(4, 16)
    assert (got.tp, got.pp, got.dp) == (2, 2, 1) and back.train_fields["global_batch_size"] == 128
