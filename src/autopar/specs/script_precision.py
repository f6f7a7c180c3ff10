"""Precision and recipe flags of a Megatron-LM launch script: ``--bf16``/``--fp16``, fp8
(``--fp8-format``, ``--fp8-recipe``, ``--fp8-param-gather``, bf16 first/last layers
``--first-last-layers-bf16``), NVFP4 (``--fp4-format``,
``--fp4-recipe``) and CUDA graphs (``--cuda-graph-impl``, ``--cuda-graph-scope`` and the deprecated
``--enable-cuda-graph`` / ``--external-cuda-graph``), as ``TrainSpec`` fields. Choices are
Megatron-LM core_v0.15's (``megatron/training/arguments.py``); costs in
:mod:`autopar.cost.fp8_recipe` and :mod:`autopar.cost.cuda_graph`.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args
from autopar.specs.train import CUDA_GRAPH_IMPLS, CUDA_GRAPH_SCOPES

#: Megatron-LM core_v0.15 ``--fp8-recipe`` choices autopar costs (``custom`` takes a user's Python
#: recipe, which has no cost to read).
SCRIPT_FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")


def precision(a: Args) -> str:
    """``fp8`` with ``--fp8-format`` or ``--fp4-format`` (NVFP4 linear layers: ``TrainSpec.precision``
    fp8 with ``fp8_recipe`` nvfp4), else ``bf16``/``fp16``.

    Raises:
        AutoparError: neither (Megatron then trains in fp32, which autopar does not plan), both
            --bf16 and --fp16, both --fp8-format and --fp4-format, or a format outside Megatron's choices.
    """
    if a.has("--bf16") and a.has("--fp16"):  # Megatron arguments.py: assert not (fp16 and bf16)
        raise AutoparError(f"{a.source}: both --bf16 and --fp16: Megatron refuses the pair; keep one")
    if a.has("--fp8-format") and a.has("--fp4-format"):
        raise AutoparError(f"{a.source}: --fp8-format with --fp4-format: Megatron-LM trains the linear layers in one "
                           "of them; keep one")
    if a.has("--fp4-format"):
        if (fmt := a.text("--fp4-format")) != "e2m1":  # Megatron's argparse choices
            raise AutoparError(f"{a.source}: --fp4-format={fmt!r}: allowed e2m1")
        return "fp8"  # the linear layers' low-precision recipe is NVFP4 (fp8_recipe)
    if a.has("--fp8-format"):
        if (fmt := a.text("--fp8-format")) not in ("e4m3", "hybrid"):  # Megatron's argparse choices
            raise AutoparError(f"{a.source}: --fp8-format={fmt!r}: allowed e4m3, hybrid")
        return "fp8"
    if a.has("--bf16"):
        return "bf16"
    if a.has("--fp16"):
        return "fp16"
    raise AutoparError(f"{a.source}: no --bf16/--fp16/--fp8-format: Megatron would train in fp32, which "
                       "autopar does not plan; add --bf16")


def fp8_recipe(a: Args) -> str:
    """``TrainSpec.fp8_recipe`` of an fp8 script: ``nvfp4`` with ``--fp4-format`` (``--fp4-recipe``
    must be ``nvfp4``, its default), else ``--fp8-recipe`` (default ``delayed``).

    Raises:
        AutoparError: ``--fp4-recipe custom`` or another value, or an ``--fp8-recipe`` outside
            :data:`SCRIPT_FP8_RECIPES`.
    """
    if a.has("--fp4-format"):
        if (recipe := a.text("--fp4-recipe", "nvfp4")) != "nvfp4":
            raise AutoparError(f"{a.source}: --fp4-recipe={recipe!r}: autopar costs nvfp4 (a custom recipe's "
                               "quantisation is not known)")
        return "nvfp4"
    recipe = a.text("--fp8-recipe", "delayed")
    if recipe not in SCRIPT_FP8_RECIPES:
        raise AutoparError(f"{a.source}: --fp8-recipe={recipe!r}: allowed {', '.join(SCRIPT_FP8_RECIPES)} (a custom "
                           "recipe's quantisation is not known)")
    return recipe


def recipe_fields(a: Args, precision_name: str) -> dict[str, Any]:
    """``TrainSpec`` fields of the fp8 recipe and the CUDA graphs (module docstring).

    Raises:
        AutoparError: an unknown recipe or graph choice, a scope without an implementation, or
            two deprecated switches naming different implementations (the flag and value named).
    """
    fields: dict[str, Any] = {}
    if precision_name == "fp8":
        fields["fp8_recipe"] = fp8_recipe(a)
        if a.has("--fp8-param-gather"):
            fields["fp8_param_storage"] = True
        if (ends := bf16_end_layers(a, fields["fp8_recipe"])) is not None:
            fields["fp8_bf16_layers"] = ends
    impl, scope = cuda_graph(a)
    if impl != "none":
        fields.update(cuda_graph_impl=impl, cuda_graph_scope=scope)
    return fields


def bf16_end_layers(a: Args, recipe: str) -> tuple[int, int] | None:
    """``TrainSpec.fp8_bf16_layers`` of an fp8 script: with ``--first-last-layers-bf16``, the
    ``--num-layers-at-start-in-bf16`` and ``--num-layers-at-end-in-bf16`` counts (Megatron-Core's
    defaults 1 and 1); None without it (the counts alone change nothing in Megatron).
    Costs: :mod:`autopar.cost.fp8_bf16_layers`.

    Raises:
        AutoparError: a count that is not an integer >= 0, or the delayed recipe (Megatron-Core raises
            "Delayed scaling does not support first / last layer in BF16").
    """
    if not a.has("--first-last-layers-bf16"):
        return None
    counts = []
    for flag in ("--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16"):
        text = a.text(flag, "1")
        if not text.isdigit():
            raise AutoparError(f"{a.source}: {flag}={text!r}: must be an integer >= 0")
        counts.append(int(text))
    if recipe == "delayed":
        raise AutoparError(f"{a.source}: --first-last-layers-bf16 with the delayed fp8 recipe: Megatron-Core raises "
                           "'Delayed scaling does not support first / last layer in BF16'; add --fp8-recipe tensorwise "
                           "(or blockwise, mxfp8)")
    return counts[0], counts[1]


def cuda_graph(a: Args) -> tuple[str, tuple[str, ...]]:
    """(``cuda_graph_impl``, ``cuda_graph_scope``): ``--cuda-graph-impl`` (default ``none``), or the
    deprecated ``--enable-cuda-graph`` (= ``local``) / ``--external-cuda-graph`` (=
    ``transformer_engine``), as Megatron-LM maps them; ``--cuda-graph-scope`` one or more names.

    Raises:
        AutoparError: a choice outside Megatron's, a deprecated switch contradicting
            ``--cuda-graph-impl``, or a scope with no implementation.
    """
    impl = a.text("--cuda-graph-impl", "none")
    if impl not in CUDA_GRAPH_IMPLS:
        raise AutoparError(f"{a.source}: --cuda-graph-impl={impl!r}: allowed {', '.join(CUDA_GRAPH_IMPLS)}")
    for flag, implied in (("--enable-cuda-graph", "local"), ("--external-cuda-graph", "transformer_engine")):
        if a.has(flag):
            if impl not in ("none", implied):
                raise AutoparError(f"{a.source}: {flag} means --cuda-graph-impl {implied}, but the script sets "
                                   f"--cuda-graph-impl {impl}; keep one")
            impl = implied
    # "full" (core_v0.15's default, deprecated on main) is the whole layer: no scope
    words = tuple(w for w in dict.fromkeys((a.text("--cuda-graph-scope") or "").split()) if w != "full")
    if any(w not in CUDA_GRAPH_SCOPES for w in words):
        raise AutoparError(f"{a.source}: --cuda-graph-scope={' '.join(words)!r}: allowed {', '.join(CUDA_GRAPH_SCOPES)}")
    if words and impl == "none":
        raise AutoparError(f"{a.source}: --cuda-graph-scope {' '.join(words)} without --cuda-graph-impl: no graph is "
                           "captured; add --cuda-graph-impl local or transformer_engine")
    return impl, words
