"""Read a short run's log: step time after warm-up, tokens/s, peak memory, and why it failed.

Lines parsed, and the framework code that prints each:

* Megatron-LM / MindSpeed-LLM iteration line, ``training_log`` in ``megatron/training/training.py``
  (``iteration 71/ 100 | consumed samples: 9088 | elapsed time per iteration (ms): 5361.6 |
  throughput per GPU (TFLOP/s/GPU): 243.6 | ... | global batch size: 128 | ...``; the throughput
  field only with ``--log-throughput``). Printed by the last pipeline rank every ``--log-interval``
  iterations; the time is the mean over the interval.
* Megatron memory report, ``report_memory`` in ``megatron/training/utils.py``, called once by
  ``training_log`` after the first logged interval (``[Rank 0] (after 20 iterations) memory (MB) |
  allocated: 3270.16 | max allocated: 5670.39 | reserved: 6406.00 | max reserved: 6406.00``; older
  releases print it without the ``[Rank N]`` prefix). Every rank of data-parallel rank 0 prints it
  (one per pipeline stage and tp rank): the peak is the largest.
* torchtitan metrics line, ``MetricsProcessor.log`` in ``torchtitan/components/metrics.py``
  (``step: 14  loss:  3.24405  grad_norm:  0.8319  memory:  9.46GiB(64.99%)  tps: 7,282  tflops:
  0.52  mfu: 0.17%``): ``memory`` is the max reserved memory of the device since the last log
  (``DeviceMemoryMonitor.get_peak_stats``), ``tps`` tokens per second per device.
* Failures: PyTorch's allocator (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate
  ...``, ``c10/cuda/CUDACachingAllocator.cpp``), the NCCL watchdog (``Watchdog caught collective
  operation timeout: WorkNCCL(... OpType=ALLREDUCE ...)``, ``ProcessGroupNCCL.cpp``), Python
  ``AssertionError``/``RuntimeError``/``ValueError`` lines (e.g. Megatron's argument checks), and
  torchrun's ``ChildFailedError`` summary. A failed run is a :class:`RunResult` with ``failure`` set.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

MIB = 1024 ** 2
GIB = 1024 ** 3
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # torchtitan colours its metrics line
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+)\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_MEGATRON_GBS = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_MEM = re.compile(r"memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+) \| reserved: ([\d.]+) \| "
                           r"max reserved: ([\d.]+)")
_TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:.*?memory:\s*([\d.]+)GiB\(([\d.]+)%\)\s+tps:\s*([\d,]+)"
                         r"(?:\s+tflops:\s*([\d.,]+))?(?:\s+mfu:\s*([\d.]+)%)?")
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("out_of_memory", re.compile(r"(?:CUDA|NPU|HIP) out of memory\.?[^\n]*|OutOfMemoryError[^\n]*")),
    ("nccl_timeout", re.compile(r"Watchdog caught collective operation timeout: (WorkNCCL\([^)]*\))[^\n]*")),
    ("assertion", re.compile(r"AssertionError:?[^\n]*")),
    ("error", re.compile(r"(?:RuntimeError|ValueError|TypeError|KeyError|ModuleNotFoundError|ImportError|"
                         r"FileNotFoundError): [^\n]*")),
    ("nccl_error", re.compile(r"(?:NCCL error|ncclInternalError|ncclSystemError)[^\n]*")),
    # bash's own message when the launcher (torchrun, srun) or the script's interpreter is not on PATH
    ("command_not_found", re.compile(r"[^\s:]+: command not found")),
)

Framework = Literal["megatron", "mindspeed", "torchtitan"]


@dataclass
class RunResult:
    """What one short run measured. Times in seconds, memory in bytes (per device, the busiest).

    ``step_time_s``: median step time over the steps after ``warmup`` (None when none was
    logged); ``tokens_per_s``: the whole job's tokens per second at that step time;
    ``peak_allocated_bytes`` / ``peak_reserved_bytes``: the largest over the ranks that report
    (torchtitan reports reserved only); ``failure``: ``out_of_memory``, ``nccl_timeout``,
    ``assertion``, ``error``, ``nccl_error``, ``command_not_found`` (bash could not find the
    launcher, e.g. ``torchrun``), ``timeout`` (the launcher's time limit),
    ``exit_code`` (no message found) or ``no_steps`` (exited 0 without a logged step), with
    ``cause`` the line that says why.
    """

    steps: int = 0
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_device: float | None = None
    peak_allocated_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    failure: str | None = None
    cause: str | None = None
    step_times_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _step_time(times: dict[int, float], warmup: int) -> tuple[int, float | None]:
    """(steps logged, median step time of the steps after ``warmup``; all steps if none after)."""
    after = [t for step, t in sorted(times.items()) if step > warmup] or list(times.values())
    return len(times), (statistics.median(after) if after else None)


def failure_of(text: str) -> tuple[str, str] | None:
    """(kind, the first line that says so) of the first failure found in ``text``, or None.

    Kinds are tried in :data:`_FAILURES` order: an OOM or NCCL timeout is the cause even when
    a later traceback line (``RuntimeError: ...``) repeats it."""
    for kind, pattern in _FAILURES:
        m = pattern.search(text)
        if m:
            return kind, " ".join(m.group(0).split())[:300]
    return None


def parse_megatron(text: str, seq_len: int, warmup: int = 2) -> RunResult:
    """Megatron-LM / MindSpeed-LLM log -> :class:`RunResult` (lines: module docstring).

    Args:
        text: the job's stdout and stderr.
        seq_len: tokens per sequence (tokens/s = global batch size x seq_len / step time; the
            global batch size is read from the iteration line).
        warmup: iterations left out of the step time (the first ones build kernels and buffers).
    """
    text = ANSI.sub("", text)
    times: dict[int, float] = {}
    tflops, gbs = [], None
    for line in text.splitlines():
        m = _MEGATRON_ITER.search(line)
        if not m:
            continue
        times[int(m.group(1))] = float(m.group(3)) / 1e3
        t = _MEGATRON_TFLOPS.search(line)
        if t and int(m.group(1)) > warmup:
            tflops.append(float(t.group(1)))
        g = _MEGATRON_GBS.search(line)
        gbs = int(g.group(1)) if g else gbs
    steps, step_s = _step_time(times, warmup)
    mem = [tuple(map(float, m.groups())) for m in _MEGATRON_MEM.finditer(text)]
    return RunResult(steps=steps, step_time_s=step_s,
                     tokens_per_s=gbs * seq_len / step_s if gbs and step_s else None,
                     tflops_per_device=statistics.median(tflops) if tflops else None,
                     peak_allocated_bytes=max(m[1] for m in mem) * MIB if mem else None,
                     peak_reserved_bytes=max(m[3] for m in mem) * MIB if mem else None,
                     step_times_s=[times[k] for k in sorted(times)])


def parse_torchtitan(text: str, tokens_per_step: int, world_size: int, warmup: int = 2) -> RunResult:
    """torchtitan log -> :class:`RunResult` (line: module docstring).

    torchtitan prints tokens per second per device (``tps``), not the step time; the step time is
    ``tokens_per_step / (tps x world_size)``. Each rank prints its own line (``[rank0]:`` prefix
    under torchrun's ``--local-ranks-filter``, or none): per step, the slowest rank's ``tps`` and
    the largest memory are kept.

    Args:
        text: the job's stdout and stderr.
        tokens_per_step: global batch size x sequence length.
        world_size: devices in the job.
        warmup: steps left out of the step time.
    """
    text = ANSI.sub("", text)
    tps: dict[int, float] = {}
    tflops: dict[int, float] = {}
    peak = None
    for m in _TITAN_STEP.finditer(text):
        step, rate = int(m.group(1)), float(m.group(4).replace(",", ""))
        tps[step] = min(tps.get(step, rate), rate)
        if m.group(5):
            tflops[step] = float(m.group(5).replace(",", ""))
        peak = max(peak or 0.0, float(m.group(2)) * GIB)
    times = {k: tokens_per_step / (v * world_size) for k, v in tps.items() if v > 0}
    steps, step_s = _step_time(times, warmup)
    after = [v for k, v in tflops.items() if k > warmup]
    return RunResult(steps=steps, step_time_s=step_s, tokens_per_s=tokens_per_step / step_s if step_s else None,
                     tflops_per_device=statistics.median(after) if after else None, peak_reserved_bytes=peak,
                     step_times_s=[times[k] for k in sorted(times)])


def parse_log(text: str, framework: str, *, seq_len: int, global_batch_size: int, world_size: int,
              exit_code: int | None, timed_out: bool = False, warmup: int = 2) -> RunResult:
    """The measurements and the outcome of one run.

    A failure message in the log wins; otherwise a time-out (``timed_out``), a non-zero
    ``exit_code``, or a clean exit without any logged step is the failure.
    """
    if framework == "torchtitan":
        result = parse_torchtitan(text, global_batch_size * seq_len, world_size, warmup)
    else:
        result = parse_megatron(text, seq_len, warmup)
    found = failure_of(ANSI.sub("", text)) if (exit_code or timed_out or not result.steps) else None
    if found:
        result.failure, result.cause = found
    elif timed_out:
        result.failure, result.cause = "timeout", "the launcher's time limit ended the job"
    elif exit_code:
        result.failure, result.cause = "exit_code", f"exited with code {exit_code} and no known error message"
    elif not result.steps:
        result.failure, result.cause = "no_steps", "exited without logging a training step"
    return result
