"""Shared pieces of the fuzz suite (``tests/fuzz/test_fuzz_*.py``, marker ``fuzz``).

Every fuzz property runs the real command line in-process (``autopar.cli.main`` inside typer's
``CliRunner`` isolation, so click's usage errors are formatted as users see them) on an input
mutated from a shipped one, and checks the contract of the README's "Bad input" paragraph
(:func:`check_outcome`):

* exit 0, with one JSON document on stdout where the command has ``--json`` (else the files the
  command was asked to write exist), or
* exit 2 with exactly one non-empty output line, starting ``error:``, that names the user's own
  key or option (one of the ``needles`` the generator knows it mutated);
* never another exit code (1 = a traceback); hypothesis' ``deadline`` bounds the time per example.

The hypothesis profile ``fuzz`` is deterministic (``derandomize=True``, no example database), so
CI runs the same examples each time. ``AUTOPAR_FUZZ_EXAMPLES=N`` runs N examples per property and
``AUTOPAR_FUZZ_RANDOM=1`` draws new ones each run, to search deeper by hand.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

settings.register_profile(
    "fuzz",
    derandomize=os.environ.get("AUTOPAR_FUZZ_RANDOM") != "1",
    database=None,
    deadline=60_000,  # ms of wall time per example: < 1 s of CPU each; 15 s seen on a loaded 2-core box
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_PROFILE = settings.get_profile("fuzz")


def fuzz_settings(max_examples: int) -> settings:
    """The ``fuzz`` profile with ``max_examples`` (overridden by ``AUTOPAR_FUZZ_EXAMPLES``)."""
    return settings(FUZZ_PROFILE, max_examples=int(os.environ.get("AUTOPAR_FUZZ_EXAMPLES", max_examples)))


# A JSON integer of 5,000 digits: beyond Python's default int/str conversion limit (4,300 digits).
HUGE_DIGITS = "9" * 5000
_HUGE = "__autopar_fuzz_huge_int__"


class Huge:
    """Placeholder for a 5,000-digit integer in a generated document (see :func:`dump_json`)."""

    def __repr__(self) -> str:
        return "Huge()"


def dump_json(doc: Any) -> str:
    """``json.dumps`` with every :class:`Huge` written as a 5,000-digit integer literal."""
    text = json.dumps(doc, default=lambda o: _HUGE if isinstance(o, Huge) else repr(o), ensure_ascii=False)
    return text.replace(f'"{_HUGE}"', HUGE_DIGITS)


#: Values a hand-edited config or result may hold instead of the right one.
ODD_VALUES = st.one_of(
    st.sampled_from([0, -1, -4096, 1, 3, 7, 2**31, 2**63, 10**30, 0.5, -0.0, 1e-300, 1e308, 4096.0, 4096.5,
                     float("inf"), float("nan"), "", " ", "8", "abc", "ß∂√", "\u202e", "1e3", "null", "[1]",
                     None, True, False, [], {}, [1, [2, [3]]], {"a": {"b": None}}, Huge()]),
    st.integers(min_value=-10**6, max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
)

#: Command-line option values as strings (click converts them; bad ones are usage errors).
ODD_OPTION_TEXT = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "3", "4", "8", "16", "64", "7", "1000000", str(2**63), HUGE_DIGITS,
                     "", " ", "1.5", "nan", "inf", "-inf", "abc", "ß", "1e3", "0x10", "true", "none", "full",
                     "selective", "interleaved", "1f1b", "bf16", "fp8", "1,1", "a,b", ",,,", "8,8,8,8", "full,none"]),
    st.integers(min_value=-3, max_value=200).map(str),
)


@dataclass
class Outcome:
    """One in-process run of the ``autopar`` command line."""

    args: list[str]
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None

    @property
    def lines(self) -> list[str]:
        """Non-empty lines of stdout and stderr together."""
        return [line for line in (self.stdout + "\n" + self.stderr).splitlines() if line.strip()]


_RUNNER = CliRunner()


def module_workdir(name: str):
    """A module-scoped scratch-directory fixture (``workdir = module_workdir("fuzz_x")``): the
    examples of a property overwrite the files in it."""
    @pytest.fixture(scope="module")
    def workdir(tmp_path_factory):
        return tmp_path_factory.mktemp(name)
    return workdir


def run_cli(args: Iterable[str]) -> Outcome:
    """Run ``autopar ARGS`` through the console entry point (:func:`autopar.cli.main`), in-process.

    An exception other than ``SystemExit`` is exit code 1, as the Python interpreter would report a
    traceback; it is kept in :attr:`Outcome.exception` for the failure message.
    """
    from autopar.cli import main

    args = [str(a) for a in args]
    exception: BaseException | None = None
    with _RUNNER.isolation() as streams:
        old_argv, sys.argv = sys.argv, ["autopar", *args]
        try:
            main(prog_name="autopar")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except Exception as err:  # noqa: BLE001 - a traceback is what the property looks for
            code, exception = 1, err
        finally:
            sys.argv = old_argv
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    return Outcome(args, code, stdout, stderr, exception)


def _describe(out: Outcome) -> str:
    exc = "" if out.exception is None else f"\nexception: {out.exception!r}"
    tail = "\n".join(out.lines[-6:])
    return f"autopar {' '.join(a if len(a) < 200 else a[:200] + '...' for a in out.args)}\nexit {out.exit_code}{exc}\n{tail}"


def check_outcome(out: Outcome, needles: Iterable[str] = (), *, json_stdout: bool = False,
                  files: Iterable[Path] = ()) -> None:
    """Assert the bad-input contract (module docstring) on one run.

    Args:
        out: the run.
        needles: the user's keys or options the input changed; an ``error:`` line must contain
            at least one (a string, case-insensitive, or a compiled regex). Empty: any ``error:``
            line will do.
        json_stdout: on success stdout must be one JSON document (the command ran with ``--json``).
        files: on success these paths must exist (what the command was asked to write).
    """
    assert out.exit_code in (0, 2), _describe(out)
    if out.exit_code == 0:
        if json_stdout:
            try:
                doc = json.loads(out.stdout)
            except ValueError:
                raise AssertionError(f"stdout is not JSON\n{_describe(out)}") from None
            assert _finite(doc), f"non-finite number in the JSON\n{_describe(out)}"
        for path in files:
            assert Path(path).exists(), f"{path} not written\n{_describe(out)}"
        return
    lines = out.lines
    assert len(lines) == 1 and lines[0].startswith("error: "), _describe(out)
    needles = [n for n in needles if n]
    if needles:
        low = lines[0].lower()
        assert any(n.search(lines[0]) if isinstance(n, re.Pattern) else n.lower() in low for n in needles), \
            f"the error names none of {needles}\n{_describe(out)}"


def _finite(doc: Any) -> bool:
    """No NaN or infinity anywhere in a parsed JSON document."""
    if isinstance(doc, float):
        return math.isfinite(doc)
    if isinstance(doc, dict):
        return all(_finite(v) for v in doc.values())
    if isinstance(doc, list):
        return all(_finite(v) for v in doc)
    return True


def key_needles(key: str) -> list[re.Pattern]:
    """How an error may name a config or file key: the key as a whole word (``'key'``, ``key=3``,
    ``device.key``, ``key*dp``)."""
    return [re.compile(rf"(?<![\w-]){re.escape(key)}(?![\w-])")]


def option_needles(option: str) -> list[str | re.Pattern]:
    """How an error may name a command-line option: ``--tp`` itself, or its field as a word
    (``tp=3``, ``mbs*dp``: the layout rules name the layout's fields)."""
    return [option, *key_needles(option.lstrip("-").replace("-", "_"))]
