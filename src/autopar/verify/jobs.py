"""One short-run job per layout, each in its own work folder; the user's files are only read.

Megatron-LM / MindSpeed-LLM: the user's ``--script`` rewritten with the layout
(:func:`autopar.export.rewrite.rewrite_script`), then with the short-run flags of
:func:`short_run_flags` (:func:`autopar.export.rewrite.edit_flags`). torchtitan: the user's TOML
merged with the layout's sections (:func:`autopar.export.torchtitan.config`) and the short-run
fields of :func:`titan_short_run`, launched as ``torchrun ... -m torchtitan.train --job.config_file
job.toml --training.steps N`` (torchtitan's ``run_train.sh``).

Each job folder holds ``job.json`` (command, environment, layout, prediction), the job file
(``job.sh`` or ``job.toml``) and, once run, ``log.txt``.
"""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError
from autopar.estimate import Estimate
from autopar.problem import Problem

JOB_FILE = "job.json"
LOG_FILE = "log.txt"
FRAMEWORKS = ("megatron", "mindspeed", "torchtitan")
MAX_ITERS = 1000  # a short run; more is a training run, not a check


@dataclass
class Job:
    """One short run. ``argv`` runs in ``workdir`` with ``env`` added to the caller's environment.

    ``predicted``: the model's ``step_time_s``, ``tokens_per_s`` (whole job) and
    ``peak_memory_bytes`` for the layout as run; ``layout``: the strategy as the search JSON
    writes it; ``stands_for``: the full plan a small run reproduces (:mod:`autopar.verify.shrink`),
    or None.
    """

    name: str
    rank: int
    folder: str
    framework: str
    argv: list[str]
    env: dict[str, str]
    workdir: str
    num_nodes: int
    devices_per_node: int
    seq_len: int
    global_batch_size: int
    iters: int
    layout: dict[str, Any]
    predicted: dict[str, float]
    stands_for: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def log_path(self) -> Path:
        return Path(self.folder) / LOG_FILE

    def save(self) -> Path:
        path = Path(self.folder) / JOB_FILE
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> "Job":
        """The job written into ``folder``.

        Raises:
            AutoparError: no readable ``job.json`` there.
        """
        path = Path(folder) / JOB_FILE
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise AutoparError(f"{str(path)!r}: not a job autopar verify wrote ({err})") from None


def predicted(e: Estimate, p: Problem) -> dict[str, float]:
    """The prediction a job's measurement is compared with (whole-job tokens/s)."""
    return {"step_time_s": e.step_time_s, "tokens_per_s": e.tokens_per_s_per_device * p.world_size,
            "peak_memory_bytes": e.peak_memory_bytes}


def short_run_flags(iters: int, folder: Path, mock_data: bool) -> dict[str, str | bool | None]:
    """Megatron-LM flags of a short run (``megatron/training/arguments.py`` names), for
    :func:`autopar.export.rewrite.edit_flags`: ``iters`` iterations logged one by one with the
    throughput (``--log-throughput``; the memory report of ``report_memory`` follows the first
    log line without a flag), no checkpoint load or save, no evaluation, no exit/W&B/sample-based
    schedule flags (``--lr-*-samples`` are refused with ``--train-iters``), warm-up of the learning
    rate off (``--lr-warmup-iters`` must stay below the decay iterations), TensorBoard and the
    data index cache in the job folder, and ``--mock-data`` instead of the user's data paths
    when ``mock_data``."""
    flags: dict[str, str | bool | None] = {
        "--train-iters": str(iters), "--log-interval": "1", "--log-throughput": True,
        "--save": None, "--load": None, "--save-interval": None, "--pretrained-checkpoint": None,
        "--eval-iters": "0", "--eval-interval": str(iters + 1), "--exit-interval": None,
        "--exit-duration-in-mins": None, "--train-samples": None, "--lr-decay-samples": None,
        "--lr-warmup-samples": None, "--lr-wsd-decay-samples": None, "--lr-warmup-iters": "0",
        "--wandb-project": None, "--wandb-exp-name": None, "--wandb-save-dir": None,
        "--tensorboard-dir": str(folder / "tensorboard"), "--data-cache-path": str(folder / "data_cache"),
    }
    if mock_data:
        flags.update({"--data-path": None, "--train-data-path": None, "--valid-data-path": None,
                      "--test-data-path": None, "--mock-data": True})
    return flags


def megatron_job_script(script: str | Path, p: Problem, e: Estimate, iters: int, folder: Path,
                        mock_data: bool, small: bool = False) -> str:
    """The user's launch script with layout ``e.strategy`` and the short-run flags; a ``small``
    run (:mod:`autopar.verify.shrink`) also gets ``p``'s fewer layers (``--num-layers``).

    Raises:
        AutoparError: the script's framework cannot express the layout, the rewritten script
            does not read back as it (:func:`autopar.export.rewrite.rewrite_script`), or a small
            run's layer count does not read back (e.g. a per-layer ``--moe-layer-freq`` list).
    """
    from autopar.export.rewrite import edit_flags, rewrite_script
    from autopar.specs.script import read_script

    plan = read_script(script)
    laid_out = read_script(plan.path, rewrite_script(plan, p, e.strategy))
    flags = short_run_flags(iters, folder, mock_data)
    if small:
        flags["--num-layers"] = str(p.model.num_layers)
    text = edit_flags(laid_out, flags)
    if small:
        got = read_script(plan.path, text).model_fields["num_layers"]
        if got != p.model.num_layers:
            raise AutoparError(f"{plan.path.name}: the small run needs {p.model.num_layers} layers, the edited script "
                               f"reads {got}; verify the full layout or edit the layer flags by hand")
    return text


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values; tables merged key by key (``over`` wins)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def titan_short_run(iters: int, folder: Path, has_dataset: bool) -> dict[str, Any]:
    """torchtitan v0.2 fields of a short run (``torchtitan/config/job_config.py``): ``iters``
    steps, metrics every step, no checkpoint, outputs in the job folder, and the test dataset
    shipped with torchtitan (``c4_test``) when the user's TOML names none."""
    doc: dict[str, Any] = {"job": {"dump_folder": str(folder)}, "training": {"steps": iters},
                           "metrics": {"log_freq": 1, "enable_tensorboard": False, "enable_wandb": False},
                           "checkpoint": {"enable": False}}
    if not has_dataset:
        doc["training"]["dataset"] = "c4_test"
    return doc


