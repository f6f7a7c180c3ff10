"""Which training frameworks (``autopar export`` formats, ``search --target``) run on which
accelerator family (:attr:`autopar.specs.cluster.DeviceSpec.vendor`).

* NVIDIA (CUDA): Megatron-LM, Megatron-Bridge (NVIDIA's recipes over Megatron-Core; it requires
  Transformer Engine's CUDA build), torchtitan, Megatron-DeepSpeed, Galvatron (its runtime builds on
  CUDA-only kernels: flash-attn and Megatron-Core's fused ops).
* AMD (ROCm): Megatron-LM (AMD's ROCm/Megatron-LM port, documented in the ROCm "training a model
  with Megatron-LM" guide), torchtitan (PyTorch's ROCm build; the ROCm training guides cover it) and
  Megatron-DeepSpeed (DeepSpeed's ROCm support). Galvatron has no ROCm build.
* Huawei Ascend (CANN, torch_npu / MindSpore): MindSpeed-LLM (Megatron-LM patched onto torch_npu;
  Megatron-LM itself needs CUDA) and MindFormers, whose per-stage ``offset`` / ``recompute``
  layout the ``sapp`` format writes (SAPP, the MindFormers pipeline planner).
* MindSpeed-LLM and MindFormers run on Ascend only.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.specs.cluster import DeviceSpec

# Export formats that run on each accelerator family, the default (the search's --target) first.
TARGETS_BY_VENDOR: dict[str, tuple[str, ...]] = {
    "nvidia": ("megatron", "megatron-bridge", "torchtitan", "deepspeed", "galvatron"),
    "amd": ("megatron", "torchtitan", "deepspeed"),
    "huawei": ("mindspeed", "sapp"),
}
_FAMILY = {"nvidia": "NVIDIA GPUs", "amd": "AMD GPUs (ROCm)", "huawei": "Huawei Ascend NPUs"}
_NAME = {"megatron": "Megatron-LM", "megatron-bridge": "Megatron-Bridge", "mindspeed": "MindSpeed-LLM", "torchtitan": "torchtitan",
         "deepspeed": "Megatron-DeepSpeed", "galvatron": "Galvatron", "sapp": "MindFormers (SAPP)"}


def default_target(device: DeviceSpec) -> str:
    """The export format ``search`` plans for when ``--target`` is not given: ``megatron``, or
    ``mindspeed`` on Ascend (Megatron-LM does not run there)."""
    return TARGETS_BY_VENDOR[device.vendor][0] if device.vendor else "megatron"


def target_refusal(device: DeviceSpec, target: str) -> str | None:
    """Why ``target`` (an export format) cannot run on ``device``, or None when it can (or the
    device's family is not known: a device file without a base preset)."""
    allowed = TARGETS_BY_VENDOR.get(device.vendor or "")
    if allowed is None or target in allowed or target not in _NAME:  # an unknown format: refused by name elsewhere
        return None
    return (f"{_NAME.get(target, target)} does not run on {device.name} ({_FAMILY[device.vendor]}); "
            f"formats that do: {', '.join(allowed)}")


def check_target(device: DeviceSpec, target: str, option: str) -> None:
    """Refuse a ``target`` that does not run on ``device``.

    Raises:
        AutoparError: one line naming ``option`` (``--format`` / ``--target``), the value, the
            device and the formats that run on it.
    """
    why = target_refusal(device, target)
    if why:
        raise AutoparError(f"{option}={target}: {why}")
