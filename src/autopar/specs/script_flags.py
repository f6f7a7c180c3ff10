"""Every training-script flag is read, known to have no effect on cost, or refused: never dropped.

The table ``autopar/data/script_flags.json`` (written by ``tools/script_flags.py`` from the
argument code of Megatron-LM and MindSpeed-LLM / MindSpeed; the versions are in its ``sources``)
classifies each framework flag as

* ``modelled``: read by the script reader (:func:`reader_flags`, derived from the reader's own
  source, so the table and the code cannot disagree; ``tests/specs/test_script_flags.py`` checks it);
* ``no_effect``: no effect on memory or step time (data paths, logging, checkpoint I/O, tokenizer,
  seeds, learning-rate schedule, ...), with the reason; an entry with ``only`` accepts just those
  values (``--optimizer adam``: another optimizer has other state);
* ``refused``: changes cost in a way autopar does not model; the reason is printed.

A flag the table does not hold is refused as unknown (a newer framework version added it, so its
effect cannot be costed).
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

_FLAG = re.compile(r"--[a-z0-9][a-z0-9_-]*")
# Modules of the launch-script reader that read training flags (script_launch reads the
# launcher's own options, script_cli autopar's CLI defaults, this module the table).
_NOT_READERS = {"script_launch", "script_cli", "script_flags"}
# autopar's own option, named in the reader's messages about the script file.
_AUTOPAR_OPTIONS = {"--script"}


def reader_modules() -> list[Path]:
    """Source files of the script reader: ``autopar/specs/script*.py`` but the launcher, CLI and
    table modules (``_NOT_READERS``)."""
    here = Path(__file__).parent
    return sorted(p for p in here.glob("script*.py") if p.stem not in _NOT_READERS)


@lru_cache(maxsize=1)
def reader_flags() -> frozenset[str]:
    """The flags the script reader reads: every string constant that is exactly a ``--flag`` in
    the reader's modules (:func:`reader_modules`), but those of the ``MINDSPEED_FLAGS`` set, which
    only tells the framework apart."""
    found: set[str] = set()
    for path in reader_modules():
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MINDSPEED_FLAGS" for t in node.targets):
                skip.update(id(n) for n in ast.walk(node.value))
        found.update(node.value for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and _FLAG.fullmatch(node.value) and id(node) not in skip)
    return frozenset(found - _AUTOPAR_OPTIONS)


@lru_cache(maxsize=1)
def flag_table() -> dict[str, Any]:
    """The packaged table: ``{"sources": {...}, "flags": {flag: {"class", "reason", "frameworks",
    "groups"[, "only"]}}}``."""
    text = resources.files("autopar").joinpath("data/script_flags.json").read_text()
    return json.loads(text)


def table_versions() -> str:
    """The framework versions the table was taken from, for messages."""
    return ", ".join(f"{s['name']} {s['version']}" for s in flag_table()["sources"].values())


def check_flags(a: Args) -> None:
    """Refuse a script flag the table refuses, or one it does not hold (see the module docstring).

    Raises:
        AutoparError: one line naming the first such flag (in script order) and why; or a
            ``no_effect`` flag with a value outside its ``only`` list.
    """
    read, flags = reader_flags(), flag_table()["flags"]
    for flag in a.values:
        if flag in read:
            continue
        entry = flags.get(flag)
        if entry is None:
            raise AutoparError(f"{a.source}: {flag} is unknown to autopar's table of {table_versions()}, so its "
                               "effect cannot be costed; remove it or use a framework version the table covers")
        if entry["class"] == "refused":
            raise AutoparError(f"{a.source}: {flag} is not modelled by autopar: {entry['reason']}")
        only = entry.get("only")
        if only and (value := a.text(flag)) not in only:
            raise AutoparError(f"{a.source}: {flag}={value!r}: autopar costs only {', '.join(only)} "
                               f"({entry['reason']})")
