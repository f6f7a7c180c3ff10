"""Whole-process CPU time of ``autopar`` commands, side by side against a baseline revision (issue 20).

Run: ``python benchmarks/bench_cli.py [--baseline main] [--repeats 5]``.

Each command runs as ``python -m autopar ...`` in a fresh process, importing autopar from this
checkout's ``src`` and from the baseline revision's ``src`` (``git archive``; ``--baseline ''``
skips it), alternately so both see the same machine load. The time is the child's user + system
CPU time (``resource.getrusage(RUSAGE_CHILDREN)`` around ``subprocess.run``): interpreter start,
imports, the command and the interpreter's exit. The table gives the least and the median over
``--repeats`` runs. One untimed run per side first writes the bytecode caches (``__pycache__``;
``PYTHONDONTWRITEBYTECODE`` is cleared for the children), as an installed package has them.

CPU time, not wall time, because wall time on a shared, loaded machine is inflated; it is not a
test (the target is checked by reading the table). Issue 20's target: ``autopar search`` for
Llama-3-70B on 64 H100 <= 0.8 s; ``autopar --help`` should cost little more than the interpreter,
typer and rich.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_search import ROOT, baseline_src

SEARCH = ["search", "--model", "llama3-70b", "--device", "h100-80gb", "--nodes", "8", "--devices-per-node", "8",
          "--gbs", "1024", "--seq-len", "8192", "--top", "10"]
# label -> argv after `python -m autopar`
COMMANDS = {
    "search Llama-3-70B 64 H100": SEARCH,
    "search ... --json": [*SEARCH, "--json"],
    "--help": ["--help"],
    "search --help": ["search", "--help"],
    "devices": ["devices"],
    "estimate Llama-3-8B tp2 pp2": ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--tp", "2",
                                    "--pp", "2"],
}


def cpu_s(src: Path, argv: list[str]) -> float:
    """User + system CPU time (s) of one ``python -m autopar ARGV`` process importing ``src``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "autopar", *argv], env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def measure(sides: dict[str, Path], argv: list[str], repeats: int) -> dict[str, list[float]]:
    """Each side's CPU times over ``repeats`` runs, the sides alternating, after one untimed run each."""
    for src in sides.values():
        cpu_s(src, argv)  # writes __pycache__
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, src in sides.items():
            times[name].append(cpu_s(src, argv))
    return times


def main() -> None:
    """Print one row per command: least and median CPU seconds for this checkout and the baseline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git revision to compare with ('' for none)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"this": ROOT / "src"}
        if args.baseline:
            sides[args.baseline] = baseline_src(args.baseline, Path(tmp))
        header = f"{'command':32s}" + "".join(f" | {name + ' least':>14s} {'median':>7s}" for name in sides)
        print(header)
        print("-" * len(header))
        for label, argv in COMMANDS.items():
            times = measure(sides, argv, args.repeats)
            print(f"{label:32s}" + "".join(f" | {min(t):14.3f} {statistics.median(t):7.3f}" for t in times.values()),
                  flush=True)
    print(f"\nCPU seconds (user + system) of the whole process, {args.repeats} runs per side; target: the "
          "Llama-3-70B search <= 0.8 s")


if __name__ == "__main__":
    main()
