"""Weight-gradient accumulation without Megatron's fusion (``TrainSpec.grad_accumulation_fusion`` off;
Megatron-LM ``--no-gradient-accumulation-fusion``).

With the fusion (Megatron-LM's default) the weight-gradient GEMM of each linear layer accumulates
straight into the parameter's main gradient: Megatron-Core ``tensor_parallel/layers.py``
``LinearWithGradAccumulationAndAsyncCommunication.backward`` calls
``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output, weight.main_grad)``
(Transformer Engine's linears do the same with ``fuse_wgrad_accumulation``), so the read and write
of ``main_grad`` ride in the GEMM's epilogue. Without it the GEMM writes the gradient to
``param.grad`` in the parameter's dtype and the DDP backward hook adds it into the main gradient
(``distributed/distributed_data_parallel.py`` ``_make_backward_post_hook``:
``param.main_grad.add_(param.grad.data)``, then ``param.grad = None``), once per parameter and
micro-batch. That separate memory-bound kernel reads ``param.grad`` (2 B, bf16/fp16 weights),
reads and writes ``main_grad`` (``TrainSpec.grad_bytes`` each: 4 B for fp32 main gradients), so
:data:`PARAM_BYTES` + 2 x grad bytes = 10 B per parameter per micro-batch with fp32 main
gradients, at the device's HBM bandwidth (:func:`autopar.cost.compute.memory_time_s`). Example
(test): a llama2-7b stage of 8 layers at tp 2 holds 809,566,208 parameters per device; with fp32
main gradients they move 8,095,662,080 B, 3.45 ms per micro-batch on an H100 (3.35 TB/s at the
preset's 0.7 achievable fraction).

Which parameters: every decoder-layer weight of the stage on this device (attention, MLP and
expert matrices, norms; :func:`autopar.cost.params.stage_params`) and the output layer; the input
embedding is excluded, since its backward writes ``param.grad`` and is added by the hook with the
fusion too. The transient ``param.grad`` (one weight at a time, freed by the hook) is not counted
in memory. Applies to Megatron-LM's DDP and distributed optimizer (ZeRO 0/1); Megatron-FSDP (ZeRO
2/3) requires the fusion off and keeps its own gradient buffers, and the other frameworks have no
such fusion: there nothing changes. Units: seconds per micro-batch, arrays over layouts.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import vocab
from autopar.cost.compute import memory_time_s
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

PARAM_BYTES = 2  # param.grad in the 16-bit weight dtype


def accumulated_params(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Parameters per device of each (layout, stage) row whose gradient the hook adds (module
    docstring): the stage's parameters less the input embedding (and learned positions) of the
    first stage. Shape ``(n,)``, element counts."""
    params = stage_params(p, batch, stages)
    m = p.model
    positions = m.hidden_size * (m.max_position_embeddings or 0) if m.position_embedding == "learned" else 0
    embedding = np.where(stages.is_first(), vocab.matrix_shard_params(p, batch) + positions, 0.0)
    return params.total - embedding


def unfused_backward_s(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """Seconds per micro-batch the main-gradient additions add to a stage's backward: 0 with the
    fusion, with ZeRO 2/3 or outside Megatron-LM (module docstring). Shape ``(n,)``."""
    if p.train.grad_accumulation_fusion or p.train.framework != "megatron":
        return np.zeros(len(batch))
    moved = (PARAM_BYTES + 2 * p.train.grad_bytes) * accumulated_params(p, batch, stages)
    return np.where(batch.zero <= 1, memory_time_s(p, moved), 0.0)
