"""Layout search: the vectorised grid search over the whole space (``grid.py``)."""

from autopar.search.grid import SearchResult, search

__all__ = ["SearchResult", "search"]
