"""Activation CPU offloading (``TrainSpec.activation_offload_layers``): the saved activations of
the first N decoder layers go to host memory during the forward pass and come back for the
backward pass.

Mechanism (Megatron-Core ``TransformerConfig.cpu_offloading`` / ``cpu_offloading_num_layers`` /
``cpu_offloading_activations``, Megatron-LM ``--cpu-offloading-num-layers`` on main; the
transformer block wraps each layer in Transformer Engine's ``get_cpu_offload_context``, whose
``AsyncDoubleBufferGroupOffloadHandler`` copies a layer's saved tensors device-to-host on a side
stream once the layer's forward is done, and prefetches them host-to-device one layer ahead of the
backward pass; Megatron-LM asserts ``cpu_offloading_num_layers < num_layers``, and
``shared/reference/ecosystem.md`` rule 27: CPU offloading is incompatible with any recompute and
with pp > 1, rule ``activation_offload_pp1_no_recompute``):

* **Memory.** The stage keeps the activations of its ``L - N`` other layers, plus one offloaded
  layer's at a time: the double buffer holds the layer being copied (forward) or prefetched
  (backward). Saved: ``(N - 1)`` layers' activations (:func:`saved_bytes`), per micro-batch in
  flight (one: pp = 1).
* **Time.** Each offloaded layer's activations cross the host link once each way
  (:attr:`~autopar.specs.cluster.DeviceSpec.host_bandwidth_bytes_per_s`, PCIe or NVLink-C2C,
  full duplex): the copy out runs under the next layer's forward, the copy in under the previous
  layer's backward; what a copy takes beyond the layer it hides under is exposed
  (:func:`exposed_s`). Weights are not offloaded (``cpu_offloading_weights`` is deprecated in
  TE 2.x and off in NVIDIA's recipes).

Units: bytes, seconds; arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import offload
from autopar.problem import Problem


def offloaded_layers(p: Problem, stage_layers: np.ndarray) -> np.ndarray:
    """Layers of the stage whose activations are offloaded: ``min(N, layers - 1)`` (Megatron keeps
    at least the last layer; N = ``TrainSpec.activation_offload_layers``)."""
    n = p.train.activation_offload_layers
    return np.clip(np.minimum(n, np.asarray(stage_layers) - 1), 0, None).astype(np.float64)


def saved_bytes(p: Problem, stage_layers: np.ndarray, layer_bytes: np.ndarray) -> np.ndarray:
    """Activation bytes per micro-batch offloading takes off the device: ``(N - 1)`` layers of
    ``layer_bytes`` (the double buffer keeps one). Llama-3-8B layer of 1 GiB, N = 8: 7 GiB."""
    return np.maximum(offloaded_layers(p, stage_layers) - 1, 0.0) * layer_bytes


def exposed_s(p: Problem, stage_layers: np.ndarray, layer_bytes: np.ndarray, layer_forward_s: np.ndarray,
              layer_backward_s: np.ndarray) -> np.ndarray:
    """Exposed host-link seconds per micro-batch: per offloaded layer, ``max(copy - forward, 0)``
    out and ``max(copy - backward, 0)`` in, ``copy = layer_bytes / host bandwidth`` (module
    docstring). Example: 1 GiB per layer over 64 GB/s (16.8 ms) under a 10 ms forward and a 20 ms
    backward: 6.8 ms per offloaded layer. Zero without offloading.

    Raises:
        AutoparError: the device has no host link bandwidth (:func:`autopar.cost.offload.host_bandwidth_bytes_per_s`).
    """
    n = offloaded_layers(p, stage_layers)
    if not n.any():
        return np.zeros(np.shape(n))
    option = f"--activation-offload-layers={p.train.activation_offload_layers}"
    copy_s = layer_bytes / offload.host_bandwidth_bytes_per_s(p, option)
    return n * (np.maximum(copy_s - layer_forward_s, 0.0) + np.maximum(copy_s - layer_backward_s, 0.0))
