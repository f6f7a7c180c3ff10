"""The balanced plan as data: SAPP arrays, Megatron layout, and the ``autopar balance --json`` document.

``plan_document`` is what ``balance --json`` prints (through :func:`autopar.cli.json_output.print_json`,
which adds ``schema_version`` and ``document``; schema ``autopar/data/schemas/balance.schema.json``): the split
(layers per stage and per chunk), the SAPP arrays (``offset``, ``recompute``, ``select_recompute``
in SAPP-PPB's ``[vpp][pp]`` shape, :func:`autopar.export.sapp.chunk_arrays`), the Megatron-LM
layout string, the recompute counts per chunk and option, per-stage memory (bytes) and times
(seconds per micro-batch), the simulated step and bubble, and how it was solved (solver, proven
optimal, MIP gap, time limit hit or not) for the balanced plan and the even split it replaces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autopar.export.sapp import chunk_arrays
from autopar.pipeline.balance import BalancePlan, PlanCost
from autopar.pipeline.layout import PipelineLayout

def sapp_arrays(plan: BalancePlan) -> dict[str, list]:
    """MindFormers' ``offset`` / ``recompute`` / ``select_recompute`` of the balanced plan: the
    layers of each chunk minus ``L // (pp * vpp)``, and how many of them run with full / selective
    recompute (:func:`autopar.export.sapp.chunk_arrays`); ``select_recompute`` counts every
    selective option, module sets (``selective:core_attn+mlp``) included: MindFormers has its own."""
    best = plan.best
    selective = sum((best.option_counts(name) for name in best.options if name.split(":")[0] == "selective"),
                    np.zeros(best.layers_per_chunk.shape, dtype=np.int64))
    return chunk_arrays(best.layers_per_chunk, best.option_counts("full"), selective)


def megatron_layout(plan: BalancePlan, mtp_num_layers: int = 0) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` of the balanced split (any chunks)."""
    return PipelineLayout.from_chunks(plan.best.layers_per_chunk, mtp_num_layers).megatron()


def _cost_document(cost: PlanCost, memory_limit_bytes: float) -> dict[str, Any]:
    return {
        "layers_per_stage": list(cost.layers_per_stage),
        "layers_per_chunk": cost.layers_per_chunk.tolist(),
        "recompute": list(cost.recompute),
        "recompute_counts": {name: cost.option_counts(name).tolist() for name in cost.options},
        "stage_memory_bytes": [float(x) for x in cost.stage_memory_bytes],
        "stage_time_s": [float(x) for x in cost.stage_time_s],
        "step_time_s": float(cost.makespan_s),
        "objective_s": float(cost.objective_s),
        "bubble_fraction": float(cost.bubble_fraction),
        "fits": bool(np.max(cost.stage_memory_bytes) <= memory_limit_bytes),
    }


def plan_document(plan: BalancePlan, mtp_num_layers: int = 0) -> dict[str, Any]:
    """The ``balance --json`` document of ``plan`` (module docstring); units in the key names,
    ``*_bytes`` bytes, ``*_s`` seconds."""
    pp, vpp = plan.best.layers_per_chunk.shape
    limit = plan.memory_limit_bytes
    even = None if plan.even is None else _cost_document(plan.even, limit)
    return {
        "pp": int(pp),
        "vpp": int(vpp),
        "schedule": plan.schedule,
        "num_microbatches": plan.num_microbatches,
        "memory_limit_bytes": float(plan.memory_limit_bytes),
        "solver": {"name": plan.solver, "optimal": plan.optimal, "mip_gap": plan.gap, "bound_s": plan.bound_s,
                   "time_limit_hit": plan.time_limit_hit, "time_limit_s": plan.time_limit_s,
                   "solve_time_s": float(plan.solve_time_s)},
        "balanced": _cost_document(plan.best, limit),
        "even": even,
        "gain": plan.gain,
        "sapp": sapp_arrays(plan),
        "megatron": {"pipeline_layout": megatron_layout(plan, mtp_num_layers),
                     "first_last": None if plan.megatron_first_last is None else list(plan.megatron_first_last)},
    }
