"""The command line is one package: no domain module imports :mod:`autopar.cli` or typer, and no
command module imports the package itself (``autopar.cli/__init__`` imports them: that would be a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import autopar

SRC = Path(autopar.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_no_domain_module_imports_the_command_line():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "cli" or rel.name == "__main__.py":
            continue
        bad = {n for n in _imports(path) if n == "typer" or n.startswith(("typer.", "autopar.cli"))}
        if bad:
            offenders.append(f"{rel}: {sorted(bad)}")
    assert offenders == []


def test_command_modules_do_not_import_the_cli_package():
    offenders = []
    for path in (SRC / "cli").glob("*.py"):
        if path.name == "__init__.py":
            continue
        bad = {n for n in _imports(path) if n == "autopar.cli"}  # `from autopar.cli import X`: X from __init__
        if bad:
            offenders.append(f"{path.name}: {sorted(bad)}")
    assert offenders == []


def test_every_command_module_registers_on_the_app():
    from autopar.cli import app
    from autopar.cli.commands import import_all

    import_all()

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert {"search", "estimate", "devices", "validate", "export", "balance", "verify", "calibrate"} <= names
    assert [g.name for g in app.registered_groups] == ["profile"]
