"""The search summary under the table is one line."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app

# Wide enough that no help line wraps (rich reads COLUMNS; typer caps help at TERMINAL_WIDTH).
runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


TOY = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096"]


def test_search_summary_is_one_line():
    out = runner.invoke(app, ["search", *TOY, "--top", "2"]).output
    line = next(x for x in out.splitlines() if "layouts enumerated" in x)
    assert "out of memory:" in line and "marginal (near the memory limit):" in line
