"""The data-parallel weight all-gather in fp8 (``TrainSpec.fp8_param_storage``).

Mechanism: with fp8 parameter storage the linear weights exist on the device only as fp8 tensors,
and the sharded optimizer gathers them as such, 1 B per element instead of the 2 B of a bf16
weight:

* Megatron-LM ``--fp8-param-gather`` (``megatron/training/arguments.py``: "Keep the compute param
  in fp8 (do not use any other intermediate dtype) and perform the param all-gather in fp8"), with
  the distributed optimizer or Megatron-FSDP;
* NeMo 1.0 ``model.fp8_params: true`` with ``distributed_fused_adam``
  (``nemo/core/optim/distributed_adam.py``, ``MegatronDistributedFusedAdam.init_params_bucket``:
  Float8Tensor parameters get buckets of their own with ``param_sync_dtype=torch.uint8``).

Only the decoder layers' fp8 GEMM weights (:func:`autopar.cost.fp8.linear_params`, less those of
the layers kept in bf16, :mod:`autopar.cost.fp8_bf16_layers`) travel in fp8; the embedding, the
output layer, norms and biases stay bf16 (2 B). The gradient reduce-scatter is unchanged
(``grad_dtype``). :func:`autopar.cost.stage_time.dp_exposed_s` gathers ``2 * dense - fp8_dense``
bytes over the dense data-parallel group and ``2 * experts - fp8_experts`` over the expert one.

Example: GPT-3 175B, tp 4, pp 8 (12 layers of 12 * 12288^2 linear weights each): 5.44e9 linear
parameters per device, so the all-gather moves 5.44 GB less than the 2 B gather.

Units: parameter counts (elements), arrays over (layout, stage) rows.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import fp8, fp8_bf16_layers
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def applies(p: Problem) -> bool:
    """Whether the weight all-gather runs in fp8: fp8 training with ``fp8_param_storage``."""
    return p.train.precision == "fp8" and p.train.fp8_param_storage


def gathered_params(p: Problem, batch: LayoutBatch, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters on one device of each stage row that the data-parallel all-gather
    moves in fp8 (1 B each): the fp8 linear weights of the stage's decoder layers (dense: the
    TP-split and replicated linears; expert: the routed experts' weights, sharded by ep * etp),
    without the bf16 layers'. Zeros unless :func:`applies`. Shapes ``(n,)``."""
    n = len(stages.layers)
    if not applies(p):
        return np.zeros(n), np.zeros(n)
    dense, experts = fp8.linear_params_split(p, batch, stages)
    bf16_dense, bf16_experts = fp8_bf16_layers.linear_params_split(p, batch, stages)
    return np.asarray(dense - bf16_dense, dtype=np.float64), np.asarray(experts - bf16_experts, dtype=np.float64)
