"""MkDocs hook: replace ``<!-- autopar-cli-reference -->`` in a page with the reference of every
``autopar`` command, read from the typer app itself (``autopar.cli.app``), and
``<!-- autopar-rules -->`` with the names of the layout rules (``autopar.rules.RULES``), so both
are written once, in the code; and render the docstrings' Sphinx roles as plain code spans."""

from __future__ import annotations

import html
import re

import typer

# Sphinx cross-reference roles in the docstrings (``:func:`x```), which mkdocstrings renders as
# ":func:" followed by the code span; the hook keeps the code span only.
SPHINX_ROLE = re.compile(r":(?:func|mod|class|data|attr|meth|obj):(?=<code>)")
MARKER = "<!-- autopar-cli-reference -->"
RULES_MARKER = "<!-- autopar-rules -->"


def _commands(group, path: str) -> list:
    """Every command under ``group`` as (full command line, click command), depth first (typer
    ships its own click, so groups are recognised by ``list_commands``, not by class)."""
    out = [(path, group)]
    if hasattr(group, "list_commands"):
        ctx = typer.Context(group)
        for name in group.list_commands(ctx):
            out += _commands(group.get_command(ctx, name), f"{path} {name}")
    return out


def _param_row(param, ctx) -> str:
    """One markdown table row: the option's names with its value type, and its help (as
    ``--help`` shows them: click's own help record)."""
    record = param.get_help_record(ctx)
    names, text = record if record else (param.human_readable_name, "")
    text = html.escape(text.replace("\\[", "["), quote=False).replace("|", "\\|").replace("\n", " ")
    return f"| `{names}` | {text} |"


def reference_markdown() -> str:
    """The whole CLI reference as markdown: one section per command, its help and its options."""
    from autopar.cli import app

    root = typer.main.get_command(app)
    parts = []
    for path, cmd in _commands(root, "autopar"):
        parts.append(f"## `{path}`\n")
        parts.append(html.escape((cmd.help or "").replace("\\[", "["), quote=False).strip() + "\n")
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if hasattr(cmd, "list_commands"):
            subs = cmd.list_commands(typer.Context(cmd))
            parts.append("Subcommands: " + ", ".join(f"`{path} {s}`" for s in subs) + ".\n")
        if params:
            ctx = typer.Context(cmd)
            parts.append("| option | meaning |\n| --- | --- |")
            parts.append("\n".join(_param_row(p, ctx) for p in params) + "\n")
    return "\n".join(parts)


def rules_markdown() -> str:
    """The names of the layout validity rules, in the order the search applies them
    (:data:`autopar.rules.RULES`), as a markdown list."""
    from autopar.rules import RULES

    return "\n".join(f"{i}. `{r.name}`" for i, r in enumerate(RULES, 1)) + "\n"


def on_page_markdown(markdown: str, **kwargs) -> str:  # mkdocs hook signature
    """Fill the markers with :func:`reference_markdown` and :func:`rules_markdown` (pages
    without them are unchanged)."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference_markdown())
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_markdown())
    return markdown


def on_page_content(html: str, **kwargs) -> str:  # mkdocs hook signature
    """Drop the Sphinx role prefixes (:data:`SPHINX_ROLE`) from the rendered docstrings."""
    return SPHINX_ROLE.sub("", html)
