"""A launch script's optimizer-state flags: gradient and optimizer dtypes, optimizer offload.

Megatron-LM ``megatron/training/arguments.py`` (core_v0.15.0):

* ``--use-precision-aware-optimizer`` with ``--main-grads-dtype fp32|bf16``,
  ``--main-params-dtype fp32|fp16``, ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype``
  ``fp32|fp16|bf16|fp8`` (argparse choices; defaults fp32). Without the switch Megatron's
  ``get_megatron_optimizer`` ignores the dtype flags, so a script that sets one without it is
  refused (it would silently run fp32).
* ``--grad-reduce-in-bf16``: main gradients accumulated and reduced in bf16; with bf16 training
  and neither it nor ``--main-grads-dtype bf16`` Megatron forces fp32 main gradients
  (``accumulate_allreduce_grads_in_fp32 = True``); ``--accumulate-allreduce-grads-in-fp32`` with
  ``--main-grads-dtype bf16`` is asserted against.
* ``--fp16``: Megatron-LM forces fp32 gradients for bf16 only (``validate_args``, the ``if args.bf16``
  block); with fp16 the DDP gradient buffer is in the parameters' dtype unless
  ``--accumulate-allreduce-grads-in-fp32`` (Megatron-LM main ``megatron/training/training.py``:
  ``grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32``;
  ``megatron/core/distributed/param_and_grad_buffer.py``: ``grad_dtype = torch.float if
  grad_reduce_in_fp32 else param.dtype``), so an fp16 script without it has fp16 gradients
  (``grad_dtype`` fp16: 2 B per gradient in memory and on the data-parallel wire).
* ``--optimizer-cpu-offload`` (asserts ``--use-precision-aware-optimizer``, and the delayed fp8
  recipe with ``--fp8-param-gather``),
  ``--optimizer-offload-fraction F`` (default 1.0 in ``arguments.py``),
  ``--overlap-cpu-optimizer-d2h-h2d``. ``--offload-optimizer-states`` does not exist in
  Megatron-LM (checked to the 2026 main branch); it is an unknown flag there.
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

OPTIMIZER_DTYPES = {
    "--main-grads-dtype": ("grad_dtype", ("fp32", "bf16")),
    "--main-params-dtype": ("main_params_dtype", ("fp32", "fp16")),
    "--exp-avg-dtype": ("exp_avg_dtype", ("fp32", "fp16", "bf16", "fp8")),
    "--exp-avg-sq-dtype": ("exp_avg_sq_dtype", ("fp32", "fp16", "bf16", "fp8")),
}


def optimizer_fields(a: Args) -> dict[str, Any]:
    """TrainSpec fields of the script's optimizer-state flags (module docstring); only those set.

    Raises:
        AutoparError: a dtype outside Megatron's choices, a dtype or offload flag without
            ``--use-precision-aware-optimizer``, an offload fraction outside [0, 1],
            ``--accumulate-allreduce-grads-in-fp32`` with bf16 main gradients, or bf16 gradients
            with ``--fp16``.
    """
    fields: dict[str, Any] = {}
    aware = a.has("--use-precision-aware-optimizer")
    for flag, (name, allowed) in OPTIMIZER_DTYPES.items():
        value = a.text(flag)
        if value is None:
            continue
        if value not in allowed:
            raise AutoparError(f"{a.source}: {flag}={value!r}: allowed {', '.join(allowed)}")
        if not aware and value != "fp32":
            raise AutoparError(f"{a.source}: {flag}={value} needs --use-precision-aware-optimizer (without it "
                               "Megatron-LM keeps fp32 optimizer state and ignores the flag)")
        fields[name] = value
    if a.has("--grad-reduce-in-bf16"):
        fields["grad_dtype"] = "bf16"
    if a.has("--fp16") and not a.has("--bf16"):
        if fields.get("grad_dtype", "fp32") != "fp32":
            flag = "--grad-reduce-in-bf16" if a.has("--grad-reduce-in-bf16") else "--main-grads-dtype bf16"
            raise AutoparError(f"{a.source}: --fp16 with {flag}: Megatron-LM reads bf16 gradients for bf16 training "
                               "only (fp16 keeps fp16 gradients, or fp32 with --accumulate-allreduce-grads-in-fp32); "
                               "drop it")
        # Megatron's fp16 gradients are the parameters' dtype unless accumulated in fp32 (module docstring)
        fields["grad_dtype"] = "fp32" if a.has("--accumulate-allreduce-grads-in-fp32") else "fp16"
    if fields.get("grad_dtype") == "bf16" and a.has("--accumulate-allreduce-grads-in-fp32"):
        raise AutoparError(f"{a.source}: --accumulate-allreduce-grads-in-fp32 with bf16 main gradients: Megatron-LM "
                           "asserts --main-grads-dtype fp32 then; drop one")
    if a.has("--optimizer-cpu-offload"):
        if not aware:
            raise AutoparError(f"{a.source}: --optimizer-cpu-offload needs --use-precision-aware-optimizer "
                               "(Megatron-LM asserts it)")
        recipe = a.text("--fp8-recipe", "delayed")
        if a.has("--fp8-param-gather") and recipe != "delayed":
            raise AutoparError(f"{a.source}: --optimizer-cpu-offload with --fp8-param-gather and --fp8-recipe={recipe}: "
                               "Megatron-LM asserts the delayed recipe then; drop one")
        fraction = a.number("--optimizer-offload-fraction", 1.0)
        if not 0 <= fraction <= 1:  # also false for nan
            raise AutoparError(f"{a.source}: --optimizer-offload-fraction={fraction}: must be in [0, 1]")
        fields["optimizer_offload_fraction"] = fraction
        fields["optimizer_offload_overlap"] = a.has("--overlap-cpu-optimizer-d2h-h2d")
    elif a.has("--optimizer-offload-fraction"):
        raise AutoparError(f"{a.source}: --optimizer-offload-fraction without --optimizer-cpu-offload: Megatron-LM "
                           "then offloads nothing; add --optimizer-cpu-offload or drop the fraction")
    return fields
