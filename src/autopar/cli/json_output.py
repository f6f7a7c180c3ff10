"""``--json``: print one versioned document (:mod:`autopar.schemas`) on stdout and nothing else
(tables, progress and notes of a ``--json`` run go to stderr)."""

from __future__ import annotations

import json
import sys
from typing import Any

from autopar.schemas import versioned


def print_json(name: str, doc: dict[str, Any]) -> None:
    """Write document ``name`` (``doc`` with its ``schema_version``) to stdout, indented."""
    sys.stdout.write(json.dumps(versioned(name, doc), indent=2) + "\n")
