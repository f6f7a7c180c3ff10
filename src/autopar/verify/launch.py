"""Run a job: ``torchrun`` on this node (a process group, killed on time-out) or Slurm.

Local: the job's command runs in its own session (``start_new_session``: a new process group
holding torchrun and every rank it starts); at the time limit, or when the caller is interrupted,
the whole group gets SIGTERM, then SIGKILL after :data:`GRACE_S`; after a normal exit the group is
killed too, so no rank outlives its job.

Slurm: the cluster's scheduler runs the job (:func:`sbatch_script`): ``#SBATCH --time`` is the
limit Slurm enforces, ``srun`` starts one task per node (each runs the job's command with
``NODE_RANK=$SLURM_NODEID`` and ``MASTER_ADDR`` the first node, the variables Megatron-LM's
example scripts read), with the user's account, partition, container (pyxis ``--container-image``)
and extra options. :func:`run_slurm` submits with ``sbatch --wait --parsable`` and cancels the
job (``scancel``) if it outlives its limit plus :data:`SLURM_MARGIN_S` or the caller is
interrupted.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from autopar.errors import AutoparError
from autopar.verify.jobs import Job

GRACE_S = 10.0  # SIGTERM -> SIGKILL
SLURM_MARGIN_S = 300.0  # queueing and start-up beyond --time before autopar cancels the job
_SLURM_TIME_LIMIT = re.compile(r"CANCELLED AT \S+ DUE TO TIME LIMIT")


@dataclass(frozen=True)
class Outcome:
    """How a job ended: ``exit_code`` (None when killed at the limit), ``timed_out``, wall seconds."""

    exit_code: int | None
    timed_out: bool
    wall_s: float
    slurm_job_id: str | None = None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _live_members(pgid: int) -> bool | None:
    """Whether group ``pgid`` has a member that is not a zombie (``/proc/PID/stat``: state is field
    3, the process group field 5); None without ``/proc``."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process of group ``pgid`` runs any more (SIGKILL is delivered
    asynchronously; zombies waiting for their reaper do not count), at most ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        live = _live_members(pgid)
        if live is None:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        elif not live:
            return True
        time.sleep(0.02)
    return False


