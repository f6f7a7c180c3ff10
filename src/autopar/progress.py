"""Phases of long-running work: their wall time, and a progress display while they run.

Domain code marks what it does with :func:`phase` (a named phase, optionally with the number of
items it will go through) and :func:`advance` (items done). By default nothing is shown; inside
:func:`timings` the wall time of each phase is recorded (``search_time_s`` and the JSON's
``phases_s`` come from there), and inside :func:`display` each phase shows as a line of
``rich.progress`` on the given console (the command line passes stderr, and only on a terminal:
progress never reaches stdout or a pipe). The state is held in context variables, so nested and
concurrent uses do not mix.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

_PROGRESS: ContextVar[Any] = ContextVar("autopar_progress", default=None)  # a rich.progress.Progress or None
_TASK: ContextVar[Any] = ContextVar("autopar_progress_task", default=None)  # the innermost shown task id
_TIMES: ContextVar[dict[str, float] | None] = ContextVar("autopar_phase_times", default=None)


@contextmanager
def timings() -> Iterator[dict[str, float]]:
    """Record the wall time (s) of every :func:`phase` run inside, by phase name (a phase run
    twice adds up); yields the dict, filled as the phases end."""
    times: dict[str, float] = {}
    token = _TIMES.set(times)
    try:
        yield times
    finally:
        _TIMES.reset(token)


@contextmanager
def display(console: Any) -> Iterator[None]:
    """Show every :func:`phase` run inside as a transient ``rich.progress`` line on ``console``
    (a ``rich.console.Console``): its description, a bar and ``done/total`` where the phase
    gave a total, and the elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    token = _PROGRESS.set(progress)
    try:
        with progress:
            yield
    finally:
        _PROGRESS.reset(token)


@contextmanager
def phase(name: str, total: int | None = None, description: str | None = None) -> Iterator[None]:
    """Run the body as phase ``name``: its wall time is added to the active :func:`timings`, and
    under :func:`display` it shows as ``description`` (default ``name``) with ``total`` items."""
    start = time.perf_counter()
    progress = _PROGRESS.get()
    task = progress.add_task(description or name, total=total) if progress is not None else None
    token = _TASK.set(task)
    try:
        yield
    finally:
        _TASK.reset(token)
        if progress is not None:
            progress.remove_task(task)
        times = _TIMES.get()
        if times is not None:
            times[name] = times.get(name, 0.0) + time.perf_counter() - start


def advance(items: int = 1, description: str | None = None) -> None:
    """``items`` more done in the innermost shown phase (and its text changed to ``description``
    if given); nothing without :func:`display`."""
    progress, task = _PROGRESS.get(), _TASK.get()
    if progress is not None and task is not None:
        progress.update(task, advance=items, **({"description": description} if description else {}))
