"""Flag combinations Megatron-LM's ``validate_args`` rejects, among flags with no cost effect of their own.

Each is refused with Megatron-LM's message (``megatron/training/arguments.py``), since the script
never runs as written:

* ``--overlap-param-gather`` needs the distributed optimizer or Megatron-FSDP ("--overlap-param-gather
  only supported with distributed optimizer, megatron fsdp, or dist_muon") and ``--overlap-grad-reduce``
  ("Must use --overlap-param-gather with --overlap-grad-reduce");
* ``--moe-grouped-gemm`` needs bf16 ("Currently GroupedGEMM for MoE only supports bf16 dtype.");
* ``--rampup-batch-size`` needs sample-based training, not ``--train-iters`` ("expected no batch-size
  rampup for iteration-based training").

``--transformer-impl local`` (a Megatron-LM script, not MindSpeed-LLM's) is refused too
(:func:`check_transformer_impl`): its layer spec is not the one autopar costs.

The grouped-GEMM and rampup asserts are Megatron-LM v0.15.3's, the version of autopar's flag table
(:mod:`autopar.specs.script_flags`); Megatron-LM's main branch dropped both asserts after it.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

_V = "Megatron-LM v0.15.3 (the version of autopar's flag table) asserts"


def check_megatron_asserts(a: Args) -> None:
    """Refuse the combinations of the module docstring.

    Raises:
        AutoparError: the first one the script has, naming its flags, Megatron-LM's message and the fix.
    """
    if a.has("--overlap-param-gather"):
        if not (a.has("--use-distributed-optimizer") or a.has("--use-megatron-fsdp")):
            raise AutoparError(f"{a.source}: --overlap-param-gather without --use-distributed-optimizer or "
                               "--use-megatron-fsdp: Megatron-LM asserts '--overlap-param-gather only supported with "
                               "distributed optimizer, megatron fsdp, or dist_muon' (megatron/training/arguments.py)")
        if not a.has("--overlap-grad-reduce"):
            raise AutoparError(f"{a.source}: --overlap-param-gather without --overlap-grad-reduce: Megatron-LM asserts "
                               "'Must use --overlap-param-gather with --overlap-grad-reduce' "
                               "(megatron/training/arguments.py); add --overlap-grad-reduce")
    if a.has("--moe-grouped-gemm") and not a.has("--bf16"):
        raise AutoparError(f"{a.source}: --moe-grouped-gemm without --bf16: {_V} 'Currently GroupedGEMM for MoE only "
                           "supports bf16 dtype.' (megatron/training/arguments.py); train in --bf16 or drop "
                           "--moe-grouped-gemm")
    if a.has("--rampup-batch-size") and a.has("--train-iters"):
        raise AutoparError(f"{a.source}: --rampup-batch-size with --train-iters: {_V} 'expected no batch-size rampup "
                           "for iteration-based training' (megatron/training/arguments.py); use --train-samples "
                           "(with sample-based --lr-decay-samples) or drop --rampup-batch-size")


def check_transformer_impl(a: Args, framework: str) -> None:
    """``--transformer-impl``: Megatron-LM's choices (``transformer_engine``, the default, or ``local``).

    ``local`` in a Megatron-LM script builds ``get_gpt_layer_local_spec``
    (``megatron/core/models/gpt/gpt_layer_specs.py``): Megatron's unfused ``DotProductAttention``
    (the full score matrix), torch/apex norms and plain linears without Transformer Engine's fused
    norm+linear, no TE userbuffers (so no ``--tp-comm-overlap``) and no fp8. autopar costs the
    Transformer Engine layers; ``--attention-backend unfused`` costs the unfused attention alone,
    not the missing fusions, so the script is refused rather than given a wrong number. MindSpeed-LLM
    scripts (``framework`` mindspeed) run ``local`` as their standard spec with MindSpeed's own fused
    kernels (``--use-flash-attn``, ``--use-fused-rmsnorm``, ...), which autopar reads: accepted.

    Raises:
        AutoparError: a value outside the choices, or ``local`` in a Megatron-LM script.
    """
    impl = a.text("--transformer-impl", "transformer_engine")
    if impl not in ("transformer_engine", "local"):
        raise AutoparError(f"{a.source}: --transformer-impl={impl!r}: allowed transformer_engine, local")
    if impl == "local" and framework == "megatron":
        raise AutoparError(f"{a.source}: --transformer-impl local is not modelled by autopar: Megatron-LM's local "
                           "spec runs unfused attention and norms/linears without Transformer Engine's fusions, TP "
                           "communication overlap or fp8, while autopar costs the Transformer Engine layers; use "
                           "--transformer-impl transformer_engine (the default)")
