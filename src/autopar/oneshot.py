"""One-shot planning (``autopar plan``; Tinker's one-shot mode): profile where a device is present,
search, and write everything the target framework runs into one folder.

The folder holds ``result.json`` (the search JSON, which ``autopar export --from`` reads), one
config per ranked layout in the target's own form (``rank1.sh`` for Megatron-LM, MindSpeed-LLM and
Megatron-Bridge, ``rank1.toml`` for torchtitan, ``rank1.json`` for Galvatron and SAPP, a folder
``rank1/`` with the DeepSpeed JSON and the Megatron-DeepSpeed script) and, where the machine could
profile, ``profile.db`` (the operator database the search then used, :mod:`autopar.profile`).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.search import SearchResult

# Export format -> file name suffix of one layout's config (FILE_WRITERS formats write a folder).
SUFFIXES: dict[str, str] = {"megatron": ".sh", "megatron-bridge": ".sh", "mindspeed": ".sh", "torchtitan": ".toml",
                            "galvatron": ".json", "sapp": ".json"}
RESULT_NAME = "result.json"
PROFILE_NAME = "profile.db"


def no_accelerator_reason() -> str | None:
    """Why this machine cannot profile operators (None when it can): torch is not installed, or
    torch sees no GPU (``torch.cuda.is_available()``, which also answers for ROCm builds)."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install -e '.[profile]')"
    import torch

    if not torch.cuda.is_available():
        return f"no GPU on this machine (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def layout_path(out: Path, target: str, rank: int) -> Path:
    """Where layout ``rank`` (1 = best) of a ``target`` plan goes in folder ``out``."""
    return out / f"rank{rank}{SUFFIXES.get(target, '')}"


def plan_paths(out: Path, target: str, top: int) -> list[Path]:
    """Every path :func:`write_plan` may write for ``top`` layouts (for the overwrite check)."""
    from autopar.export import FILE_PATHS

    paths = [out / RESULT_NAME, out / PROFILE_NAME]
    for rank in range(1, top + 1):
        where = layout_path(out, target, rank)
        paths += FILE_PATHS[target](where) if target in FILE_PATHS else [where]
    return paths


def write_plan(p: Problem, result: SearchResult, out: Path) -> tuple[list[Path], list[str]]:
    """Write ``result.json`` and each ranked layout's config for ``result.target`` into ``out``.

    Returns:
        ``(written, skipped)``: the paths written; one line per layout the target's writer refused
        (re-balancing can make one it cannot run, :func:`autopar.search.grid.refusal`).
    Raises:
        AutoparError: ``out`` cannot be created or written.
    """
    from autopar.export import FILE_WRITERS, WRITERS

    target = result.target
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / RESULT_NAME).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    except OSError as err:
        raise AutoparError(f"--out={str(out)!r}: cannot write ({err.strerror})") from None
    written, skipped = [out / RESULT_NAME], []
    for rank, e in enumerate(result.layouts, 1):
        where = layout_path(out, target, rank)
        try:
            text = WRITERS[target](p, e.strategy)
            if target in FILE_WRITERS:
                written += FILE_WRITERS[target](p, e.strategy, where)
            else:
                where.write_text(text)
                written.append(where)
        except AutoparError as err:
            skipped.append(f"#{rank}: {err}")
        except OSError as err:
            raise AutoparError(f"--out={str(out)!r}: cannot write {where.name} ({err.strerror})") from None
    return written, skipped
