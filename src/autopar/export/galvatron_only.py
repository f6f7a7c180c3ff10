"""Refuse Galvatron's own layout knobs in the writers of the other frameworks.

GPipe (``Strategy.schedule='gpipe'``), a vocabulary TP degree of its own or sequence-split
vocabulary layers (``vocab_tp``, ``vocab_sp``) and non-consecutive TP groups
(``tp_consecutive=False``) are Galvatron JSON fields (:mod:`autopar.export.galvatron`); Megatron-LM,
Megatron-Bridge, MindSpeed-LLM, torchtitan, DeepSpeed and SAPP have none of them (Megatron-style
1F1B / interleaved schedules only, the embedding and output layer on the layers' TP group, TP
innermost in the rank order), so their writers refuse such a layout instead of dropping the knob.
"""

from __future__ import annotations

from typing import Callable

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.strategy import Strategy


def galvatron_knobs(s: Strategy) -> list[str]:
    """The Galvatron-only settings of ``s``, as ``field=value`` texts (empty: none)."""
    knobs = []
    if s.schedule == "gpipe":
        knobs.append("schedule=gpipe")
    if s.vocab_tp_size != s.tp:
        knobs.append(f"vocab_tp={s.vocab_tp_size}")
    if s.vocab_sp:
        knobs.append("vocab_sp=true")
    if not s.tp_consecutive:
        knobs.append("tp_consecutive=false")
    return knobs


def refusing_galvatron_knobs(fmt: str, write: Callable[[Problem, Strategy], str]) -> Callable[[Problem, Strategy], str]:
    """``write`` that first refuses a layout with Galvatron-only settings (module docstring).

    Raises:
        AutoparError: ``s`` has one of them (one line naming them and ``--format galvatron``).
    """
    def checked(p: Problem, s: Strategy) -> str:
        knobs = galvatron_knobs(s)
        if knobs:
            raise AutoparError(f"export --format {fmt} cannot express this layout: {', '.join(knobs)} (Galvatron-only: "
                               "its pipeline_type, vtp/vsp, tp_consecutive_flags); write it with --format galvatron, "
                               f"or search with --target {fmt} for one it runs")
        return write(p, s)
    return checked
