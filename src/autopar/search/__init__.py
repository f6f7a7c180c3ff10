"""Layout search: the vectorised grid search over the whole space (``grid.py``).

``search`` and ``SearchResult`` are imported on first use, so importing a light submodule (the
constraints the command line parses) does not load the costing and export machinery.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SearchResult", "search"]


def __getattr__(name: str) -> Any:
    """``autopar.search.search`` / ``SearchResult`` from :mod:`autopar.search.grid`, on first use."""
    if name in __all__:
        from autopar.search import grid

        return getattr(grid, name)
    raise AttributeError(f"module 'autopar.search' has no attribute {name!r}")
