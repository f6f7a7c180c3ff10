"""bf16 first and last layers inside fp8 training (``TrainSpec.fp8_bf16_layers``).

Mechanism: Megatron-Core ``TransformerConfig.first_last_layers_bf16`` with
``num_layers_at_start_in_bf16`` / ``num_layers_at_end_in_bf16`` (Megatron-LM
``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N --num-layers-at-end-in-bf16 M``;
``megatron/core/fp8_utils.py`` ``get_fp8_context``: a layer whose number is among the first N or the
last M runs under a null context instead of ``fp8_autocast``). Megatron-Bridge's current-scaling
recipe ``bf16_with_fp8_current_scaling_mixed`` sets it with N = M = 1
(``src/megatron/bridge/training/mixed_precision.py`` at 067f987); NVIDIA's performance configurations
switch it off (``scripts/performance/utils/precision.py``: "Disable BF16 Transformer layers in the
performance config"), so their FP8-CS validation rows have none. Megatron-Core refuses it with
delayed scaling and allows at most ``num_layers // pp`` layers at each end
(``transformer_config.py`` ``__post_init__``), so the first N layers lie on pipeline rank 0 and the
last M on rank pp - 1 (with interleaving: in rank 0's first and rank pp - 1's last model chunk).

* **Time.** Those layers' linear GEMMs run at the bf16 peak and efficiency, with no input cast
  (:func:`layer_time_deltas`: the difference between a layer costed as bf16 training and as fp8
  training, :func:`autopar.cost.compute.layer_forward_times`); the other layers are fp8 as before.
* **Memory.** Transformer Engine creates no fp8 weight copy, transpose or scaling state for modules
  outside ``fp8_autocast``: :func:`linear_params` of the bf16 layers is taken out of the fp8
  weight-copy bytes and their GEMMs out of the scaling state (:func:`autopar.cost.fp8.extra_memory_bytes`).
  Their linear layers save their bf16 inputs (2 B per element) where fp8 ones save the 1-byte fp8
  copy (:func:`autopar.cost.activations.linear_input_bytes`): such a layer's activations are the
  bf16 layer's (:func:`autopar.cost.memory.stored_layer_bytes`). With every layer in bf16 the
  time and memory are bf16 training's.

Units: layer counts, parameters, seconds; arrays over (layout, stage) rows.
"""

from __future__ import annotations

import numpy as np

from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def layer_counts(p: Problem, batch: LayoutBatch, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """(dense, MoE) bf16 layers on each stage row: the first N layers on stage 0, the last M on
    stage pp - 1 (both on one stage with pp 1), each capped at the stage's layers; split by kind
    along the model's layer order (DeepSeek-V3's first three layers are dense). Zeros without
    bf16 layers. Example: Qwen3-30B-A3B (48 MoE layers), N = M = 1, pp 4: (0, 1) on stages 0 and
    3, (0, 0) on 1 and 2; pp 1: (0, 2)."""
    start, end = p.train.bf16_end_layers
    zero = np.zeros(len(stages.layers))
    if not start and not end:
        return zero, zero
    from autopar.cost.params import _moe_prefix

    first, last = _end_layers(p, batch, stages)
    prefix, L = _moe_prefix(p.model), p.model.num_layers
    n_moe = (prefix[first] + prefix[L] - prefix[L - last]).astype(np.float64)
    return (first + last) - n_moe, n_moe


def _end_layers(p: Problem, batch: LayoutBatch, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """(first-end, last-end) bf16 layers each stage row holds (int arrays)."""
    start, end = p.train.bf16_end_layers
    first = np.where(stages.is_first(), np.minimum(start, stages.layers), 0).astype(np.int64)
    last = np.where(stages.is_last(batch), np.minimum(end, stages.layers), 0).astype(np.int64)
    return first, last


def bf16_problem(p: Problem) -> Problem:
    """``p`` trained in bf16 (no fp8 recipe, weight storage or bf16 layers): the cost of a bf16 layer."""
    train = p.train.model_copy(update={"precision": "bf16", "fp8_recipe": None, "fp8_param_storage": False,
                                       "fp8_bf16_layers": None})
    return Problem(p.model, p.cluster, train)


def layer_time_deltas(p: Problem, batch: LayoutBatch, stages: Stages, dense, moe) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds each stage row adds per micro-batch by running its bf16 layers
    (:func:`layer_counts`) at bf16 rather than fp8 speed: ``n_dense * (bf16 - fp8 dense layer) +
    n_moe * (bf16 - fp8 MoE layer)``; ``dense`` / ``moe``: the fp8 layers' ``LayerTimes``. Zeros
    without bf16 layers. Example: one bf16 dense layer of 10 ms forward against 7 ms in fp8 adds
    3 ms forward and 6 ms backward (2x forward)."""
    from autopar.cost import compute as C

    n_dense, n_moe = layer_counts(p, batch, stages)
    if not (n_dense.any() or n_moe.any()):
        zero = np.zeros(len(stages.layers))
        return zero, zero
    p16 = bf16_problem(p)
    dense16 = C.layer_forward_times(p16, batch, moe=False)
    moe16 = C.layer_forward_times(p16, batch, moe=True) if p.model.is_moe else dense16
    forward = n_dense * (dense16.forward_s - dense.forward_s) + n_moe * (moe16.forward_s - moe.forward_s)
    backward = n_dense * (dense16.backward() - dense.backward()) + n_moe * (moe16.backward() - moe.backward())
    return forward, backward


def linear_params(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Linear-layer parameters of the stage's bf16 layers on one device (sharded as
    :func:`autopar.cost.fp8.linear_params`): no fp8 copy is made of them."""
    dense, experts = linear_params_split(p, batch, stages)
    return dense + experts


def linear_params_split(p: Problem, batch: LayoutBatch, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """:func:`linear_params` as (dense, expert) parts, split as
    :func:`autopar.cost.fp8.linear_params_split`. Zeros without bf16 layers; shapes ``(n,)``."""
    from autopar.cost.fp8 import _linear_prefix

    if p.train.bf16_end_layers == (0, 0):
        zero = np.zeros(len(stages.layers))
        return zero, zero
    tp, rep, exp = _linear_prefix(p.model)
    L = p.model.num_layers
    first, last = _end_layers(p, batch, stages)

    def span(prefix: np.ndarray) -> np.ndarray:
        return prefix[first] - prefix[0] + prefix[L] - prefix[L - last]

    return span(tp) / batch.tp + span(rep), span(exp) / (batch.ep * batch.etp)
