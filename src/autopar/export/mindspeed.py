"""MindSpeed-LLM launch arguments (Ascend): Megatron-LM flags in the MindSpeed dialect.

Differences from Megatron-LM (``shared/reference/ecosystem.md`` section 2): uneven pipeline
splits are ``--num-layer-list a,b,...`` (not combinable with virtual stages), virtual stages are
``--num-layers-per-virtual-pipeline-stage``, context parallelism names its algorithm
(``--context-parallel-algo megatron_cp_algo``, the ring that autopar models), and there is no
Megatron FSDP (ZeRO-2/3) or fp8. The fused-kernel switches below are MindSpeed-LLM's usual
ones; each is a row of :data:`FUSED_FLAGS`.
"""

from __future__ import annotations

from typing import Callable

from autopar.export.megatron import launch_script
from autopar.problem import Problem
from autopar.strategy import Strategy

# (flag, when it applies): MindSpeed-LLM kernel switches for the model (README of MindSpeed-LLM).
FUSED_FLAGS: tuple[tuple[str, Callable[[Problem], bool]], ...] = (
    ("--use-mcore-models", lambda p: True),
    ("--use-fused-rmsnorm", lambda p: p.model.norm == "rmsnorm"),
    ("--use-fused-swiglu", lambda p: p.model.gated_mlp),
    ("--use-fused-rotary-pos-emb", lambda p: p.model.position_embedding == "rope"),
)


def write(p: Problem, s: Strategy) -> str:
    """The ``mindspeed`` export format: a launch script in the MindSpeed-LLM dialect.

    Raises:
        AutoparError: uneven split with vpp > 1, ZeRO-2/3, or fp8 (see the module docstring).
    """
    extra = tuple(flag for flag, applies in FUSED_FLAGS if applies(p))
    return launch_script(p, s, "mindspeed", extra)
