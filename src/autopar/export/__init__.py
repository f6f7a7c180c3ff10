"""Writers that turn a layout into what a training framework reads (one module per target).

:data:`WRITERS` maps each ``autopar export --format`` name to its ``write(problem, strategy)``;
every writer raises :class:`~autopar.errors.AutoparError` with the reason when the target
cannot express the layout. :data:`FILE_WRITERS` holds the formats that are more than one file
with ``--out`` (``deepspeed``: the JSON and the Megatron-DeepSpeed script that reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autopar.export import galvatron, megatron, megatron_bridge, megatron_deepspeed, mindspeed, sapp, torchtitan
from autopar.problem import Problem
from autopar.strategy import Strategy

WRITERS: dict[str, Callable[[Problem, Strategy], str]] = {
    "megatron": megatron.write,
    "megatron-bridge": megatron_bridge.write,
    "mindspeed": mindspeed.write,
    "torchtitan": torchtitan.write,
    "deepspeed": megatron_deepspeed.write,
    "galvatron": galvatron.write,
    "sapp": sapp.write,
}
# Format -> write(problem, strategy, out) for ``--out``, returning the paths written.
FILE_WRITERS: dict[str, Callable[[Problem, Strategy, Path], list[Path]]] = {
    "deepspeed": megatron_deepspeed.write_files,
}
# Format -> the paths its FILE_WRITERS entry writes for ``--out`` (known before writing).
FILE_PATHS: dict[str, Callable[[Path], list[Path]]] = {
    "deepspeed": megatron_deepspeed.out_paths,
}
