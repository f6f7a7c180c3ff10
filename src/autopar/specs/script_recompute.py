"""Activation recompute of a Megatron-LM launch script, read as Megatron-LM reads it.

Sources (Megatron-LM ``megatron/training/arguments.py`` and
``megatron/core/transformer/transformer_config.py``, ``TransformerConfig.__post_init__``):

* ``--recompute-activations`` sets the granularity to ``selective`` whatever
  ``--recompute-granularity`` says (``validate_args``: ``if args.recompute_activations:
  args.recompute_granularity = 'selective'``);
* selective granularity takes no ``--recompute-method`` (``validate_args`` asserts "recompute method
  is not yet supported for selective recomputing granularity") and no ``--recompute-num-layers``
  (``TransformerConfig``: "recompute_num_layers must be None"); it recomputes ``--recompute-modules``
  (``core_attn`` if absent);
* full granularity needs ``--recompute-method`` (``TransformerConfig``: 'recompute_method must be
  "block" or "uniform"') and ``--recompute-num-layers`` (``TransformerConfig``: "recompute_num_layers
  must be between 1 and num_layers_per_pipeline_rank"); ``block`` N recomputes N layers per chunk,
  ``uniform`` every layer.

``uniform`` with ``--recompute-num-layers`` N > 1 (Megatron-Core ``TransformerBlock._checkpointed_forward``:
one checkpoint per chunk of N layers) keeps one layer input per N layers and rebuilds N layers'
activations at once in backward; autopar models uniform chunks of one layer and ``block`` N, so N > 1
is refused with that reason rather than costed as N = 1.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, parse_recompute_modules


def recompute_fields(a: Args) -> dict[str, Any]:
    """Strategy fields ``recompute``, ``recompute_layers`` and ``recompute_modules`` of a script.

    Raises:
        AutoparError: a granularity or method outside Megatron's argparse choices, or a combination
            Megatron-LM refuses (module docstring: selective with a method or layer count, full
            without them), naming the flags and Megatron's message; ``uniform`` with more than one
            layer per chunk (not modelled, module docstring).
    """
    granularity = a.text("--recompute-granularity", "none")
    if granularity not in ("none", "selective", "full"):  # Megatron's argparse choices: full, selective
        raise AutoparError(f"{a.source}: --recompute-granularity={granularity!r}: allowed full, selective")
    method = a.text("--recompute-method", "uniform")
    if method not in ("uniform", "block"):  # Megatron's argparse choices
        raise AutoparError(f"{a.source}: --recompute-method={method!r}: allowed uniform, block")
    if a.has("--recompute-activations"):
        granularity = "selective"
    if granularity == "selective":
        _check_selective(a)
        return dict(recompute="selective", recompute_layers=None, recompute_modules=script_recompute_modules(a))
    if granularity == "full":
        _check_full(a)
    layers = a.size("--recompute-num-layers", 1)
    if granularity == "full" and method == "uniform" and layers > 1:
        raise AutoparError(
            f"{a.source}: --recompute-method uniform --recompute-num-layers {layers}: not modelled (Megatron-Core "
            f"checkpoints chunks of {layers} layers, keeping one input per chunk and rebuilding {layers} layers at "
            "once in backward; autopar costs uniform chunks of 1 layer and block N); use --recompute-num-layers 1, "
            "or --recompute-method block")
    return dict(recompute=granularity, recompute_layers=layers if granularity == "full" and method == "block" else None,
                recompute_modules=DEFAULT_RECOMPUTE_MODULES)


def _check_selective(a: Args) -> None:
    """Raises AutoparError: ``--recompute-method`` or ``--recompute-num-layers`` with selective
    granularity (module docstring)."""
    why = (" (--recompute-activations sets --recompute-granularity selective in Megatron-LM's validate_args)"
           if a.has("--recompute-activations") else "")
    if a.has("--recompute-method"):
        raise AutoparError(
            f"{a.source}: --recompute-method={a.text('--recompute-method')} with selective recompute{why}: "
            "Megatron-LM asserts 'recompute method is not yet supported for selective recomputing granularity' "
            "(megatron/training/arguments.py); drop --recompute-method, or use --recompute-granularity full "
            "without --recompute-activations")
    if a.has("--recompute-num-layers"):
        raise AutoparError(
            f"{a.source}: --recompute-num-layers={a.text('--recompute-num-layers')} with selective recompute{why}: "
            "Megatron-LM raises 'When using recompute_granularity: selective recompute_num_layers must be None' "
            "(megatron/core/transformer/transformer_config.py); drop --recompute-num-layers, or use "
            "--recompute-granularity full without --recompute-activations")


def _check_full(a: Args) -> None:
    """Raises AutoparError: full granularity without ``--recompute-method`` or without
    ``--recompute-num-layers`` (module docstring)."""
    if not a.has("--recompute-method"):
        raise AutoparError(
            f"{a.source}: --recompute-granularity full without --recompute-method: Megatron-LM raises 'Using "
            "recompute_granularity: full so recompute_method must be \"block\" or \"uniform\"' "
            "(megatron/core/transformer/transformer_config.py); add --recompute-method uniform (every layer) "
            "or block with --recompute-num-layers N (the first N layers of each stage)")
    if not a.has("--recompute-num-layers"):
        raise AutoparError(
            f"{a.source}: --recompute-granularity full without --recompute-num-layers: Megatron-LM raises 'When "
            "using recompute_granularity: full recompute_num_layers must be between 1 and "
            "num_layers_per_pipeline_rank' (megatron/core/transformer/transformer_config.py); add "
            "--recompute-num-layers N (uniform: layers per recomputed chunk, block: layers recomputed per stage)")


def script_recompute_modules(a: Args) -> tuple[str, ...]:
    """``--recompute-modules`` of a script with selective granularity (``core_attn`` if absent).
    Megatron-LM reads the flag under selective granularity only (``TransformerConfig``), as
    space-separated words (``nargs='*'``), and asserts each is an allowed module.

    Raises:
        AutoparError: no value (Megatron would then recompute nothing), a comma-separated value
            (one word Megatron rejects), or an unknown name.
    """
    flag = "--recompute-modules"
    if a.has(flag) and not a.values[flag]:
        raise AutoparError(f"{a.source}: {flag} with no value: Megatron-LM then recomputes nothing; name the modules "
                           "(e.g. core_attn) or drop --recompute-granularity selective")
    text = a.text(flag, "core_attn") or ""
    if "," in text:
        raise AutoparError(f"{a.source}: {flag}={text!r}: Megatron-LM takes the names separated by spaces "
                           f"({flag} {' '.join(text.replace(',', ' ').split())}); a comma makes one unknown name")
    return parse_recompute_modules(text, f"{a.source}: {flag}")
