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

import numpy as np

from autopar.errors import AutoparError
from autopar.export.comm_knobs import require_cp_algorithms, require_default_moe, require_no_tp_overlap
from autopar.pipeline.layout import PipelineLayout, layout_of
from autopar.export.per_stage import require_default_modules
from autopar.problem import Problem
from autopar.strategy import Strategy


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """``{"pipeline_stage", "pp_interleave_num", "offset", "recompute", "select_recompute"}``.

    ``offset``: each chunk's layers minus ``L // (pp * vpp)``
    (:meth:`~autopar.pipeline.layout.PipelineLayout.sapp_offsets`; ``[vpp][pp]`` with vpp, any
    unequal chunks included); ``recompute`` / ``select_recompute`` per chunk the same way.

    Raises:
        AutoparError: recompute modules other than ``core_attn``
            (:func:`~autopar.export.per_stage.require_default_modules`); MTP layers off the last stage
            (MindFormers builds them after the last decoder layer).
    """
    require_default_modules("SAPP", s)
    require_no_tp_overlap("SAPP", s, "its MindFormers arrays have no TP overlap setting")
    require_cp_algorithms("SAPP", s, ("p2p",))
    require_default_moe("SAPP", s, "MindFormers' MoE runs its own dispatch")
    layout = layout_of(p, s)
    if layout.mtp_rank != s.pp - 1:
        raise AutoparError(f"SAPP arrays: layout {layout.megatron()} puts the MTP layers on stage "
                           f"{layout.mtp_rank}; MindFormers places them on the last stage")
    chunks = layout.decoder  # (pp, vpp)
    options = s.stage_recompute
    full = [[min(int(n), s.recompute_layers or int(n)) if options[r] == "full" else 0 for n in row]
            for r, row in enumerate(chunks)]
    selective = [[int(n) if options[r] == "selective" else 0 for n in row] for r, row in enumerate(chunks)]
    by_chunk = lambda counts: [[row[v] for row in counts] for v in range(s.vpp)]  # noqa: E731  [vpp][pp]
    recompute: list[Any] = [sum(row) for row in full]
    select: Any = s.recompute == "selective"
    if s.recompute_per_stage:
        select = [sum(row) for row in selective]
    if s.vpp > 1:
        recompute = by_chunk(full)
        select = by_chunk(selective) if s.recompute_per_stage else select
    return {"pipeline_stage": s.pp, "pp_interleave_num": s.vpp, "offset": layout.sapp_offsets(),
            "recompute": recompute, "select_recompute": select}


def write(p: Problem, s: Strategy) -> str:
    """The ``sapp`` export format (JSON text)."""
    return json.dumps(config(p, s), indent=2) + "\n"


def chunk_arrays(layers_per_chunk: np.ndarray, full_counts: np.ndarray, selective_counts: np.ndarray) -> dict[str, Any]:
    """The :func:`config` fields (``pipeline_stage``, ``pp_interleave_num``, MindFormers' ``offset`` /
    ``recompute`` / ``select_recompute``) of a split with recompute layer counts per chunk (what
    ``autopar balance`` chooses; a Strategy has one option per stage), in SAPP-PPB's shape: ``[vpp][pp]``
    lists (a flat list of pp with vpp 1). E.g. SAPP-PPB's documented Llama-2 run (pp 16, vpp 2):
    ``offset [[0,...,0,1,1], [0,...,0,-2]]``, ``recompute [[3,1,1,1,1,0,...], [0,...]]``
    (MindSpore hyper_parallel ``auto_parallel/sapp_ppb/README.md``).

    Args:
        layers_per_chunk, full_counts, selective_counts: ``(pp, vpp)`` decoder layers of each
            chunk, and how many of them run with full / selective recompute.
    """
    layers = np.asarray(layers_per_chunk, dtype=np.int64)
    pp, vpp = layers.shape

    def by_chunk(counts: np.ndarray) -> list:
        rows = np.asarray(counts, dtype=np.int64).T.tolist()  # [chunk][stage]
        return rows[0] if vpp == 1 else rows

    return {"pipeline_stage": int(pp), "pp_interleave_num": int(vpp),
            "offset": PipelineLayout.from_chunks(layers).sapp_offsets(), "recompute": by_chunk(full_counts),
            "select_recompute": by_chunk(selective_counts)}
