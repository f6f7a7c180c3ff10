"""Recipe knobs shared by ``estimate``, ``search`` and ``export`` that are ``TrainSpec`` fields:
CUDA graphs (``--cuda-graph-impl``, ``--cuda-graph-scope``), activation CPU offloading
(``--activation-offload-layers``) and fp8 training's bf16 first/last layers (``--fp8-bf16-layers``).

Each option given replaces what a ``--script`` set; the defaults (no graphs, no offloading, no
bf16 layers: Megatron-LM's own defaults) are stated in the options' help
(:mod:`autopar.cli.options`). Costs: :mod:`autopar.cost.cuda_graph`,
:mod:`autopar.cost.activation_offload`, :mod:`autopar.cost.fp8_bf16_layers`.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError


def given_knobs(cuda_graph_impl: str | None = None, cuda_graph_scope: str | None = None,
                activation_offload_layers: int | None = None, fp8_bf16_layers: str | None = None) -> dict[str, Any]:
    """The ``TrainSpec`` fields the options give (None = not given), each value checked alone.

    Raises:
        AutoparError: an implementation or scope name outside Megatron-LM's, a negative layer
            count, or ``--fp8-bf16-layers`` not of the form ``FIRST,LAST`` (one line naming the option).
    """
    from autopar.specs.train import CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES

    out: dict[str, Any] = {}
    if cuda_graph_impl is not None:
        if cuda_graph_impl not in CUDA_GRAPH_IMPLS:
            raise AutoparError(f"--cuda-graph-impl={cuda_graph_impl!r}: allowed {', '.join(CUDA_GRAPH_IMPLS)}")
        out["cuda_graph_impl"] = cuda_graph_impl
    if cuda_graph_scope is not None:
        words = tuple(dict.fromkeys(w.strip() for w in cuda_graph_scope.split(",") if w.strip()))
        bad = [w for w in words if w not in CUDA_GRAPH_SCOPES]
        if bad or not words:
            raise AutoparError(f"--cuda-graph-scope={cuda_graph_scope!r}: comma-separated names out of "
                               f"{', '.join(CUDA_GRAPH_SCOPES)}")
        out["cuda_graph_scope"] = words
    if activation_offload_layers is not None:
        if activation_offload_layers < 0:
            raise AutoparError(f"--activation-offload-layers={activation_offload_layers}: must be an integer >= 0")
        out["activation_offload_layers"] = activation_offload_layers
    if fp8_bf16_layers is not None:
        parts = fp8_bf16_layers.split(",")
        from autopar.integers import is_integer_text

        if len(parts) != 2 or not all(is_integer_text(x) and int(x) >= 0 for x in parts):
            raise AutoparError(f"--fp8-bf16-layers={fp8_bf16_layers!r}: expected FIRST,LAST, two integers >= 0 "
                               "(e.g. 1,1: Megatron-Bridge's current-scaling recipe)")
        out["fp8_bf16_layers"] = (int(parts[0]), int(parts[1]))
    return out


def check_knobs(knobs: dict[str, Any], state: dict[str, Any], precision: str, num_layers: int,
                moe: bool = True) -> None:
    """Refuse option combinations Megatron refuses, naming the option given (``knobs``, from
    :func:`given_knobs`) against the merged ``TrainSpec`` fields ``state`` (options over the script's).

    Raises:
        AutoparError: ``--cuda-graph-scope`` without an implementation, ``full_iteration`` with
            ``transformer_engine`` or other scopes with ``local`` (Megatron-LM core_v0.15's
            ``--cuda-graph-scope`` rule), ``moe_preprocess`` without ``moe_router``;
            ``--activation-offload-layers`` of the model's layer count or more (Megatron-Core:
            "CPU offloading can be done only for layers less than num_layers"); ``--fp8-bf16-layers``
            without ``--precision fp8``, with the delayed recipe, or more layers than the model has;
            a MoE scope (``moe``, ``moe_router``, ``moe_preprocess``) on a dense model (``moe`` False:
            there is no MoE layer to capture).
    """
    from autopar.specs.train import MOE_CUDA_GRAPH_SCOPES, cuda_graph_scope_problem

    impl, scope = state.get("cuda_graph_impl", "none"), tuple(state.get("cuda_graph_scope", ()))
    if ("cuda_graph_impl" in knobs or "cuda_graph_scope" in knobs) and \
            (why := cuda_graph_scope_problem(impl, scope)) is not None:
        shown = f"--cuda-graph-impl={impl}" + (f" --cuda-graph-scope={','.join(scope)}" if scope else "")
        raise AutoparError(f"{shown}: {why}")
    if "cuda_graph_scope" in knobs and not moe and (names := [w for w in scope if w in MOE_CUDA_GRAPH_SCOPES]):
        raise AutoparError(f"--cuda-graph-scope={','.join(scope)}: {', '.join(names)} captures MoE layers and the "
                           "model has none; use attn or mlp")
    n = knobs.get("activation_offload_layers")
    if n is not None and n >= num_layers:
        raise AutoparError(f"--activation-offload-layers={n}: must be below the model's {num_layers} layers "
                           "(Megatron-Core keeps the last layer's activations on the device)")
    ends = knobs.get("fp8_bf16_layers")
    if ends is not None and ends != (0, 0):
        shown = f"--fp8-bf16-layers={ends[0]},{ends[1]}"
        if precision != "fp8":
            raise AutoparError(f"{shown} with --precision={precision}: bf16 layers are a part of fp8 training; "
                               "add --precision fp8")
        if state.get("fp8_recipe") in (None, "delayed"):
            raise AutoparError(f"{shown} with the delayed fp8 recipe: Megatron-Core raises 'Delayed scaling does not "
                               "support first / last layer in BF16'; add --fp8-recipe tensorwise (or blockwise, mxfp8, "
                               "nvfp4)")
        if sum(ends) > num_layers:
            raise AutoparError(f"{shown}: the model has {num_layers} layers")
