"""The runnable examples of the documentation (``docs/**/*.md``): find, run and check them, or
rewrite their shown output after a change (``python tools/docs_examples.py --update``).

An example is a fenced ``console`` block. Each line starting with ``$ autopar`` is a command
(a trailing ``\\`` continues it on the next line); the lines up to the next command are its
shown output. A line ``...`` elides output: the lines shown are checked in order, not
necessarily adjacent. Timings (``in 0.11 s``) are masked on both sides. The commands of one
block run in-process (typer's ``CliRunner``), in order, in one scratch directory, so a block
may read what an earlier command of the same block wrote (``search --report r`` then
``export --from r/result.json``). ``tests/docs/test_docs_examples.py`` runs every block.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^```console\n(.*?)^```\n", re.S | re.M)
TIMING = re.compile(r"\bin \d+(?:\.\d+)? s\b")
ELISION = "..."


@dataclass
class Example:
    """One ``$ autopar ...`` command of a block and the output lines the docs show for it."""
    argv: list[str]
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    """One ``console`` block: where it is (file, character span of its body) and its examples."""
    path: Path
    span: tuple[int, int]
    examples: list[Example]


def parse_block(body: str) -> list[Example]:
    """The examples of one block body (see the module docstring for the format)."""
    examples: list[Example] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            argv = shlex.split(command)
            if argv[0] != "autopar":
                raise ValueError(f"only autopar commands run in-process: {command!r}")
            examples.append(Example(argv[1:]))
        elif examples:
            examples[-1].shown.append(line)
        i += 1
    return examples


def blocks(docs: Path = DOCS) -> list[Block]:
    """Every console block with at least one ``$ autopar`` command under ``docs``, by file."""
    out = []
    for path in sorted(docs.rglob("*.md")):
        text = path.read_text()
        for m in FENCE.finditer(text):
            examples = parse_block(m.group(1))
            if examples:
                out.append(Block(path, m.span(1), examples))
    return out


@contextmanager
def scratch_dir():
    """Run the body in a fresh temporary directory (``contextlib.chdir`` is Python 3.11+)."""
    before = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(before)


def mask(line: str) -> str:
    """``line`` without trailing blanks and with its timings replaced (``in <t> s``)."""
    return TIMING.sub("in <t> s", line.rstrip())


def run(argv: list[str]) -> tuple[int, str]:
    """Run ``autopar ARGV`` in-process; (exit code, output)."""
    from typer.testing import CliRunner

    from autopar.cli import app

    result = CliRunner().invoke(app, argv)
    return result.exit_code, result.output


def missing_lines(shown: list[str], output: str) -> list[str]:
    """The shown lines (masked, elisions and blank lines skipped) that the output does not
    contain in that order; empty when the docs agree with the program."""
    actual = [mask(line) for line in output.splitlines()]
    missing, at = [], 0
    for line in shown:
        want = mask(line)
        if not want.strip() or want.strip() == ELISION:
            continue
        try:
            at = actual.index(want, at) + 1
        except ValueError:
            missing.append(line)
    return missing


def update(docs: Path = DOCS) -> int:
    """Rewrite the shown output of every example that no longer matches with what it prints
    now, except examples with an ``...`` line (their subset is chosen by hand; they still run, in order); the number
    of files changed."""
    changed = 0
    for path in sorted({b.path for b in blocks(docs)}):
        text = path.read_text()
        new_parts, last = [], 0
        for m in FENCE.finditer(text):
            examples = parse_block(m.group(1))
            if not examples:
                continue
            body = []
            with scratch_dir():
                for e in examples:
                    code, output = run(e.argv)
                    body.append("$ " + shlex.join(["autopar", *e.argv]))
                    if any(line.strip() == ELISION for line in e.shown) or not missing_lines(e.shown, output):
                        body += e.shown  # a hand-chosen subset, or still right (timings aside)
                    else:
                        body += [line.rstrip() for line in output.rstrip("\n").splitlines()]
            new_parts += [text[last:m.start(1)], "\n".join(body) + "\n"]
            last = m.end(1)
        new = "".join(new_parts) + text[last:]
        if new != text:
            path.write_text(new)
            changed += 1
    return changed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the shown output of the examples")
    args = parser.parse_args()
    if args.update:
        print(f"{update()} file(s) rewritten")
    else:
        for b in blocks():
            print(b.path.relative_to(DOCS), len(b.examples), "example(s)")
