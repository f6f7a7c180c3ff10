"""Read the argument names of Megatron-LM's and MindSpeed-LLM's argument parsers from fetched git
copies (no framework code is imported, run or copied: only the ``--flag`` strings of their
``add_argument`` calls and the name of the function or feature file that adds each are kept).

Sources (the git directories ``fetch`` writes under ``/work/.mirror``):

* Megatron-LM ``megatron/training/arguments.py`` at a release tag. From late 2025 the main branch
  builds many arguments from dataclasses (``ArgumentGroupFactory``), which a static read of
  ``add_argument`` does not see, so the table is taken from the last release whose parser lists
  every flag literally.
* MindSpeed-LLM: ``mindspeed_llm/training/arguments.py`` and the ``register_args`` of every file
  under ``mindspeed_llm/features_manager/``; MindSpeed (which MindSpeed-LLM runs on):
  ``mindspeed/arguments.py`` and ``mindspeed/features_manager/``.
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One framework's parser files in a fetched git directory."""

    framework: str  # "megatron" | "mindspeed"
    git_dir: str
    rev: str
    prefixes: tuple[str, ...]  # files, or folders ending in "/"


def git(git_dir: str, *args: str) -> str:
    """Output of ``git --git-dir=GIT_DIR ARGS``."""
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def files(src: Source) -> list[str]:
    """The ``.py`` files of ``src`` under its prefixes, sorted."""
    names = git(src.git_dir, "ls-tree", "-r", "--name-only", src.rev).split()
    return sorted(n for n in names if n.endswith(".py") and any(
        n == p or (p.endswith("/") and n.startswith(p)) for p in src.prefixes))


def flags_of(text: str, path: str) -> list[tuple[str, str]]:
    """``(flag, group)`` for each ``--flag`` string of an ``add_argument`` call in ``text``; the
    group is the enclosing function (``_add_logging_args``) and, for feature files, the file."""
    tree = ast.parse(text)
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            func = node.name
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("add_argument", "_add_argument"):
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                        out.append((arg.value, func))
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "")
    short = path.removesuffix(".py")
    return [(flag, short if "features_manager" in path else f"{short}:{func}") for flag, func in out]


def read_source(src: Source) -> dict[str, str]:
    """``flag -> group`` of one framework (the first group that adds a flag)."""
    found: dict[str, str] = {}
    for path in files(src):
        for flag, group in flags_of(git(src.git_dir, "show", f"{src.rev}:{path}"), path):
            found.setdefault(flag, group)
    return found
