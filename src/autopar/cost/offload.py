"""Optimizer state offloaded to host memory (Megatron-LM ``--optimizer-cpu-offload``).

Mechanism (Megatron-Core ``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``,
``HybridDeviceOptimizer``, core_v0.15.0; built by ``optimizer/__init__.py`` with
``param_update_in_fp32=True``):

* **Memory.** The optimizer's parameters (this device's distributed-optimizer shard) are walked
  in order and the first ``offload_fraction`` of their elements get a pinned host copy, on which
  a CPU Adam keeps the fp32 master weight and both moments. So the device keeps ``1 - F`` of its
  optimizer state (:func:`device_optimizer_fraction`); the bf16 weights and the main gradients
  stay on the device (the gradient buffer is the DDP's).
* **Time.** After backward, ``step()`` copies the offloaded shard's gradients device-to-host
  (``_set_sub_optimizer_grads``, main-gradient dtype on the wire), runs the CPU Adam, and a
  post-step hook copies the updated fp32 master weights host-to-device
  (``param_copy_back_gpu_hook``). None of it overlaps forward or backward: it runs after the
  last backward, before the next step's forward (:func:`transfer_time_s`). With
  ``--overlap-cpu-optimizer-d2h-h2d`` each parameter gets its own CPU optimizer and CUDA
  streams, so the D2H of later parameters, the CPU step and the H2D of earlier ones run at once
  on a full-duplex link: the exposed transfer is the larger direction; without it they run one
  after the other.
* The CPU Adam's own time (host memory bandwidth) is not modelled: autopar has no host CPU
  spec; the device-side Adam of the kept share is :func:`autopar.cost.stage_time.optimizer_time_s`.

Host link bandwidth: :attr:`autopar.specs.cluster.DeviceSpec.host_bandwidth_bytes_per_s` (PCIe
on x86 hosts, NVLink-C2C on Grace), per direction.

Units: bytes, seconds. Shapes: arrays broadcast with the ``LayoutBatch`` columns.
"""

from __future__ import annotations

import numpy as np

from autopar.errors import AutoparError
from autopar.problem import Problem

MASTER_PARAM_BYTES = 4  # HybridDeviceOptimizer updates fp32 master copies (param_update_in_fp32=True)


def device_optimizer_fraction(p: Problem) -> float:
    """Share of the optimizer shard (master weights + moments) left on the device: ``1 - F``."""
    return 1.0 - p.train.optimizer_offload_fraction


def host_bandwidth_bytes_per_s(p: Problem, option: str | None = None) -> float:
    """The device's host link bandwidth per direction.

    Raises:
        AutoparError: the device spec has none (``--device-set host_bandwidth_bytes_per_s=...``); the
            message names ``option`` (default: ``--optimizer-offload-fraction=F``), what needs the link.
    """
    bandwidth = p.cluster.device.host_bandwidth_bytes_per_s
    if bandwidth is None:
        option = option or f"--optimizer-offload-fraction={p.train.optimizer_offload_fraction}"
        raise AutoparError(
            f"{option}: device {p.cluster.device.name} has no host link bandwidth; give it with --device-set "
            "host_bandwidth_bytes_per_s=VALUE (bytes/s per direction, e.g. 64e9 for PCIe Gen5 x16)")
    return bandwidth


def transfer_time_s(p: Problem, optimizer_params) -> np.ndarray:
    """Exposed host-link time per step for ``optimizer_params`` elements in this device's
    optimizer shard (elements, array): gradients D2H (``grad_dtype`` bytes) and fp32 master
    weights H2D (4 B) of the offloaded fraction F; their maximum with
    ``optimizer_offload_overlap``, else their sum (module docstring).

    Example: 1.0e9 shard elements, F = 1, fp32 main gradients, 64 GB/s PCIe Gen5: 4e9 B each way,
    62.5 ms each, 125 ms exposed (62.5 ms overlapped). Zero when F = 0.
    """
    f = p.train.optimizer_offload_fraction
    params = np.asarray(optimizer_params, dtype=np.float64)
    if f == 0:
        return np.zeros(params.shape)
    bandwidth = host_bandwidth_bytes_per_s(p)
    d2h = f * params * p.train.grad_bytes / bandwidth
    h2d = f * params * MASTER_PARAM_BYTES / bandwidth
    return np.maximum(d2h, h2d) if p.train.optimizer_offload_overlap else d2h + h2d
