"""SAPP / MindFormers-style pipeline arrays: ``offset`` and ``recompute`` per stage.

MindFormers (``docs/feature_cards/Offset_Recompute.md``, r1.5): stage ``i`` holds
``num_layers // pipeline_stage + offset[i]`` layers, ``len(offset) == pipeline_stage`` and
``sum(offset) == num_layers % pipeline_stage``; ``recompute`` lists the layers recomputed per
stage. With virtual stages both become ``[vpp][pp]`` lists (chunks split evenly). Refused:
selective recompute with a layer count (MindFormers' ``select_recompute`` is per operator).
"""

from __future__ import annotations

import json
from typing import Any

from autopar.errors import AutoparError
from autopar.export.layout_flags import stage_layers
from autopar.problem import Problem
from autopar.strategy import Strategy


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """``{"pipeline_stage", "offset", "recompute", "select_recompute"}`` for layout ``s``.

    Raises:
        AutoparError: an uneven split with vpp > 1 (chunk split unknown).
    """
    split = stage_layers(p, s)
    base = p.model.num_layers // s.pp
    if s.vpp > 1 and len(set(split)) > 1:
        raise AutoparError(f"SAPP arrays: uneven split {split} with vpp={s.vpp} has no defined chunk split")
    recomputed = [min(n, s.recompute_layers or n) if s.recompute == "full" else 0 for n in split]
    offset: list[Any] = [n - base for n in split]
    recompute: list[Any] = recomputed
    if s.vpp > 1:
        offset = [[n // s.vpp - base // s.vpp for n in split] for _ in range(s.vpp)]
        recompute = [[min(r, n // s.vpp) for r, n in zip(recomputed, split)] for _ in range(s.vpp)]
    return {"pipeline_stage": s.pp, "pp_interleave_num": s.vpp, "offset": offset, "recompute": recompute,
            "select_recompute": s.recompute == "selective"}


def write(p: Problem, s: Strategy) -> str:
    """The ``sapp`` export format (JSON text)."""
    return json.dumps(config(p, s), indent=2) + "\n"