def titan_job_toml(toml: str | Path, p: Problem, e: Estimate, iters: int, folder: Path) -> str:
    """The user's torchtitan TOML with the layout's sections and the short-run fields.

    Raises:
        AutoparError: unreadable TOML (names ``--toml``), or a layout torchtitan cannot express.
    """
    from autopar.export import torchtitan

    try:
        base = tomllib.loads(Path(toml).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise AutoparError(f"--toml={str(toml)!r}: not a readable TOML file ({err})") from None
    doc = merge(base, torchtitan.config(p, e.strategy))
    doc = merge(doc, titan_short_run(iters, folder, "dataset" in base.get("training", {})))
    return torchtitan.to_toml(doc)


def layout_name(e: Estimate) -> str:
    """A folder-safe name of the layout, e.g. ``tp2-pp4-dp1-mbs1``."""
    s = e.strategy
    parts = [f"tp{s.tp}", f"pp{s.pp}"] + ([f"vpp{s.vpp}"] if s.vpp > 1 else []) + \
        ([f"cp{s.cp}"] if s.cp > 1 else []) + ([f"ep{s.ep}"] if s.ep > 1 else []) + [f"dp{s.dp}", f"mbs{s.mbs}"]
    return "-".join(parts)


def write_jobs(p: Problem, layouts: list[tuple[int, Estimate]], out: str | Path, framework: str, *,
               script: str | Path | None = None, toml: str | Path | None = None, iters: int = 10,
               mock_data: bool = True, workdir: str | Path | None = None,
               stands_for: dict[int, dict[str, Any]] | None = None) -> list[Job]:
    """Write one job per ``(rank, estimate)`` into ``out/NN-LAYOUT/``.

    Args:
        p: the problem the layouts are for (its cluster is the job's).
        layouts: (rank in the search, its estimate), in the order to run.
        out: the folder of the job folders (created; a job folder that exists is refused).
        framework: ``megatron``, ``mindspeed`` (both need ``script``) or ``torchtitan``
            (needs ``toml``).
        iters: training iterations (steps) per job, 3..:data:`MAX_ITERS`.
        mock_data: Megatron: replace the data paths by ``--mock-data``.
        workdir: where the job runs (default: the current folder, where the user runs the script).
        stands_for: rank -> the full plan a shrunken layout stands for.
    Raises:
        AutoparError: a bad option (named), an existing job folder, a layout the framework
            cannot run (its rank is named).
    """
    if framework not in FRAMEWORKS:
        raise AutoparError(f"--framework={framework!r}: allowed {', '.join(FRAMEWORKS)}")
    if not 3 <= iters <= MAX_ITERS:
        raise AutoparError(f"--iters={iters}: allowed 3..{MAX_ITERS} (the first iterations are warm-up)")
    need, given = ("--toml", toml) if framework == "torchtitan" else ("--script", script)
    if given is None:
        raise AutoparError(f"--framework {framework} needs {need} (the user's own "
                           f"{'torchtitan job TOML' if need == '--toml' else 'launch script'})")
    out = Path(out)
    workdir = Path(workdir or Path.cwd()).resolve()
    jobs = []
    for rank, e in layouts:
        folder = (out / f"{rank:02d}-{layout_name(e)}").resolve()
        if folder.exists():
            raise AutoparError(f"--out={str(out)!r}: {folder.name} exists (a previous verify); name another folder")
        try:
            if framework == "torchtitan":
                text = titan_job_toml(toml, p, e, iters, folder)  # type: ignore[arg-type]
                argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(p.cluster.num_nodes),
                        "--nproc-per-node", str(p.cluster.devices_per_node), "-m", "torchtitan.train",
                        "--job.config_file", str(folder / "job.toml"), "--training.steps", str(iters)]
                name = "job.toml"
            else:
                text = megatron_job_script(script, p, e, iters, folder, mock_data,  # type: ignore[arg-type]
                                           small=rank in (stands_for or {}))
                argv, name = ["bash", str(folder / "job.sh")], "job.sh"
        except AutoparError as err:
            raise AutoparError(f"layout #{rank}: {err}") from None
        try:
            folder.mkdir(parents=True)
            (folder / name).write_text(text)
        except OSError as err:
            raise AutoparError(f"--out={str(out)!r}: cannot write {folder.name} ({err.strerror})") from None
        job = Job(name=folder.name, rank=rank, folder=str(folder), framework=framework, argv=argv,
                  env={"AUTOPAR_VERIFY_JOB": folder.name}, workdir=str(workdir),
                  num_nodes=p.cluster.num_nodes, devices_per_node=p.cluster.devices_per_node,
                  seq_len=p.train.seq_len, global_batch_size=p.train.global_batch_size, iters=iters,
                  layout=e.to_dict(p.train.global_batch_size)["strategy"], predicted=predicted(e, p),
                  stands_for=(stands_for or {}).get(rank))
        job.save()
        jobs.append(job)
    return jobs
