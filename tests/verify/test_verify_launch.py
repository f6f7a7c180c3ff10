"""autopar verify's launchers: a local process group killed at its limit, real torchrun jobs on CPU, Slurm lines."""

from __future__ import annotations

import os
import sys
import time

import pytest

from autopar.verify.jobs import Job
from autopar.verify.launch import SlurmOptions, run_local, sbatch_argv, sbatch_script, slurm_time
from autopar.verify.run import run_jobs


def _job(tmp_path, argv, nodes=1, per_node=1, name="01-tp1-pp1-dp1-mbs1") -> Job:
    folder = tmp_path / name
    folder.mkdir()
    return Job(name=name, rank=1, folder=str(folder), framework="megatron", argv=argv, env={"AUTOPAR_VERIFY_JOB": name},
               workdir=str(tmp_path), num_nodes=nodes, devices_per_node=per_node, seq_len=128, global_batch_size=8,
               iters=5, layout={"tp": 1}, predicted={"step_time_s": 1.0, "tokens_per_s": 1024.0,
                                                     "peak_memory_bytes": 1e9})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
        return f.read().split()[2] != "Z"


def _pids(path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_time_limit_kills_the_whole_process_group(tmp_path):
    job = _job(tmp_path, ["bash", "-c", "sleep 300 & echo $! >> pids; (sleep 300 & echo $! >> pids; wait) & wait"])
    [result] = run_jobs([job], "local", time_limit_s=3.0)
    pids = _pids(tmp_path / "pids")
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    assert result.failure == "timeout"
    assert (tmp_path / job.name / "result.json").exists()


def test_children_left_by_a_finished_job_are_killed(tmp_path):
    job = _job(tmp_path, ["bash", "-c", "(sleep 300 & echo $! >> pids) ; echo done"])
    outcome = run_local(job, time_limit_s=30)
    assert outcome.exit_code == 0 and not outcome.timed_out
    [pid] = _pids(tmp_path / "pids")
    time.sleep(0.2)
    assert not _alive(pid)


def test_a_failing_job_is_a_result(tmp_path):
    job = _job(tmp_path, ["bash", "-c", "echo 'AssertionError: num_layers must be divisible by pp' >&2; exit 1"])
    [result] = run_jobs([job], "local", time_limit_s=30)
    assert result.failure == "assertion" and "divisible by pp" in result.cause


SLEEPER = """import os, time
open(os.environ["PIDS"], "a").write(f"{os.getpid()}\\n")  # before any import that takes time
time.sleep(300)
"""


@pytest.mark.torchrun
def test_torchrun_ranks_die_at_the_time_limit(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("CPU torch not installed (pip install torch==2.13.0)")
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    job = _job(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "sleeper.py"],
               per_node=2)
    job.env["PIDS"] = str(tmp_path / "pids")
    outcome = run_local(job, time_limit_s=6, grace_s=2)
    pids = _pids(tmp_path / "pids")
    assert outcome.timed_out and len(pids) == 2, job.log_path.read_text()[-2000:]
    assert not any(_alive(pid) for pid in pids)


def test_sbatch_script_lines(tmp_path):
    job = _job(tmp_path, ["bash", "/jobs/01/job.sh"], nodes=2, per_node=8)
    opts = SlurmOptions(account="proj42", partition="gpu", container_image="nvcr.io#nvidia/pytorch:25.01-py3",
                        container_mounts="/data:/data", extra=("--qos=high",))
    text = sbatch_script(job, 3601, opts)
    lines = text.splitlines()
    assert lines[:8] == ["#!/bin/bash", f"#SBATCH --job-name=autopar-verify-{job.name}", "#SBATCH --nodes=2",
                         "#SBATCH --ntasks-per-node=1", "#SBATCH --time=01:01:00", f"#SBATCH --output={job.log_path}",
                         f"#SBATCH --chdir={tmp_path}", "#SBATCH --gpus-per-node=8"]
    assert "#SBATCH --account=proj42" in lines and "#SBATCH --partition=gpu" in lines and "#SBATCH --qos=high" in lines
    assert lines[-1] == ("srun --kill-on-bad-exit=1 --ntasks=2 --ntasks-per-node=1 "
                         "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3' --container-mounts=/data:/data "
                         f"--container-workdir={tmp_path} bash -c "
                         "'export NODE_RANK=$SLURM_NODEID; exec bash /jobs/01/job.sh'")
    assert 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in lines
    assert sbatch_argv(tmp_path / "job.sbatch") == ["sbatch", "--wait", "--parsable", str(tmp_path / "job.sbatch")]
    assert slurm_time(59) == "00:01:00" and slurm_time(2 * 86400 + 61) == "2-00:02:00"
