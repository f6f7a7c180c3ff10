"""The one error type users see.

Every mistake a user can make (a missing config field, an unknown device, a layout that breaks a
Megatron-LM rule) raises :class:`AutoparError` with a single line that names the field, the value
and what is allowed. The CLI prints that line and exits with code 2; it never shows a traceback.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic is imported by the specs that raise it, not by every command (`autopar --help`)
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
        names: field -> the user's own name for it (a launch-script flag): such a field is shown
            as ``{prefix}: {name}=value``. Cross-field messages name fields themselves: pass the same
            map as the validation context (``model_validate(..., context={"names": names})``, see
            :meth:`autopar.specs.model.ModelSpec`).
    """
    names = names or {}
    parts = []
    for item in err.errors():
        field = ".".join(str(x) for x in item["loc"])
        name = (f"{prefix}: {names[field]}" if field in names else "--" + field.replace("_", "-") if as_option
                else f"{prefix}.{field}")
        value = item.get("input")
        msg = item["msg"].removeprefix("Value error, ")
        if not field:  # a cross-field check: its message names the fields
            parts.append(f"{prefix}: {msg}")
        elif item["type"] == "missing":
            parts.append(f"{name}: missing (required)")
        else:
            parts.append(f"{name}={value!r}: {msg}")
    return AutoparError("; ".join(parts))


# What a path is when it is not a regular file (``stat.S_IFMT`` of its mode).
_FILE_KINDS = {stat.S_IFIFO: "a named pipe (FIFO)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def regular_file(path: str | Path, option: str) -> Path:
    """``path`` as a :class:`~pathlib.Path` when it names an existing regular file (symlinks followed).

    Checked before reading: a FIFO would block the read forever and ``/dev/null`` reads as an
    empty file, so both are refused by kind rather than read.

    Raises:
        AutoparError: ``{option}={path!r}: `` then ``does not exist``, ``is a broken symlink``,
            ``is a symlink loop``, ``is a directory``, ``not a regular file (a named pipe (FIFO))``
            (or a device, a socket), or ``cannot read (reason)``.
    """
    head = f"{option}={str(path)!r}"
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise AutoparError(f"{head}: is a symlink loop (the links point at each other)") from None
        if err.errno == errno.ENOENT and os.path.islink(path):
            raise AutoparError(f"{head}: is a broken symlink (to {os.readlink(path)!r}, which does not exist)") from None
        if err.errno == errno.ENOENT:
            raise AutoparError(f"{head}: does not exist") from None
        raise AutoparError(f"{head}: cannot read ({err.strerror or err})") from None
    except ValueError as err:  # a NUL byte in the path
        raise AutoparError(f"{head}: not a file name ({err})") from None
    if stat.S_ISDIR(mode):
        raise AutoparError(f"{head}: is a directory; give a file")
    if not stat.S_ISREG(mode):
        raise AutoparError(f"{head}: not a regular file ({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')})")
    return Path(path)


def read_text(path: str | Path, option: str, expected: str) -> str:
    """The text of a file the user named with ``option``.

    Raises:
        AutoparError: what :func:`regular_file` raises; ``{option}={path!r}: cannot read (reason)``
            when the file cannot be opened, ``... not a text file (expected)`` when it is not
            UTF-8 (e.g. a binary file).
    """
    try:
        return regular_file(path, option).read_text()
    except OSError as err:
        raise AutoparError(f"{option}={str(path)!r}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise AutoparError(f"{option}={str(path)!r}: not a text file ({expected})") from None
