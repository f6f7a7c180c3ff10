"""The versioned JSON documents autopar prints with ``--json``: one JSON Schema (draft 2020-12)
per document in ``autopar/data/schemas/NAME.schema.json``, shared parts in
``common.schema.json``.

Every document carries ``schema_version`` (the ``const`` of its schema's ``schema_version``
property, so the version is written once, in the schema file) and ``document`` (its name). A
field removed or changing meaning raises the version; a field added does not.
``tests/cli/test_json_schemas.py`` validates each command's real output against its schema and
``docs/reference/json.md`` is generated from these files (``docs/hooks/generated.py``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent / "data" / "schemas"

#: Document name -> the command that prints it.
DOCUMENTS = {
    "search": "autopar search --json",
    "search-sweep": "autopar search --gbs-range ... --json",
    "search-layerwise": "autopar search --layerwise --json",
    "estimate": "autopar estimate --json",
    "devices": "autopar devices --json",
    "validate": "autopar validate --json",
    "export": "autopar export --json",
    "profile-ops": "autopar profile ops --json",
    "profile-layer": "autopar profile layer --json",
    "profile-comm": "autopar profile comm --json",
    "verify": "autopar verify --json",
    "calibrate": "autopar calibrate --json",
    "plan": "autopar plan --json",
    # balance --json comes with the balancer branch (autopar.pipeline.balance_json.plan_document);
    # it is to print through autopar.cli.json_output.print_json("balance", ...) like the others.
    "balance": "autopar balance --json",
}


def schema_path(name: str) -> Path:
    """``autopar/data/schemas/{name}.schema.json``."""
    return SCHEMA_DIR / f"{name}.schema.json"


@lru_cache(maxsize=None)
def schema(name: str) -> dict[str, Any]:
    """The JSON Schema of document ``name`` (a :data:`DOCUMENTS` key, or ``common``)."""
    return json.loads(schema_path(name).read_text())


def schema_version(name: str) -> int:
    """The ``schema_version`` document ``name`` carries: its schema's ``const``."""
    return schema(name)["properties"]["schema_version"]["const"]


def versioned(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``schema_version`` and ``document`` first (a new dict; ``doc`` unchanged)."""
    if name not in DOCUMENTS:
        raise KeyError(f"no JSON document named {name!r}; known: {', '.join(DOCUMENTS)}")
    return {"schema_version": schema_version(name), "document": name, **doc}
