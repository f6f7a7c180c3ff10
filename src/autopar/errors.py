"""The one error type users see.

Every mistake a user can make (a missing config field, an unknown device, a layout that breaks a
Megatron-LM rule) raises :class:`AutoparError` with a single line that names the field, the value
and what is allowed. The CLI prints that line and exits with code 2; it never shows a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError


class AutoparError(ValueError):
    """A user-facing input error; ``str(err)`` is one line: field, value, what is allowed."""


class LayoutError(AutoparError):
    """An explicit parallel layout breaks one or more validity rules.

    Attributes:
        rules: the names of the rules that failed, in check order (see :mod:`autopar.rules`).
    """

    def __init__(self, message: str, rules: tuple[str, ...]):
        super().__init__(message)
        self.rules = rules


def from_validation_error(err: ValidationError, prefix: str, as_option: bool = False,
                          names: dict[str, str] | None = None) -> AutoparError:
    """Turn a pydantic ``ValidationError`` into one readable :class:`AutoparError` line.

    Args:
        err: the pydantic error (one or more field problems).
        prefix: what was being validated, e.g. ``"model"`` or ``"device"``.
        as_option: name each field as the command-line option that sets it (``recompute_layers``
            -> ``--recompute-layers``) instead of ``prefix.field``; cross-field messages keep ``prefix``.
        names: field -> the user's own name for it (an HF config key, a launch-script flag):
            such a field is shown as ``{prefix}: {name}=value``, and cross-field messages have
            the field names replaced (``num_kv_heads`` -> ``--num-query-groups``).
    """
    names = names or {}

    def rename(text: str) -> str:
        for field, name in sorted(names.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"(?<![\w-]){re.escape(field)}(?![\w-])", name, text)
        return text

    parts = []
    for item in err.errors():
        field = ".".join(str(x) for x in item["loc"])
        name = (f"{prefix}: {names[field]}" if field in names else "--" + field.replace("_", "-") if as_option
                else f"{prefix}.{field}")
        value = item.get("input")
        msg = rename(item["msg"].removeprefix("Value error, "))
        if not field:  # a cross-field check: its message names the fields
            parts.append(f"{prefix}: {msg}")
        elif item["type"] == "missing":
            parts.append(f"{name}: missing (required)")
        else:
            parts.append(f"{name}={value!r}: {msg}")
    return AutoparError("; ".join(parts))


def read_text(path: str | Path, option: str, expected: str) -> str:
    """The text of a file the user named with ``option``.

    Raises:
        AutoparError: ``{option}={path!r}: cannot read (reason)`` when the file cannot be opened,
            ``... not a text file (expected)`` when it is not UTF-8 (e.g. a binary file).
    """
    try:
        return Path(path).read_text()
    except OSError as err:
        raise AutoparError(f"{option}={str(path)!r}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise AutoparError(f"{option}={str(path)!r}: not a text file ({expected})") from None
