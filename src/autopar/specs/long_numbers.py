"""JSON and YAML loading that keeps absurdly long integer literals as text.

Python refuses ``int()`` of more than 4,300 digits with a message suggesting
``sys.set_int_max_str_digits()``, raised while parsing, before the key is known; and a 300-digit
value would fill the error line. Here such a literal becomes a :class:`LongNumber` (a ``str``),
which the reader that uses the key refuses by name (``vocab_size=<a 5000-digit number>: too
large``); keys nobody reads stay harmless.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

# More digits than any input field can use: sizes stop at 2^31 (10 digits), float fields at 1e18.
MAX_DIGITS = 30


class LongNumber(str):
    """An integer literal of more than :data:`MAX_DIGITS` digits, kept as its text."""

    def __repr__(self) -> str:
        return f"<a {len(self.lstrip('+-'))}-digit number>"


def parse_int(text: str) -> int | LongNumber:
    """``json.loads``'s ``parse_int``: short literals as ``int``, long ones as :class:`LongNumber`."""
    return LongNumber(text) if len(text.lstrip("+-")) > MAX_DIGITS else int(text)


def json_loads(text: str) -> Any:
    """``json.loads`` with :func:`parse_int`.

    Raises:
        json.JSONDecodeError, RecursionError: as ``json.loads``.
    """
    return json.loads(text, parse_int=parse_int)


@cache
def _loader() -> type:
    """``yaml.SafeLoader`` whose long decimal integers become :class:`LongNumber` and that refuses
    a key given twice in one mapping (PyYAML keeps the last silently: two ``search:`` sections of a
    ``--config`` file, two ``memory_bytes`` of a device file); built on first use: yaml is
    imported only by the commands that read YAML."""
    import yaml

    def construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int | LongNumber:
        text = str(loader.construct_scalar(node)).replace("_", "")
        if len(text.lstrip("+-")) > MAX_DIGITS and text.lstrip("+-").isdigit():
            return LongNumber(text)
        return yaml.SafeLoader.construct_yaml_int(loader, node)

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' then an explicit key overriding it is YAML's own merge rule
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue  # an unhashable key: SafeLoader names it
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} on lines {first} and {key_node.start_mark.line + 1} (YAML "
                    "keeps only the last; give each key once)", key_node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    loader = type("_Loader", (yaml.SafeLoader,), {"construct_mapping": construct_mapping})
    loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    return loader


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` with long decimal integers kept as :class:`LongNumber`.

    Raises:
        yaml.YAMLError, RecursionError: as ``yaml.safe_load``; a ``ConstructorError`` for a key
            given twice in one mapping (``duplicate key 'search' on lines 1 and 3 ...``).
    """
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 (a SafeLoader subclass)


def json_or_yaml(text: str) -> Any:
    """JSON, else YAML, both with long integers as :class:`LongNumber`. JSON first: YAML reads most
    JSON but refuses some valid JSON, e.g. a control character such as DEL inside a string.

    Raises:
        ValueError: neither parses (the YAML error's message, on one line).
        RecursionError: nested beyond Python's recursion limit.
    """
    try:
        return json_loads(text)
    except ValueError:
        import yaml

        try:
            return yaml_load(text)
        except yaml.YAMLError as err:
            raise ValueError(" ".join(str(err).split())) from None


def too_large(key: str, value: Any, bound: str) -> str | None:
    """``key=<a N-digit number>: too large (bound)`` when ``value`` is a :class:`LongNumber`, else None."""
    return f"{key}={value!r}: too large ({bound})" if isinstance(value, LongNumber) else None
