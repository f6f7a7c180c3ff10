"""DeepSpeed JSON config for Megatron-DeepSpeed: batch, ZeRO stage, precision.

Keys and rules: ``shared/reference/ecosystem.md`` 4.1 (``deepspeed/runtime/config.py``):
``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp`` where
dp is the data-parallel size Megatron's ``mpu`` reports. The tensor/pipeline sizes are
Megatron-DeepSpeed flags, not JSON keys. Refused: ZeRO-2/3 with pipeline parallelism ("ZeRO-2
and ZeRO-3 are incompatible with pipeline parallelism"), interleaved pipelines (the DeepSpeed
pipeline engine has none), context parallelism (not in DeepSpeed; Ulysses is a different
scheme), fp8.
"""

from __future__ import annotations

import json
from typing import Any

from autopar.errors import AutoparError
from autopar.export.per_stage import require_uniform_recompute
from autopar.problem import Problem
from autopar.strategy import Strategy

# Our field -> DeepSpeed key (a rename is a change here).
KEYS = {"gbs": "train_batch_size", "mbs": "train_micro_batch_size_per_gpu", "gas": "gradient_accumulation_steps",
        "zero": "zero_optimization", "stage": "stage"}


def config(p: Problem, s: Strategy) -> dict[str, Any]:
    """The DeepSpeed config dict.

    Raises:
        AutoparError: a layout DeepSpeed cannot run (see the module docstring), or recompute per
            stage (one ``activation_checkpointing`` section for all stages).
    """
    require_uniform_recompute("DeepSpeed", s)
    why = None
    if s.zero >= 2 and s.pp > 1:
        why = f"zero={s.zero} with pp={s.pp}: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    elif s.vpp > 1:
        why = f"vpp={s.vpp}: the DeepSpeed pipeline engine has no interleaved schedule"
    elif s.cp > 1:
        why = f"cp={s.cp}: DeepSpeed has no ring context parallelism"
    elif p.train.precision == "fp8":
        why = "fp8: DeepSpeed's config has no fp8 training section"
    if why:
        raise AutoparError(f"DeepSpeed cannot express this layout: {why}")
    doc: dict[str, Any] = {
        KEYS["gbs"]: p.train.global_batch_size,
        KEYS["mbs"]: s.mbs,
        KEYS["gas"]: s.num_microbatches(p.train.global_batch_size),
        KEYS["zero"]: {KEYS["stage"]: s.zero, "overlap_comm": s.zero > 0, "contiguous_gradients": s.zero > 0},
        "bf16": {"enabled": p.train.precision == "bf16"},
        "fp16": {"enabled": p.train.precision == "fp16", "loss_scale": 0},
        "gradient_clipping": 1.0,
    }
    if s.recompute == "full":
        doc["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return doc


def write(p: Problem, s: Strategy) -> str:
    """The ``deepspeed`` export format (JSON text)."""
    return json.dumps(config(p, s), indent=2) + "\n"


def check(doc: dict[str, Any], dp: int, pp: int) -> list[str]:
    """DeepSpeed's batch assertion and the pipeline/ZeRO rule (ecosystem.md 4.1)."""
    bad = []
    if doc[KEYS["gbs"]] != doc[KEYS["mbs"]] * doc[KEYS["gas"]] * dp:
        bad.append("train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size")
    if pp > 1 and doc[KEYS["zero"]][KEYS["stage"]] >= 2:
        bad.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    return bad
