"""The training command of a launch script and its arguments.

:func:`find_launch` finds the first ``torchrun`` / ``python -m torch.distributed.run`` /
``python X.py`` command evaluated by :class:`autopar.specs.bash.ShellScript`, reads the
launcher's ``--nnodes`` / ``--nproc_per_node`` and groups the training script's words into
:class:`Args` (argparse semantics: the last occurrence of a flag wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autopar.errors import AutoparError
from autopar.specs.bash import ShellScript, unknown_reason
from autopar.specs.bash_arith import evaluate

_LAUNCH_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


@dataclass(frozen=True)
class Args:
    """Training-script arguments: ``values[flag]`` = the words after the *last* occurrence of
    ``flag`` (argparse: the last one wins); ``source`` names the script for error messages."""

    values: dict[str, list[str]]
    source: str

    @classmethod
    def parse(cls, argv: list[str], source: str) -> "Args":
        """Group ``argv`` into ``--flag value...`` (``--flag=value`` accepted)."""
        values: dict[str, list[str]] = {}
        current: list[str] | None = None
        for word in argv:
            if word.startswith("--"):
                name, eq, val = word.partition("=")
                current = values[name] = [val] if eq else []
            elif current is not None:
                current.append(word)
        return cls(values, source)

    def has(self, flag: str) -> bool:
        return flag in self.values

    def text(self, flag: str, default: str | None = None) -> str | None:
        """The flag's value as one string (words joined by spaces), or ``default`` if absent.

        Raises:
            AutoparError: the value is only known at run time, or the flag has no value.
        """
        if flag not in self.values:
            return default
        words = self.values[flag]
        if not words:
            raise AutoparError(f"{self.source}: {flag} has no value")
        value = " ".join(words)
        why = unknown_reason(value)
        if why:
            raise AutoparError(f"{self.source}: {flag} cannot be read ({why}); write its value in the script")
        return value

    def integer(self, flag: str, default: int | None = None) -> int | None:
        """The flag's value as an integer (``$((...))`` already expanded), or ``default``.

        Raises:
            AutoparError: not an integer, or unknown at run time.
        """
        value = self.text(flag)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise AutoparError(f"{self.source}: {flag}={value!r}: expected an integer") from None

    def number(self, flag: str, default: float) -> float:
        value = self.text(flag)
        try:
            return default if value is None else float(value)
        except ValueError:
            raise AutoparError(f"{self.source}: {flag}={value!r}: expected a number") from None

    def frequency(self, flag: str, default: str, example: str) -> int | list:
        """A Megatron layer-frequency flag (``moe_freq_type``): an integer >= 1 or an evaluated
        list expression such as ``([0]*3+[1]*58)``; ``example`` is shown when it is below 1.

        Raises:
            AutoparError: an unreadable expression, or an integer below 1.
        """
        text = self.text(flag, default)
        try:
            value = evaluate(text)
        except AutoparError as err:
            raise AutoparError(f"{self.source}: {flag}={text!r}: {err}") from None
        if isinstance(value, int) and value < 1:
            raise AutoparError(f"{self.source}: {flag}={value}: must be >= 1 or a list such as {example}")
        return value

    def probability(self, flag: str, default: float) -> float:
        """A dropout rate: a number in [0, 1) (``nan`` or ``-1`` would silently mean "no dropout", 1
        drops every element).

        Raises:
            AutoparError: not a number, or outside [0, 1).
        """
        value = self.number(flag, default)
        if not 0 <= value < 1:  # also false for nan
            raise AutoparError(f"{self.source}: {flag}={value}: must be a probability in [0, 1) (1 drops every "
                               "element)")
        return value

    def size(self, flag: str, default: int | None = None) -> int | None:
        """A width or count that must be >= 1 when given (Megatron has no meaning for 0).

        Raises:
            AutoparError: not an integer, or below 1.
        """
        value = self.integer(flag)
        if value is None:
            return default
        if value < 1:
            raise AutoparError(f"{self.source}: {flag}={value}: must be an integer >= 1")
        return value

    def require(self, flag: str) -> int:
        """An integer flag Megatron has no default for.

        Raises:
            AutoparError: absent ("add FLAG N"), or not an integer.
        """
        value = self.integer(flag)
        if value is None:
            raise AutoparError(f"{self.source}: {flag} is missing; add {flag} N to the script")
        return value


@dataclass(frozen=True)
class Launch:
    """The training command found in the script: launcher options and training arguments."""

    nnodes: int
    nproc_per_node: int
    args: Args
    script: str


def find_launch(sh: ShellScript, source: str) -> Launch:
    """The first ``torchrun`` / ``python -m torch.distributed.run`` / ``python X.py`` command.

    Raises:
        AutoparError: no launch command, or an ``--nnodes``/``--nproc_per_node`` value that is
            a range or only known at run time.
    """
    for _, argv in sh.commands:
        words = _cut_at_operator(argv)
        start = _launcher_end(words)
        if start is None:
            continue
        py = next((i for i in range(start, len(words)) if words[i].endswith(".py")), None)
        if py is None:
            continue
        opts = Args.parse(words[start:py], source)
        nnodes = _launcher_int(opts, ("--nnodes",), source)
        nproc = _launcher_int(opts, ("--nproc_per_node", "--nproc-per-node"), source)
        return Launch(nnodes, nproc, Args.parse(words[py + 1:], source), words[py])
    raise AutoparError(f"{source}: no launch command found (expected torchrun, python -m "
                       "torch.distributed.run or python <script>.py with training arguments)")


def _cut_at_operator(argv: list[str]) -> list[str]:
    for i, w in enumerate(argv):
        if w and set(w) <= set(";&|<>"):
            return argv[:i]
    return argv


def _launcher_end(words: list[str]) -> int | None:
    """Index of the first launcher option, or None if ``words`` is not a launch command."""
    if not words:
        return None
    prog = Path(words[0]).name
    if prog == "torchrun":
        return 1
    if re.fullmatch(r"python[\d.]*", prog):
        if len(words) > 2 and words[1] == "-m" and words[2] in _LAUNCH_MODULES:
            return 3
        return 1
    return None


def _launcher_int(opts: Args, names: tuple[str, ...], source: str) -> int:
    """The launcher's ``--nnodes`` / ``--nproc_per_node`` (the first of ``names`` given), else 1.

    Raises:
        AutoparError: not a fixed integer >= 1 (an elastic range ``1:4``, ``0``, or more digits
            than any cluster: a 5,000-digit value was a ValueError traceback).
    """
    for name in names:
        if opts.has(name):
            value = opts.text(name) or ""
            if not (value.isascii() and value.isdigit()):
                raise AutoparError(f"{source}: launcher {name}={value!r}: expected a fixed integer "
                                   f"(elastic ranges are not planned); pass --nodes/--devices-per-node")
            if len(value) > 9 or int(value) < 1:
                shown = value if len(value) <= 20 else f"{value[:20]}... ({len(value)} digits)"
                raise AutoparError(f"{source}: launcher {name}={shown}: must be an integer in 1..999999999")
            return int(value)
    return 1