def run_local(job: Job, time_limit_s: float, grace_s: float = GRACE_S) -> Outcome:
    """Run ``job`` on this node, its output (stdout and stderr) into ``job.log_path``.

    Raises:
        AutoparError: the command cannot start (e.g. ``bash`` or the Python missing).
    """
    start = time.monotonic()
    env = {**os.environ, **job.env}
    with open(job.log_path, "wb") as log:
        try:
            proc = subprocess.Popen(job.argv, cwd=job.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as err:
            raise AutoparError(f"job {job.name}: cannot start {job.argv[0]!r} ({err.strerror})") from None
        timed_out = False
        try:
            proc.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
        except BaseException:  # Ctrl-C: take the ranks down with us
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            _kill_group(proc.pid, signal.SIGKILL)  # ranks that outlive torchrun
            _group_gone(proc.pid, grace_s)
    return Outcome(None if timed_out else proc.returncode, timed_out, time.monotonic() - start)


@dataclass(frozen=True)
class SlurmOptions:
    """The user's Slurm settings; None leaves the cluster's default."""

    account: str | None = None
    partition: str | None = None
    container_image: str | None = None
    container_mounts: str | None = None
    gpus_per_node: bool = True
    extra: tuple[str, ...] = field(default_factory=tuple)


_OWN_SBATCH = {  # what sbatch_script writes itself -> what to give instead of --sbatch-option
    **dict.fromkeys(("job-name", "nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "output", "error",
                     "chdir"), "autopar writes it from the job (the layout's nodes and devices per node, its log.txt "
                    "and --workdir); drop it"),
    "time": "autopar writes it from --time-limit-s (and cancels the job 5 minutes after); give --time-limit-s "
            "SECONDS instead",
    "account": "give --account instead",
    "partition": "give --partition instead",
}
_SBATCH_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(?:[= ](\S.*))?")


def check_sbatch_options(extra: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The user's ``--sbatch-option`` values, checked before any job is written.

    Each must be one long sbatch option, ``--name``, ``--name=value`` or ``--name value``, on
    one line (it becomes one ``#SBATCH`` line of :func:`sbatch_script`), and not one that
    script writes itself: Slurm takes the last of two ``#SBATCH --nodes`` lines, so a user's
    ``--nodes=4`` after autopar's would silently run another layout. Names are compared with
    the abbreviations sbatch's ``getopt_long`` accepts (``--nod=4`` is ``--nodes``).

    Raises:
        AutoparError: ``--sbatch-option='foo': not one sbatch option; ...`` or
            ``--sbatch-option='--time=1:00:00': sbatch --time: autopar writes it from --time-limit-s ...``.
    """
    for value in extra:
        match = _SBATCH_OPTION.fullmatch(value)
        if match is None or any(c in value for c in "\n\r\0"):
            raise AutoparError(f"--sbatch-option={value!r}: not one sbatch option; give one long option per "
                               "--sbatch-option, as --name, --name=value or --name value (e.g. --qos=high)")
        name = match.group(1)
        own = next((o for o in _OWN_SBATCH if o == name or (len(name) >= 2 and o.startswith(name))), None)
        if own is not None:
            raise AutoparError(f"--sbatch-option={value!r}: sbatch --{own}: {_OWN_SBATCH[own]}")
    return tuple(extra)


def slurm_time(seconds: float) -> str:
    """Slurm's ``--time`` format ``D-HH:MM:SS``/``HH:MM:SS``, rounded up to a whole minute."""
    minutes = max(1, -(-int(seconds) // 60))
    d, rest = divmod(minutes, 24 * 60)
    h, m = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:00" if d else f"{h:02d}:{m:02d}:00"


def sbatch_script(job: Job, time_limit_s: float, opts: SlurmOptions) -> str:
    """The batch script of ``job`` (see the module docstring)."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name=autopar-verify-{job.name}", f"#SBATCH --nodes={job.num_nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --time={slurm_time(time_limit_s)}",
             f"#SBATCH --output={job.log_path}", f"#SBATCH --chdir={job.workdir}"]
    if opts.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.devices_per_node}")
    lines += [f"#SBATCH --account={opts.account}"] * bool(opts.account)
    lines += [f"#SBATCH --partition={opts.partition}"] * bool(opts.partition)
    lines += [f"#SBATCH {x}" for x in opts.extra]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in job.env.items()]
    lines += ['export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))", f"export NNODES={job.num_nodes}"]
    srun = ["srun", "--kill-on-bad-exit=1", f"--ntasks={job.num_nodes}", "--ntasks-per-node=1"]
    if opts.container_image:
        srun.append(f"--container-image={opts.container_image}")
        srun += [f"--container-mounts={opts.container_mounts}"] * bool(opts.container_mounts)
        srun.append(f"--container-workdir={job.workdir}")
    command = "export NODE_RANK=$SLURM_NODEID; exec " + shlex.join(job.argv)
    lines.append(shlex.join(srun) + " bash -c " + shlex.quote(command))
    return "\n".join(lines) + "\n"


def sbatch_argv(script: Path) -> list[str]:
    """``sbatch --wait --parsable SCRIPT``: prints the job id, returns with the job's exit code."""
    return ["sbatch", "--wait", "--parsable", str(script)]


def run_slurm(job: Job, time_limit_s: float, opts: SlurmOptions, margin_s: float = SLURM_MARGIN_S) -> Outcome:
    """Submit ``job`` to Slurm and wait for it (see the module docstring).

    Raises:
        AutoparError: ``sbatch`` is not installed or refuses the job (its message is named).
    """
    script = Path(job.folder) / "job.sbatch"
    script.write_text(sbatch_script(job, time_limit_s, opts))
    start = time.monotonic()
    try:
        proc = subprocess.Popen(sbatch_argv(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as err:
        raise AutoparError(f"--launcher slurm: cannot run sbatch ({err.strerror}); is Slurm installed here?") from None
    job_id = (proc.stdout.readline() if proc.stdout else "").strip().split(";")[0] or None
    timed_out = False
    try:
        proc.wait(timeout=time_limit_s + margin_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:
        _scancel(job_id)
        raise
    if timed_out:
        _scancel(job_id)
        proc.wait()
    if job_id is None:
        raise AutoparError(f"--launcher slurm: sbatch refused job {job.name}: "
                           f"{(proc.stderr.read() if proc.stderr else '').strip()[:300]}")
    log = job.log_path.read_text(errors="replace") if job.log_path.exists() else ""
    timed_out = timed_out or bool(_SLURM_TIME_LIMIT.search(log))
    return Outcome(None if timed_out else proc.returncode, timed_out, time.monotonic() - start, job_id)


def _scancel(job_id: str | None) -> None:
    if job_id:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
