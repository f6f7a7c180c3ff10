"""Measurement hooks of the cost model: a value installed in a context variable for a ``with``
block (measured operator times in :mod:`autopar.cost.compute`, collective fits in
:mod:`autopar.cost.comm`). Context variables keep concurrent estimates independent."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator


@contextmanager
def installed(var: ContextVar[Any], value: Any) -> Iterator[None]:
    """``var`` set to ``value`` inside the ``with`` block, restored after it (also on error)."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
