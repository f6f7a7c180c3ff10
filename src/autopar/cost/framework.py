"""Documented behaviour of training frameworks other than Megatron-LM (``TrainSpec.framework``).

DeepSpeed ZeRO-3 (``deepspeed/runtime/zero/partitioned_param_coordinator.py``,
``PartitionedParameterCoordinator.fetch_sub_module``; Rajbhandari et al., "ZeRO", SC'20 sec. 7)
gathers the parameters of each *submodule* that owns parameters right before it runs, as one
all-gather over the data-parallel group, and frees them after it; the backward pass gathers them
again, and so does the recomputed forward of an activation-checkpointed layer (its forward hooks
fire again). A Megatron GPT layer has six such submodules (``input_layernorm``,
``query_key_value``, ``dense``, ``post_attention_layernorm``, ``dense_h_to_4h``,
``dense_4h_to_h``). Gradients are reduce-scattered in buckets of ``reduce_bucket_size``
elements (DeepSpeed ``zero/config.py`` default 5e8).

Each ring collective over ``g`` ranks takes ``(g-1)`` latency steps (:mod:`autopar.cost.comm`),
so with thousands of gathers per step over a large data-parallel group the latency, not the
bandwidth, dominates: this is why ZeRO-3 loses to 3D parallelism at scale in Narayanan et al.,
SC'21 sec. 5.2 / Table 2 (175B: 144 -> 88 TFLOP/s from 384 to 768 GPUs at the same batch).
"""

from __future__ import annotations

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

DEEPSPEED_MODULES_PER_LAYER = 6  # submodules with parameters in a Megatron GPT layer (see above)
DEEPSPEED_EXTRA_MODULES = 3  # word embedding, position embedding, final layernorm
DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 5e8  # zero_optimization.reduce_bucket_size default


def zero3_gathers_per_pass(p: Problem, layers) -> np.ndarray:
    """Parameter all-gathers DeepSpeed ZeRO-3 issues for one forward (or backward) pass over
    ``layers`` decoder layers: one per submodule that owns parameters.

    Example: GPT-3 175B (96 layers) -> 6 * 96 + 3 = 579 gathers per pass.
    """
    return DEEPSPEED_MODULES_PER_LAYER * np.asarray(layers, dtype=np.float64) + DEEPSPEED_EXTRA_MODULES


def zero3_latency_s(p: Problem, batch: LayoutBatch, layers, recomputed, grad_elements, alpha_step) -> np.ndarray:
    """Latency of DeepSpeed ZeRO-3's collectives for one micro-batch on one stage (s).

    Gathers: a forward pass, the backward pass and the recomputed forward of each fully
    recomputed layer; reduce-scatters: ``ceil(grad_elements / reduce_bucket_size)`` buckets.
    Each collective costs ``(g-1) * alpha_step`` over the ``g = dp*cp`` ranks. Zero unless
    ``TrainSpec.framework == 'deepspeed'`` (Megatron/torch FSDP gather one whole layer per
    collective, already priced as one collective by :func:`autopar.cost.stage_time.dp_exposed_s`).

    Example: 175B (174.6e9 parameters) on 768 GPUs, full recompute, 20 us per step:
    (2 * 579 + 6 * 96 + ceil(349.2)) * 767 * 20e-6 = 2084 * 767 * 20e-6 = 31.97 s.
    """
    if p.train.framework != "deepspeed":
        return np.zeros(len(batch))
    gathers = 2 * zero3_gathers_per_pass(p, layers) + DEEPSPEED_MODULES_PER_LAYER * np.asarray(recomputed)
    buckets = np.ceil(np.asarray(grad_elements, dtype=np.float64) / DEEPSPEED_REDUCE_BUCKET_ELEMENTS)
    steps = np.maximum(batch.dp * batch.cp - 1, 0)
    return (gathers + buckets) * steps * alpha_step


# Host (CPU) seconds one GPT decoder layer's forward pass spends in Python/PyTorch dispatch, exposed
# when kernel launches are synchronous. Fit on public data that autopar's validation CSV does not
# hold: BLOOM-prequel 181B (72 x 14336, 64 heads) tp8 runs on Jean Zay swept over mbs 1/2/4/8
# (bigscience tr11-176B-ml/chronicles-prequel.md, "48 node contenders", 02-21: tp8pp12dp4 143.3 /
# 134.0 / 123.7 / 129.3 s, tp8pp6dp8 139.8 / 131.0 / 121.5 s). The same layout gets slower with
# smaller micro-batches far beyond its pipeline bubble, i.e. by a fixed cost per (layer,
# micro-batch); least squares on the differences to each layout's mbs=4 run gives 2.5-2.7 ms per
# forward-pass equivalent (rms 3.5 s, vs 16.7 s without it). A bottom-up count (about 50 PyTorch
# ops per Megatron-DeepSpeed layer forward, 10-25 us host time each, plus DeepSpeed checkpointing
# and RNG-tracker work) explains roughly half of it, so the value is an empirical constant of
# Megatron-DeepSpeed (PyTorch 1.11, 2022) on Jean Zay's host, not a derived one.
LAUNCH_BLOCKING_HOST_S_PER_LAYER_PASS = 2.6e-3


def launch_blocking_host_s_per_layer(p: Problem) -> float:
    """Host seconds added per decoder layer per forward pass when ``TrainSpec.launch_blocking``.

    With ``CUDA_LAUNCH_BLOCKING=1`` (set in BLOOM's training script, bigscience
    ``train/tr11-176B-ml/tr11-176B-ml.slurm``: "do not remove or the training will hang") each
    launch returns only once its kernel has finished, so the GPU idles while the host prepares the
    next op: the layer's host dispatch time (:data:`LAUNCH_BLOCKING_HOST_S_PER_LAYER_PASS`) adds to
    its GPU time instead of overlapping it. Callers charge it once per forward and recomputed
    forward and twice per backward (autograd launches about two kernels per forward op). The cost
    per step grows with the number of (layer, micro-batch) passes a device runs,
    ``layers/pp * gbs/(dp*mbs)``, i.e. with ``tp/mbs`` at a fixed world size. 0.0 when launches are
    asynchronous (the default): the host then runs ahead of the GPU.
    """
    return LAUNCH_BLOCKING_HOST_S_PER_LAYER_PASS if p.train.launch_blocking else 0.0
