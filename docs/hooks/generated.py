"""MkDocs hook: replace ``<!-- autopar-cli-reference -->`` in a page with the reference of every
``autopar`` command, read from the typer app itself (``autopar.cli.app``), and
``<!-- autopar-rules -->`` with the names of the layout rules (``autopar.rules.RULES``) and
``<!-- autopar-json-schemas -->`` with the fields of every ``--json`` document (the schema files of
``autopar.schemas``), so each is written once, in the code; and render the docstrings' Sphinx
roles as plain code spans."""

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
    """Fill the markers with :func:`reference_markdown`, :func:`rules_markdown` and
    :func:`json_markdown` (pages without them are unchanged)."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, reference_markdown())
    if RULES_MARKER in markdown:
        markdown = markdown.replace(RULES_MARKER, rules_markdown())
    if JSON_MARKER in markdown:
        markdown = markdown.replace(JSON_MARKER, json_markdown())
    return markdown


def on_page_content(html: str, **kwargs) -> str:  # mkdocs hook signature
    """Drop the Sphinx role prefixes (:data:`SPHINX_ROLE`) from the rendered docstrings."""
    return SPHINX_ROLE.sub("", html)


JSON_MARKER = "<!-- autopar-json-schemas -->"


def _type_of(node: dict) -> str:
    """A field's JSON type as the page shows it (``integer``, ``string or null``, ``[strategy](#strategy)``)."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#shared-{name})"
    if "const" in node:
        return f"`{node['const']}`"
    if "allOf" in node:
        return " + ".join(_type_of(n) for n in node["allOf"])
    if "oneOf" in node:
        return " or ".join(_type_of(n) for n in node["oneOf"])
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and isinstance(node.get("items"), dict):
        kinds = [f"array of {_type_of(node['items'])}" if k == "array" else k for k in kinds]
    return " or ".join(kinds)


def _field_rows(node: dict, prefix: str = "") -> list[str]:
    """One markdown row per property of ``node``, nested objects and array items flattened with
    dotted paths (``layouts[].rank_mark``); a ``$ref`` is linked, not expanded."""
    rows = []
    required = set(node.get("required", ()))
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        text = sub.get("description", "").replace("|", "\\|")
        rows.append(f"| `{path}` | {_type_of(sub)} | {'yes' if key in required else 'no'} | {html.escape(text, quote=False)} |")
        if "$ref" in sub:
            continue
        if sub.get("type") == "object" or "properties" in sub:
            rows += _field_rows(sub, path + ".")
        items = sub.get("items")
        if isinstance(items, dict) and "properties" in items:
            rows += _field_rows(items, path + "[].")
        for part in sub.get("allOf", ()):
            if "properties" in part:
                rows += _field_rows(part, path + ".")
    return rows


def _table(node: dict) -> str:
    return "\n".join(["| field | type | required | meaning |", "| --- | --- | --- | --- |", *_field_rows(node)]) + "\n"


def json_markdown() -> str:
    """The JSON documents' reference, read from the schema files (:mod:`autopar.schemas`): one
    section per document (its command, version and fields), then the shared parts of
    ``common.schema.json``."""
    from autopar.schemas import DOCUMENTS, schema, schema_path, schema_version

    parts = []
    for name, command in DOCUMENTS.items():
        s = schema(name)
        parts.append(f"## {name}\n\n`{command}`, `schema_version` {schema_version(name)}: {s['description']} "
                     f"Schema: `src/autopar/data/schemas/{schema_path(name).name}`.\n")
        parts.append(_table(s))
    parts.append("## Shared parts\n\nThe definitions of `common.schema.json` the documents refer to.\n")
    for name, node in schema("common")["$defs"].items():
        parts.append(f"### shared: {name}\n\n{node.get('description', '')}\n")
        parts.append(_table(node) if "properties" in node else
                     "".join(_table(p) for p in node.get("allOf", ()) if "properties" in p)
                     + "".join(f"Also every field of {_type_of(p)}.\n" for p in node.get("allOf", ()) if "$ref" in p))
    return "\n".join(parts)
