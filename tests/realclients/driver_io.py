"""Command line and output shared by the real-client drivers of this folder (run by a framework's
own interpreter, so standard library only).

A driver takes ``EXPORT WORLD_SIZE [more]`` or ``--batch LIST`` (one such line per export), runs
its check on each export in a forked copy of the interpreter that imported the framework once
(no state leaks between exports), and prints ``OK <export> ...`` or ``REJECTED <export> ...``,
then ``EFFECTIVE <export> {json}`` (what the framework will run), or ``ERROR <export>: ...`` for
an unreadable export. Exit code: 0 all accepted, 1 any rejected, 2 bad input.
"""
import contextlib
import io
import json
import os
import sys

LINE_KINDS = ("OK", "REJECTED", "EFFECTIVE", "ERROR")


def read_jobs(doc: str, max_args: int) -> list:
    """The jobs of the command line: one ``[export, world, ...]`` list per export, or exit 2 with ``doc``."""
    a = sys.argv[1:]
    if len(a) == 2 and a[0] == "--batch":
        with open(a[1]) as f:
            return [ln.split() for ln in f if ln.strip()]
    if 2 <= len(a) <= max_args:
        return [a]
    print(doc, file=sys.stderr)
    sys.exit(2)


def report(path: str, ok: bool, msg: str, eff, tag: str | None = None) -> int:
    """Print the verdict and the effective values of one export; its exit code (0 or 1)."""
    print(f"{'OK' if ok else 'REJECTED' + ('-' + tag if tag else '')} {path} {msg}", flush=True)
    if eff is not None:
        print(f"EFFECTIVE {path} {json.dumps(eff, default=str)}", flush=True)
    return 0 if ok else 1


def bad_input(path: str, err: BaseException) -> int:
    """Print that ``path`` could not be read; exit code 2."""
    print(f"ERROR {path}: {type(err).__name__}: {err}", flush=True)
    return 2


def fork_each(jobs: list, run_one) -> None:
    """Run ``run_one(*job)`` for every job in a forked child, keep only the verdict lines of its
    output (frameworks print while they configure), and exit with the worst code."""
    worst = 0
    for job in jobs:
        pid = os.fork()
        if pid == 0:
            out, buf = sys.stdout, io.StringIO()
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(buf):
                rc = run_one(*job)
            out.write("".join(ln + "\n" for ln in buf.getvalue().splitlines() if ln.startswith(LINE_KINDS)))
            out.flush()
            os._exit(rc)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if rc not in (0, 1, 2):
            print(f"REJECTED {job[0]} [crash] child exit {rc}", flush=True)
            rc = 1
        worst = max(worst, rc)
    sys.exit(worst)
