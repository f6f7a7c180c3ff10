"""The CLI reference page is generated from the typer app (``docs/hooks/generated.py``): every
command and every option appears, with its help text escaped for HTML."""

from __future__ import annotations

import importlib.util

import typer

from autopar.cli import app
from conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "docs_generated", ROOT / "docs" / "hooks" / "generated.py")
generated = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generated)


def test_reference_lists_every_command_and_option():
    text = generated.reference_markdown()
    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    for name in root.list_commands(ctx):
        assert f"## `autopar {name}`" in text
    search = root.get_command(ctx, "search")
    for param in search.params:
        assert param.opts[0] in text, param.opts[0]
    assert "## `autopar profile ops`" in text  # sub-commands of sub-apps too


def test_reference_escapes_angle_brackets_in_help():
    text = generated.reference_markdown()
    assert "base: &lt;preset&gt;" in text and "base: <preset>" not in text


def test_rules_and_roles():
    assert "`world_size`" in generated.rules_markdown()
    assert generated.on_page_content("see :func:<code>f</code>") == "see <code>f</code>"
    assert generated.on_page_markdown("x <!-- autopar-rules --> y").count("`world_size`") == 1
