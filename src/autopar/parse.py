"""Parse the JSON and YAML files users hand to autopar (HF configs, search results, device files,
``--layers`` tables, ``--device-set`` values).

Both parsers read an integer literal of more than :data:`MAX_INT_DIGITS` digits as +-infinity
instead of failing: Python refuses to convert more than 4,300 digits (``ValueError: Exceeds the
limit ... sys.set_int_max_str_digits()``), which made a whole file unreadable, or crashed the
YAML reader, for one absurd value. As infinity it reaches the field's own range check, whose
error names the user's key (``field 'vocab_size'=inf must be an integer``).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

#: Digits beyond which an integer literal is read as infinity (no size or count has 300 digits).
MAX_INT_DIGITS = 300


def _int_or_inf(literal: str) -> int | float:
    """``int(literal)``, or +-inf when it has more than :data:`MAX_INT_DIGITS` digits."""
    digits = literal.lstrip("+-").replace("_", "")
    if len(digits) > MAX_INT_DIGITS:
        return float("-inf") if literal.startswith("-") else float("inf")
    return int(literal)


def json_loads(text: str) -> Any:
    """``json.loads`` with huge integers as +-inf (module doc).

    Raises:
        json.JSONDecodeError: not JSON (a ``ValueError``).
        RecursionError: arrays or objects nested beyond Python's recursion limit.
    """
    return json.loads(text, parse_int=_int_or_inf)


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with huge integers as +-inf (module doc)."""


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int | float:
    literal = loader.construct_scalar(node)
    if len(literal.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS:
        return float("-inf") if literal.startswith("-") else float("inf")
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` with huge integers as +-inf (module doc).

    Raises:
        yaml.YAMLError: not YAML.
        RecursionError: nested beyond Python's recursion limit.
    """
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def json_or_yaml(text: str) -> Any:
    """JSON, else YAML (YAML reads most JSON, but refuses some valid JSON, e.g. a control
    character such as DEL inside a string), with huge integers as +-inf.

    Raises:
        ValueError: neither parses (the YAML error's message, on one line).
        RecursionError: nested beyond Python's recursion limit.
    """
    try:
        return json_loads(text)
    except ValueError:
        try:
            return yaml_load(text)
        except yaml.YAMLError as err:
            raise ValueError(" ".join(str(err).split())) from None
