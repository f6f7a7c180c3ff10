"""The ``warning:`` lines of the running command, queued by any module and printed by the command
line only when the command succeeds (:func:`autopar.cli.app.user_errors`), so that bad input
gives exactly one ``error:`` line and nothing else.
"""

from __future__ import annotations

# ``warning:`` lines of the running command, printed only if it succeeds (see :func:`warn_on_success`).
_PENDING_WARNINGS: list[str] = []


def warn_on_success(message: str) -> None:
    """Queue a ``warning:`` line for stderr, printed when the command finishes without error.

    A command that then fails prints its one ``error:`` line alone (e.g. ``--seq-len`` above the
    model's positions, then no layout fits): bad input gives exactly one line.
    """
    _PENDING_WARNINGS.append(message)


def take_warnings() -> list[str]:
    """The queued :func:`warn_on_success` lines, emptying the queue."""
    queued, _PENDING_WARNINGS[:] = list(_PENDING_WARNINGS), []
    return queued
