"""Running a HiGHS model (``highspy``) the same way from every integer program of autopar.

HiGHS keeps one thread scheduler per process, set by the first solve's ``threads`` option: a
later ``Highs`` whose ``threads`` differs does not solve at all (``run()`` returns ``kError``,
model status ``kNotset``: "Option 'threads' is set to 1 but global scheduler has already been
initialized to use N threads"). autopar's two programs once disagreed (the layer-split program of
:mod:`autopar.pipeline.ilp` left ``threads`` at its default, :mod:`autopar.pipeline.chunk_ilp`
set 1), so in one process the second silently fell back to its greedy start and reported
"solver highs" without the proof. Every program now sets :data:`THREADS` through
:func:`configure`, and :func:`run` resets the scheduler and solves again where another HiGHS user
of the same process left it at another size.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError

THREADS = 1  # one thread: the programs are small, and 2-core CI machines run several at once


def configure(h: Any, time_limit_s: float) -> None:
    """Set the options every autopar program shares on ``h`` (a ``highspy.Highs``): the time limit
    (seconds) and :data:`THREADS`."""
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("threads", THREADS)


def run(h: Any) -> None:
    """``h.run()``; where HiGHS refuses to start (``kError``: its process-wide scheduler was made
    for another thread count), reset the scheduler and run once more.

    Raises:
        AutoparError: HiGHS still fails to run the model (a failed solve is not an answer: the
            caller would report its greedy start as solved).
    """
    import highspy

    if h.run() != highspy.HighsStatus.kError:
        return
    highspy.Highs.resetGlobalScheduler(True)
    if h.run() == highspy.HighsStatus.kError:
        raise AutoparError(f"the integer program's solver (HiGHS) did not run: model status {h.getModelStatus()}")
