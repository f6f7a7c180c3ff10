"""Data parallelism with the gradient reduced once per step (``TrainSpec.grad_reduce_once``; Galvatron's default).

Galvatron wraps each layer in torch FSDP (``dp_types_enc`` 1 = ZeRO-3 ``FULL_SHARD``, the
``default_dp_type`` zero2 = ``SHARD_GRAD_OP``, ddp = ``NO_SHARD``: ``core/runtime/parallel.py``)
and, with more than one micro-batch, runs them
inside FSDP's ``no_sync`` (``--async_grad_reduce``, on by default: ``core/runtime/pipeline/
pipeline.py`` ``enter_no_sync_context`` ... ``exit_no_sync_context`` + ``fsdp_reduce_gradients``,
for pp = 1, GPipe and 1F1B alike). So, per stage:

* memory: the full, unsharded gradient of the stage's parameters is kept through the
  micro-batches: 2 bytes per parameter with ZeRO-3 (bf16, FSDP's ``param_dtype``) and 4 with
  ZeRO-2, on top of the sharded state; Galvatron's own cost model counts exactly these shares of
  its 16-byte model state, ``1/8`` (zero3) and ``2/8`` (zero2) unsharded when ``chunks > 1``
  (``core/search_engine/cost_model.py``, ``zero3_ratio`` / ``zero2_ratio`` with
  ``async_grad_reduce``);
* time: one reduce-scatter (ddp: one all-reduce) after the stage's last backward, outside the
  schedule, so only the pipeline-drain slack hides it (Megatron overlaps it with the last
  micro-batch's backward; ZeRO-2 there reduce-scatters every micro-batch); ZeRO-3 still all-gathers the
  weights for every forward and backward (FSDP reshards after forward; Galvatron sets
  ``_needs_pre_backward_unshard``), overlapped layer by layer except one layer's gather.

How the ZeRO-3 gathers overlap (hetu-galvatron 2.4.0 with torch 2.x): each decoder layer is its own
FSDP unit (``core/runtime/parallel.py`` ``apply_fsdp``) built with ``limit_all_gathers=True`` and
its ``backward_prefetch=...`` argument commented out in all three wrappers, so torch's default
``BackwardPrefetch.BACKWARD_PRE`` applies (``FullyShardedDataParallel.__init__``): in backward
the next layer's all-gather is issued before the current layer's gradient kernels; in forward
(``forward_prefetch=False``) each layer's all-gather is issued on FSDP's unshard stream when the
host reaches that layer, which with the host ahead of the GPU is while the previous layer
computes (torch's docstring of ``forward_prefetch``: explicit prefetching "is only useful for
CPU-bound workloads"; the rate limiter keeps at most two layers' gathered weights in flight).
``FULL_SHARD`` frees the gathered weights after backward even inside ``no_sync`` (torch
``fsdp/_runtime_utils.py`` ``_should_free_in_backward``), hence a gather per forward and per
backward of every micro-batch. Galvatron's own cost model charges one forward all-gather per layer
and micro-batch, added without overlap (``core/search_engine/cost_model.py``
``TimeCostModel.gen_result``: "TODO: add overlap when fsdp is used"), where its runtime overlaps
both as above.

With one micro-batch nothing changes (``no_sync`` is not entered).
"""

from __future__ import annotations

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

UNSHARDED_GRAD_BYTES = {2: 4, 3: 2}  # ZeRO stage -> bytes per parameter kept unsharded (Galvatron cost_model.py)


def applies(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Where the gradient is reduced once per step: ``grad_reduce_once``, ZeRO 0, 2 or 3 (the
    FSDP sharding strategies; ZeRO-1 is Megatron's distributed optimizer) and more than one
    micro-batch (bool ``(n,)``)."""
    return p.train.grad_reduce_once & (batch.zero != 1) & (batch.num_microbatches > 1)


def unsharded_grad_bytes(p: Problem, batch: LayoutBatch, stage_params) -> np.ndarray:
    """Bytes of the unsharded gradient a device keeps through the micro-batches, ``(n,)``:
    :data:`UNSHARDED_GRAD_BYTES` of its ZeRO stage times its stage parameters (elements), where
    :func:`applies`; else 0. Example: a 1e9-parameter stage under ZeRO-3 -> 2e9 bytes."""
    per_param = np.select([batch.zero == 3, batch.zero == 2], [UNSHARDED_GRAD_BYTES[3], UNSHARDED_GRAD_BYTES[2]], 0)
    return np.where(applies(p, batch), per_param * np.asarray(stage_params, dtype=np.float64), 0.0)


def exposed_s(batch: LayoutBatch, all_reduce_s, all_gather_s, reduce_scatter_s, forward_s, backward_s, slack_s,
              layers) -> np.ndarray:
    """Exposed data-parallel seconds per step of one stage where :func:`applies` (module
    docstring): ddp's all-reduce, or the reduce-scatter, beyond ``slack_s``, plus for ZeRO-3 per
    micro-batch the weight gathers of forward and backward beyond their compute (at least one
    layer's each); ZeRO-2 gathers once, under the first forward. Arrays ``(n,)``; ``layers``:
    decoder layers per stage."""
    m = batch.num_microbatches
    per_layer = np.maximum(layers, 1)
    gathers = np.where(batch.zero >= 3,
                       m * (np.maximum(all_gather_s - forward_s, all_gather_s / per_layer)
                            + np.maximum(all_gather_s - backward_s, all_gather_s / per_layer)),
                       np.maximum(all_gather_s - forward_s, 0.0))
    return np.where(batch.zero == 0, np.maximum(all_reduce_s - slack_s, 0.0),
                    np.maximum(reduce_scatter_s - slack_s, 0.0) + gathers)
