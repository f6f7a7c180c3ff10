"""Megatron-LM's Torch-FSDP2 (``--use-torch-fsdp2``) as its ``validate_args`` admits it.

``megatron/training/arguments.py`` (``if args.use_torch_fsdp2:``) asserts, in this order: no
pipeline parallelism, no expert parallelism, not with the distributed optimizer, not with
gradient-accumulation fusion (on by default: the script needs ``--no-gradient-accumulation-fusion``),
``--ckpt-format`` torch_dist (the default) or torch_dcp, ``--untie-embeddings-and-output-weights``,
not ``--fp16``, and ``CUDA_DEVICE_MAX_CONNECTIONS`` not 1. A script that breaks one never runs, so
autopar refuses it rather than cost FSDP2 (ZeRO-3) on a layout Megatron-LM does not run.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

_WHERE = "(megatron/training/arguments.py)"


def check_torch_fsdp2(a: Args, max_connections: str | None) -> None:
    """Refuse a ``--use-torch-fsdp2`` script Megatron-LM rejects (module docstring).

    Args:
        a: the training script's arguments.
        max_connections: the script's ``CUDA_DEVICE_MAX_CONNECTIONS`` (None if it sets none).
    Raises:
        AutoparError: the first assert the script breaks, with Megatron-LM's message and the fix.
    """
    if not a.has("--use-torch-fsdp2"):
        return
    pp, ep = a.size("--pipeline-model-parallel-size", 1), a.size("--expert-model-parallel-size", 1)
    ckpt = a.text("--ckpt-format", "torch_dist")
    broken = [
        (pp != 1, f"--pipeline-model-parallel-size={pp}", "--use-torch-fsdp2 is not supported with pipeline "
         "parallelism", "use pp 1, or drop --use-torch-fsdp2"),
        (ep != 1, f"--expert-model-parallel-size={ep}", "--use-torch-fsdp2 is not supported with expert parallelism",
         "use ep 1, or drop --use-torch-fsdp2"),
        (a.has("--use-distributed-optimizer"), "--use-distributed-optimizer",
         "--use-torch-fsdp2 is not supported with MCore's distributed optimizer", "drop one of them"),
        (not a.has("--no-gradient-accumulation-fusion"), "gradient-accumulation fusion (on unless "
         "--no-gradient-accumulation-fusion)", "--use-torch-fsdp2 is not supported with gradient accumulation fusion",
         "add --no-gradient-accumulation-fusion"),
        (ckpt not in ("torch_dist", "torch_dcp"), f"--ckpt-format={ckpt}",
         "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp", "use torch_dist or torch_dcp"),
        (not a.has("--untie-embeddings-and-output-weights"), "tied embeddings",
         "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights", "add --untie-embeddings-and-output-weights"),
        (a.has("--fp16"), "--fp16", "--use-torch-fsdp2 not supported with fp16 yet", "train in --bf16"),
        (max_connections == "1", "CUDA_DEVICE_MAX_CONNECTIONS=1",
         "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one",
         "drop the export or set it above 1"),
    ]
    for bad, what, message, fix in broken:
        if bad:
            raise AutoparError(f"{a.source}: --use-torch-fsdp2 with {what}: Megatron-LM asserts '{message}' {_WHERE}; "
                               f"{fix}")
