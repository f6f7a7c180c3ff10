"""Phase timing and the progress display (:mod:`autopar.progress`; issue 20): progress goes to
the display's console only, never into ``--json`` output; ``--quiet`` is accepted by the slow
commands; ``search`` reports the wall time of its phases and of the whole command."""

from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console
from typer.testing import CliRunner

from autopar.cli import app
from autopar.progress import advance, display, phase, timings
from autopar.search import search
from conftest import make_problem

SEARCH = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096", "--top", "2"]


def test_phases_add_up_their_wall_time_and_nest():
    with timings() as times:
        with phase("a"):
            with phase("b", total=2):
                advance()
        with phase("a"):
            pass
    assert set(times) == {"a", "b"}
    assert times["a"] >= times["b"] >= 0


def test_phases_show_on_the_display_console_only(capsys):
    out = io.StringIO()
    with display(Console(file=out, force_terminal=True, width=100)):
        with phase("cost", total=3, description="costing 3 layouts"):
            advance(3)
    assert "costing 3 layouts" in out.getvalue()
    assert capsys.readouterr().out == ""


def test_search_reports_its_phases():
    r = search(make_problem("llama3-8b", gbs=64), top_k=2)
    assert {"enumerate", "cost", "rank", "recost"} <= set(r.phases_s)
    assert sum(r.phases_s.values()) <= r.search_time_s


@pytest.mark.parametrize("extra", [[], ["--quiet"]])
def test_search_json_has_no_progress_text(extra):
    result = CliRunner().invoke(app, [*SEARCH, "--json", *extra])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # the whole of stdout is the JSON document
    assert set(doc["phases_s"]) >= {"enumerate", "cost", "rank", "recost"}
    assert doc["command_s"] >= doc["search_time_s"] > 0
    assert "costing" not in result.output


def test_search_progress_goes_to_stderr_on_a_terminal(monkeypatch):
    """With both streams on a terminal the phases show on stderr's console; stdout stays the
    JSON document; ``--quiet`` turns the display off."""
    shown = io.StringIO()
    cli_app = sys.modules["autopar.cli.app"]  # the module (autopar.cli.app is also the Typer object's name)
    monkeypatch.setattr(cli_app, "on_terminals", lambda: True)
    monkeypatch.setattr(cli_app, "err_console", Console(file=shown, force_terminal=True, width=120))
    result = CliRunner().invoke(app, [*SEARCH, "--json"])
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert "costing" in shown.getvalue() and "costing" not in result.stdout
    shown.truncate(0)
    assert CliRunner().invoke(app, [*SEARCH, "--json", "--quiet"]).exit_code == 0
    assert shown.getvalue().strip("\x00") == ""


@pytest.mark.parametrize("command", [["search"], ["validate"], ["verify"], ["balance"], ["profile", "ops"]])
def test_slow_commands_take_quiet(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    assert "--quiet" in result.output
