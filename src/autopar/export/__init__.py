"""Writers that turn a layout into what a training framework reads (one module per target).

:data:`WRITERS` maps each ``autopar export --format`` name to its ``write(problem, strategy)``;
every writer raises :class:`~autopar.errors.AutoparError` with the reason when the target
cannot express the layout.
"""

from __future__ import annotations

from typing import Callable

from autopar.export import deepspeed, galvatron, megatron, mindspeed, sapp, torchtitan
from autopar.problem import Problem
from autopar.strategy import Strategy

WRITERS: dict[str, Callable[[Problem, Strategy], str]] = {
    "megatron": megatron.write,
    "mindspeed": mindspeed.write,
    "torchtitan": torchtitan.write,
    "deepspeed": deepspeed.write,
    "galvatron": galvatron.write,
    "sapp": sapp.write,
}
