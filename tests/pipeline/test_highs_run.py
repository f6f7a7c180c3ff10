"""Every integer program runs HiGHS with the same thread count (autopar.pipeline.highs_run): a
layer-split solve (pipeline.ilp, which left ``threads`` at its default) followed by a chunk solve
(``threads`` 1) in one process made HiGHS refuse the second (its scheduler is per process), and
``balance`` printed its greedy start as 'solver highs' without the proof."""

from __future__ import annotations

import highspy
import numpy as np
import pytest

from autopar.pipeline import highs_run


def _tiny(threads: int | None):
    h = highspy.Highs()
    h.silent()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = 1, 0
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = np.array([1.0]), np.array([0.0]), np.array([1.0])
    lp.integrality_ = [highspy.HighsVarType.kInteger]
    h.passModel(lp)
    if threads is not None:
        h.setOptionValue("threads", threads)
    return h


def test_a_solve_after_another_thread_count_still_runs():
    other = _tiny(2)
    other.run()  # another HiGHS user of the process sized the scheduler for 2 threads
    h = _tiny(None)
    highs_run.configure(h, 1.0)
    highs_run.run(h)  # h.run() alone returns kError here
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal


def test_balance_after_a_galvatron_gpipe_search_is_proven_optimal():
    from typer.testing import CliRunner

    from autopar.cli import app

    runner = CliRunner()
    search = runner.invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--gbs",
                                 "64", "--target", "galvatron", "--top", "3", "--json", "--schedule", "gpipe"])
    assert search.exit_code == 0, search.output
    out = runner.invoke(app, "balance --model llama3-70b --device h100-80gb --nodes 4 --gbs 512 --tp 4 --pp 4 --mbs 1 "
                             "--time-limit 30".split())
    assert out.exit_code == 0 and "solver highs, proven optimal" in out.stdout


@pytest.mark.parametrize("module", ["autopar.pipeline.ilp", "autopar.pipeline.chunk_ilp"])
def test_both_programs_use_the_shared_runner(module):
    import importlib
    import inspect

    source = inspect.getsource(importlib.import_module(module))
    assert "highs_run.configure(h," in source and "highs_run.run(h)" in source and ".run()" not in source
