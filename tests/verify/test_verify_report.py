"""autopar verify's report: re-ranked by measured tokens/s, a failed job is one row; the run budget."""

from __future__ import annotations

import io

from rich.console import Console

from autopar.verify.jobs import Job
from autopar.verify.logs import RunResult
from autopar.verify.report import report_doc, report_table
from autopar.verify.run import run_jobs


def _job(rank: int, step_s: float, tmp_path=None) -> Job:
    folder = tmp_path / f"{rank:02d}" if tmp_path else ""
    if tmp_path:
        folder.mkdir()
    return Job(name=f"{rank:02d}-tp{rank}", rank=rank, folder=str(folder), framework="megatron",
               argv=["bash", "-c", "exit 0"], env={}, workdir=str(tmp_path or "."), num_nodes=1, devices_per_node=8,
               seq_len=4096, global_batch_size=64, iters=10, layout={"tp": rank},
               predicted={"step_time_s": step_s, "tokens_per_s": 64 * 4096 / step_s, "peak_memory_bytes": 40e9})


def test_reranked_by_measurement_and_failures_last():
    jobs = [_job(1, 1.0), _job(2, 1.1), _job(3, 1.2)]
    results = [RunResult(steps=10, step_time_s=1.5, tokens_per_s=64 * 4096 / 1.5, peak_allocated_bytes=50e9),
               RunResult(failure="out_of_memory", cause="CUDA out of memory. Tried to allocate 2.00 GiB"),
               RunResult(steps=10, step_time_s=1.25, tokens_per_s=64 * 4096 / 1.25, peak_allocated_bytes=45e9)]
    doc = report_doc(jobs, results)
    assert [(r["search_rank"], r["measured_rank"]) for r in doc["layouts"]] == [(3, 1), (1, 2), (2, None)]
    assert doc["layouts"][0]["step_time_error"] == (1.2 - 1.25) / 1.25
    assert doc["layouts"][1]["memory_error"] == (40e9 - 50e9) / 50e9
    assert doc["failed"] == 1 and doc["runs"] == 3
    out = io.StringIO()
    Console(file=out, width=250).print(report_table(jobs, results))
    lines = [line for line in out.getvalue().splitlines() if "02-tp2" in line]
    assert len(lines) == 1 and "out_of_memory: CUDA out of memory" in lines[0]


def test_budget_stops_starting_jobs(tmp_path):
    jobs = [_job(1, 1.0, tmp_path), _job(2, 1.0, tmp_path)]
    jobs[0].argv = ["bash", "-c", "sleep 0.3"]
    results = run_jobs(jobs, "local", time_limit_s=30, budget_s=0.1)
    assert results[0].failure == "no_steps" and results[1].failure == "not_run" and "--budget-s 0.1" in results[1].cause


def test_report_png_has_a_bar_pair_per_measured_layout_and_names_failures(monkeypatch):
    """The PNG draws, in the table's order, a predicted and a measured bar per measured layout,
    the prediction's signed error beside them, and only the predicted bar plus 'failed: kind' for
    a failed run."""
    from autopar.report import verify_plot
    from autopar.verify.report import report_png

    drawn = {}
    real_png = verify_plot._png

    def keep(fig):
        ax = fig.axes[0]
        drawn["bars"] = [round(p.get_width(), 6) for p in ax.patches]
        drawn["texts"] = [t.get_text() for t in ax.texts]
        drawn["labels"] = [t.get_text() for t in ax.get_yticklabels()]
        return real_png(fig)

    monkeypatch.setattr(verify_plot, "_png", keep)
    jobs = [_job(1, 1.0), _job(2, 1.1), _job(3, 1.2)]
    results = [RunResult(steps=10, step_time_s=1.5, tokens_per_s=64 * 4096 / 1.5),
               RunResult(failure="out_of_memory", cause="CUDA out of memory"),
               RunResult(steps=10, step_time_s=1.25, tokens_per_s=64 * 4096 / 1.25)]
    png = report_png(jobs, results)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn["bars"] == [1.2, 1.25, 1.0, 1.5, 1.1]  # ranked: #3, #1, then the failed #2
    assert drawn["texts"] == ["-4%", "-33%", "failed: out_of_memory"]  # (1.2-1.25)/1.25, (1.0-1.5)/1.5
    assert drawn["labels"] == ["03-tp3", "01-tp1", "02-tp2"]  # ticks at y = 2, 1, 0: #3 (fastest) at the top
