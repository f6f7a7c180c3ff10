"""Which export formats can write a different recompute option per pipeline stage.

Megatron-LM (``--recompute-granularity``/``--recompute-method``/``--recompute-num-layers``),
MindSpeed-LLM (the same flags), torchtitan (``[activation_checkpoint] mode``) and DeepSpeed
(``activation_checkpointing``, one section) apply one recompute setting to every stage, so a
layout with :attr:`~autopar.strategy.Strategy.recompute_per_stage` cannot run there unchanged:
their writers refuse it with :func:`require_uniform_recompute` rather than drop it. MindFormers
SAPP (per-stage ``recompute`` / ``select_recompute`` layer counts, ``docs/feature_cards/
Offset_Recompute.md``) writes any mix; Galvatron (per-layer ``checkpoint`` flags) writes mixes
of ``none`` and ``full``. ``autopar search --target FORMAT`` only ranks per-stage recompute
for the formats listed in :data:`PER_STAGE_OPTIONS`. Selective recompute with other modules than
``core_attn`` (Megatron-LM's ``--recompute-modules``) is written by the Megatron-LM writer only;
the others refuse it with :func:`require_default_modules`.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, Strategy

# Export format -> recompute options it can set stage by stage.
PER_STAGE_OPTIONS: dict[str, tuple[str, ...]] = {"sapp": ("none", "selective", "full"), "galvatron": ("none", "full")}
# Export formats that write selective recompute of other modules than core_attn.
MODULE_TARGETS: tuple[str, ...] = ("megatron", "megatron-bridge")


def require_uniform_recompute(framework: str, s: Strategy) -> None:
    """Refuse a per-stage recompute layout for a framework with one setting for all stages.

    Raises:
        AutoparError: ``s.recompute_per_stage`` is set (one line naming the writers that can).
    """
    if s.recompute_per_stage:
        raise AutoparError(
            f"{framework} cannot express this layout: recompute per stage {','.join(s.recompute_per_stage)} "
            f"(it has one recompute setting for all stages); write it with --format sapp, or galvatron for "
            f"none/full mixes, or search with --target {framework.lower().split('-')[0]} for a uniform one")


def require_default_modules(framework: str, s: Strategy) -> None:
    """Refuse selective recompute of other modules than ``core_attn`` for a framework without
    Megatron-LM's ``--recompute-modules`` (its selective recompute is its own).

    Raises:
        AutoparError: ``s.recompute_modules`` is not the default (one line naming the fix).
    """
    if s.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
        raise AutoparError(
            f"{framework} cannot express this layout: recompute modules {','.join(s.recompute_modules)} are "
            f"Megatron-LM's --recompute-modules (its selective recompute is its own); write it with --format "
            f"megatron, or search with --target {framework.lower().split('-')[0]} for the default core_attn")
