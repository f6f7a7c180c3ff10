"""Commands load on demand (:mod:`autopar.cli.commands`): ``autopar --help`` imports no command,
``autopar search`` none of what only other commands use, and the listing matches the commands."""

from __future__ import annotations

import json
import subprocess
import sys

import typer.core
import typer.main

from autopar.cli import app
from autopar.cli.commands import COMMANDS, import_all

# What no search and no --help may load: plotting, the ILP solver, scipy, torch, the JSON Schema checker,
# rich's markdown renderer (typer's help boxes) and the balance command's integer program.
HEAVY = ("matplotlib", "highspy", "scipy", "torch", "jsonschema", "rich.markdown", "autopar.pipeline.balance")

_RUN = """
import json, sys
sys.argv = ["autopar", *json.loads(sys.argv[1])]
from autopar.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(argv: list[str]) -> set[str]:
    """The modules loaded by a fresh ``autopar ARGV`` process (its last stdout line)."""
    out = subprocess.run([sys.executable, "-c", _RUN, json.dumps(argv)], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_help_lists_every_command_without_importing_them():
    loaded = _modules_after(["--help"])
    assert not {"numpy", "pydantic", "yaml", "autopar.specs", "autopar.cli.search"} & loaded
    assert not any(m.startswith(HEAVY) for m in loaded)


def test_search_loads_no_plotting_solver_or_other_command():
    loaded = _modules_after(["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--top", "1"])
    assert "autopar.search.grid" in loaded  # the search ran
    assert sorted(m for m in loaded if m.startswith(HEAVY)) == []
    assert not {"autopar.cli.balance", "autopar.cli.validate", "autopar.cli.plan", "autopar.cli.export"} & loaded


def test_search_help_loads_no_plotting_or_solver():
    loaded = _modules_after(["search", "--help"])
    assert "autopar.cli.search" in loaded
    assert sorted(m for m in loaded if m.startswith(HEAVY)) == []


def test_the_listing_names_every_registered_command_with_its_own_help():
    import_all()
    registered = {info.name or typer.main.get_command_name(info.callback.__name__) for info in app.registered_commands}
    assert registered | {g.name for g in app.registered_groups} == set(COMMANDS)
    group = typer.main.get_command(app)
    for name, (_, listed) in COMMANDS.items():
        command = group.get_command(None, name)
        for limit in (30, 60, 200):  # the listing cuts the help to the terminal width
            assert typer.core.TyperCommand(name=name, help=listed).get_short_help_str(limit) == \
                command.get_short_help_str(limit), name


def test_a_mistyped_command_is_refused_with_the_close_names():
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["serch"])
    assert result.exit_code == 2 and "Did you mean 'search'?" in result.output
