"""SAPP / MindFormers-style pipeline arrays: ``offset`` and ``recompute`` per stage.

MindFormers (``docs/feature_cards/Offset_Recompute.md``, r1.5; ``recompute_config`` in the
r1.9 memory-optimisation guide): stage ``i`` holds ``num_layers // pipeline_stage + offset[i]``
layers, ``len(offset) == pipeline_stage`` and ``sum(offset) == num_layers % pipeline_stage``;
``recompute`` lists the layers fully recomputed per stage and ``select_recompute`` (True for
every layer, or a per-stage list of layer counts) the layers with selective recompute. With
virtual stages both become ``[vpp][pp]`` lists; every rank's chunks are equal (Megatron's
assignment, which autopar costs), so an uneven split needs each stage a multiple of vpp.
Recompute per stage (:attr:`~autopar.strategy.Strategy.recompute_per_stage`) is written as is.
"""

from __future__ import annotations

import json
from typing import Any

from autopar.errors import AutoparError
from autopar.export.layout_flags import stage_layers
from autopar.export.comm_knobs import require_cp_algorithms, require_no_tp_overlap
from autopar.export.per_stage import require_default_modules
from autopar.problem import Problem
from autopar.strategy import Strategy


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """``{"pipeline_stage", "pp_interleave_num", "offset", "recompute", "select_recompute"}``.

    Raises:
        AutoparError: with vpp > 1, a stage whose layers are not a multiple of vpp; recompute
            modules other than ``core_attn`` (:func:`~autopar.export.per_stage.require_default_modules`).
    """
    require_default_modules("SAPP", s)
    require_no_tp_overlap("SAPP", s, "its MindFormers arrays have no TP overlap setting")
    require_cp_algorithms("SAPP", s, ("p2p",))
    split = stage_layers(p, s)
    base = p.model.num_layers // s.pp
    if s.vpp > 1 and any(n % s.vpp for n in split):
        raise AutoparError(f"SAPP arrays: split {split} with vpp={s.vpp}: every stage needs a multiple of vpp layers")
    options = s.stage_recompute
    full = [min(n, s.recompute_layers or n) if r == "full" else 0 for n, r in zip(split, options)]
    selective = [n if r == "selective" else 0 for n, r in zip(split, options)]
    per_chunk = lambda counts: [[c // s.vpp for c in counts] for _ in range(s.vpp)]  # noqa: E731
    offset: list[Any] = [n - base for n in split]
    recompute: list[Any] = full
    select: Any = s.recompute == "selective"
    if s.recompute_per_stage:
        select = selective
    if s.vpp > 1:
        offset = [[n // s.vpp - base // s.vpp for n in split] for _ in range(s.vpp)]
        recompute = per_chunk(full)
        select = per_chunk(selective) if s.recompute_per_stage else select
    return {"pipeline_stage": s.pp, "pp_interleave_num": s.vpp, "offset": offset, "recompute": recompute,
            "select_recompute": select}


def write(p: Problem, s: Strategy) -> str:
    """The ``sapp`` export format (JSON text)."""
    return json.dumps(config(p, s), indent=2) + "\n"
