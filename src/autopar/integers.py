"""The one reading of a whole number a user typed: on the command line (every integer option,
``--tp 4``, a constraint set ``--pp 1,2,4``, ``--gbs-range``, ``--layers-per-stage``, ...) and in
a ``--config`` file.

Python's ``int()`` reads more than a user writes: ``int("1_0")`` is 10 (digit grouping) and
``int("２")`` is 2 (any Unicode decimal digit), while ``"2.0"`` is refused; typer's own coercion
and the hand-written splits disagreed on each (``search --tp ２`` accepted where ``estimate``
refused it; ``estimate --tp 2.0`` accepted, ``tp: 2.0`` in a config refused). Here an integer is
an optional sign and the ASCII digits 0-9, nothing else: strict, so ``2.0``, ``1_0``, ``２``,
``0x2`` and ``2e0`` are refused everywhere, with one message saying so.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"[+-]?[0-9]+")

INTEGER_RULE = "a whole number in the ASCII digits 0-9 (no '_', decimal point or exponent)"
"""What :func:`read_integer` accepts, for the error messages."""


def is_integer_text(text: str) -> bool:
    """Whether ``text`` is an optional ``+``/``-`` and ASCII digits only (surrounding spaces
    allowed, as in ``--pp "1, 2"``)."""
    return _INTEGER.fullmatch(text.strip(" ")) is not None


def read_integer(text: str) -> int | None:
    """``text`` as an int when :func:`is_integer_text`, else None (the caller names the option)."""
    return int(text.strip(" ")) if is_integer_text(text) else None
