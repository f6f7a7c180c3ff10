"""Writers that turn a layout into what a training framework reads (one module per target).

:data:`WRITERS` maps each ``autopar export --format`` name to its ``write(problem, strategy)``;
every writer raises :class:`~autopar.errors.AutoparError` with the reason when the target
cannot express the layout. :data:`FILE_WRITERS` holds the formats that are more than one file
with ``--out`` (``deepspeed``: the JSON and the Megatron-DeepSpeed script that reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autopar.errors import AutoparError
from autopar.export import galvatron, megatron, megatron_bridge, megatron_deepspeed, mindspeed, sapp, torchtitan
from autopar.export.galvatron_only import refusing_galvatron_knobs
from autopar.export.v_schedules import refusing_v_schedules
from autopar.problem import Problem
from autopar.strategy import Strategy


def refuse_megatron_only_features(fmt: str, p: Problem, model_features: bool = True) -> None:
    """Refuse, for format ``fmt``, what only the Megatron-LM export writes: non-fp32 optimizer
    dtypes, optimizer offload or bf16 main gradients (``--use-precision-aware-optimizer``,
    ``--optimizer-cpu-offload``, ``--grad-reduce-in-bf16``), CUDA graphs (``--cuda-graph-impl``;
    Megatron-Bridge writes them as ``model.cuda_graph_impl``/``cuda_graph_scope``), activation CPU
    offloading (Megatron-Bridge: ``model.cpu_offloading``), fp8 bf16 first/last layers
    (Megatron-Bridge: its current-scaling recipe),
    and with ``model_features`` sliding-window layers and attention sinks (``--window-size``,
    ``--softmax-type learnable``), which this format's writer would drop. Megatron-Bridge builds
    the model from its recipe (window layers included) but sets fp32 optimizer state itself
    (:data:`autopar.export.megatron_bridge.OPTIMIZER_DTYPES`), so it checks the optimizer only.
    Depends on the problem alone, not on a layout.

    Raises:
        AutoparError: naming the feature and the format that writes it.
    """
    t, m = p.train, p.model
    # 16-bit main gradients of bf16/fp8 training: Megatron-LM's --grad-reduce-in-bf16 (fp16 reduces in fp16
    # everywhere); the other writers keep (Megatron-Bridge: set) fp32 gradients.
    bf16_grads = t.grad_dtype != "fp32" and t.precision != "fp16"
    if t.optimizer_dtypes_set or t.optimizer_offload_fraction > 0 or bf16_grads:
        raise AutoparError(f"export --format {fmt}: the script's optimizer dtypes / optimizer offload / bf16 main "
                           "gradients are Megatron-LM's (--use-precision-aware-optimizer, --optimizer-cpu-offload, "
                           "--grad-reduce-in-bf16); use --format megatron or drop them")
    if t.activation_offload_layers and fmt != "megatron-bridge":
        raise AutoparError(f"export --format {fmt}: activation CPU offloading is Megatron-Core's "
                           "(TransformerConfig.cpu_offloading); use --format megatron-bridge, or plan without it")
    if t.bf16_end_layers != (0, 0) and fmt != "megatron-bridge":
        raise AutoparError(f"export --format {fmt}: fp8 training with bf16 first/last layers is Megatron's "
                           "(--first-last-layers-bf16); use --format megatron or megatron-bridge, or plan without "
                           "--fp8-bf16-layers")
    if t.cuda_graph_impl != "none" and fmt != "megatron-bridge":
        raise AutoparError(f"export --format {fmt}: CUDA graph capture (--cuda-graph-impl {t.cuda_graph_impl}) is "
                           "Megatron-LM's; use --format megatron or megatron-bridge, or plan without it")
    if model_features and (m.window_layers or m.attention_sinks):
        raise AutoparError(f"export --format {fmt}: model {m.name} has sliding-window layers / attention sinks, "
                           "which this format's export does not write; use --format megatron")


def _bridge_problem(p: Problem) -> None:
    """Megatron-Bridge's refusals that hold for every layout: the optimizer features only
    Megatron-LM writes, no recipe for the model, or a precision its mixed-precision recipes do not
    run (:func:`autopar.export.megatron_bridge.recipe_for`, ``mixed_precision``)."""
    refuse_megatron_only_features("megatron-bridge", p, model_features=False)
    megatron_bridge.recipe_for(p)
    megatron_bridge.mixed_precision(p)


#: Format -> the check of its writer's refusals that depend on the problem alone (raising
#: :class:`~autopar.errors.AutoparError` as the writer would for any layout), so a search can
#: refuse a target once instead of once per fitting layout.
PROBLEM_CHECKS: dict[str, Callable[[Problem], None]] = {
    "megatron": lambda p: None,
    "megatron-bridge": _bridge_problem,
    "mindspeed": lambda p: None,
    **{fmt: (lambda p, fmt=fmt: refuse_megatron_only_features(fmt, p))
       for fmt in ("torchtitan", "deepspeed", "galvatron", "sapp")},
}


def _checking_problem(fmt: str, write: Callable[[Problem, Strategy], str]) -> Callable[[Problem, Strategy], str]:
    """``write`` that first runs :data:`PROBLEM_CHECKS` ``[fmt]``."""
    def checked(p: Problem, s: Strategy) -> str:
        PROBLEM_CHECKS[fmt](p)
        return write(p, s)
    return checked


_WRITERS: dict[str, Callable[[Problem, Strategy], str]] = {
    fmt: _checking_problem(fmt, write) for fmt, write in (
        ("megatron", megatron.write), ("megatron-bridge", megatron_bridge.write), ("mindspeed", mindspeed.write),
        ("torchtitan", torchtitan.write), ("deepspeed", megatron_deepspeed.write), ("galvatron", galvatron.write),
        ("sapp", sapp.write))}


def _refusing_others(fmt: str, write: Callable[[Problem, Strategy], str]) -> Callable[[Problem, Strategy], str]:
    """``write`` refusing the knobs of the other frameworks: Galvatron's own (GPipe, vtp/vsp,
    non-consecutive TP; :mod:`autopar.export.galvatron_only`) and torchtitan's V schedules (ZB-V,
    DualPipeV; :mod:`autopar.export.v_schedules`)."""
    if fmt != "galvatron":
        write = refusing_galvatron_knobs(fmt, write)
    return write if fmt == "torchtitan" else refusing_v_schedules(fmt, write)


WRITERS: dict[str, Callable[[Problem, Strategy], str]] = {fmt: _refusing_others(fmt, write)
                                                          for fmt, write in _WRITERS.items()}
# Format -> write(problem, strategy, out) for ``--out``, returning the paths written.
FILE_WRITERS: dict[str, Callable[[Problem, Strategy, Path], list[Path]]] = {
    "deepspeed": megatron_deepspeed.write_files,
}
# Format -> the paths its FILE_WRITERS entry writes for ``--out`` (known before writing).
FILE_PATHS: dict[str, Callable[[Path], list[Path]]] = {
    "deepspeed": megatron_deepspeed.out_paths,
}
