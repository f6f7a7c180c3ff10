"""autopar verify through a real one-node Slurm (slurmctld + slurmd + munged started here from a
config in a temp folder); skipped with the reason where Slurm is not installed or does not start
(``apt-get install -y slurm-wlm munge`` provides it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from autopar.verify.jobs import Job
from autopar.verify.launch import SlurmOptions
from autopar.verify.run import run_jobs
from conftest import TESTS_DATA

LOGS = TESTS_DATA / "logs"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(d: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=autopar", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        "CredType=cred/munge", f"AuthInfo=socket={d}/munge.sock", f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool", f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}", f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "ReturnToService=2", "MpiDefault=none", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        f"NodeName={host} CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """A one-node Slurm for this test; every daemon it starts is stopped by its pid afterwards."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing or os.geteuid() != 0 or not Path("/etc/munge/munge.key").exists():
        pytest.skip(f"no one-node Slurm here (missing: {', '.join(missing) or 'root or /etc/munge/munge.key'}; "
                    "apt-get install -y slurm-wlm munge)")
    d = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True)
    key = d / "munge.key"
    shutil.copy("/etc/munge/munge.key", key)
    key.chmod(0o600)
    (d / "slurm.conf").write_text(_conf(d, socket.gethostname().split(".")[0]))
    monkeypatch.setenv("SLURM_CONF", str(d / "slurm.conf"))
    pids: list[Path] = []
    try:
        subprocess.run(["munged", f"--socket={d}/munge.sock", f"--key-file={key}", f"--pid-file={d}/munged.pid",
                        f"--log-file={d}/munged.log", f"--seed-file={d}/seed", "-f"], check=True, timeout=30)
        pids.append(d / "munged.pid")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon], check=True, timeout=30)
            pids.append(d / f"{daemon}.pid")
        state = ""
        for _ in range(50):
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10).stdout
            if state.strip() == "idle":
                break
            time.sleep(0.2)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        _stop(pids)
        pytest.skip(f"one-node Slurm did not start ({err})")
    if state.strip() != "idle":
        _stop(pids)
        pytest.skip(f"one-node Slurm did not come up (node state {state.strip()!r})")
    try:
        yield d
    finally:
        _stop(pids)


def _stop(pid_files: list[Path]) -> None:
    """SIGTERM to each daemon this test started, by the pid its pid file holds."""
    for pid_file in reversed(pid_files):
        for _ in range(50):  # a daemon writes its pid file just after forking
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.1)
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_sbatch_runs_the_job_and_its_log_is_parsed(slurm, tmp_path):
    folder = tmp_path / "01-tp1-pp1-dp1-mbs1"
    folder.mkdir()
    job = Job(name=folder.name, rank=1, folder=str(folder), framework="megatron",
              argv=["bash", "-c", f'cat {LOGS / "megatron_memory_report.log"}; echo "rank node $NODE_RANK"'],
              env={"AUTOPAR_VERIFY_JOB": folder.name}, workdir=str(tmp_path), num_nodes=1, devices_per_node=1,
              seq_len=2048, global_batch_size=16, iters=20, layout={"tp": 1},
              predicted={"step_time_s": 0.7, "tokens_per_s": 40000.0, "peak_memory_bytes": 6e9})
    [result] = run_jobs([job], "slurm", time_limit_s=60, slurm=SlurmOptions(partition="debug", gpus_per_node=False))
    log = job.log_path.read_text()
    assert "rank node 0" in log  # srun ran the command with NODE_RANK=$SLURM_NODEID
    assert result.ok and result.step_time_s == pytest.approx(0.744), log
    assert "#SBATCH --partition=debug" in (folder / "job.sbatch").read_text()
