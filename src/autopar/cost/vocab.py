"""The embedding and output layer under their own tensor-parallel degree (Galvatron's ``vtp``/``vsp``).

Galvatron (``hetu-galvatron`` 2.4.0, ``core/runtime/hybrid_parallel_config.py``
``hp_config_whole_model``; ``core/search_engine/cost_model.py`` ``estimate_other_memory_cost``)
runs the vocabulary layers with ``vtp`` ranks of tensor parallelism, whatever the decoder layers
use, on the same ``tp*dp*cp`` ranks of a pipeline stage; their data parallelism is the rest,
``tp*dp*cp / vtp`` ranks. With ``vsp`` they split the sequence over the ``vtp`` ranks instead
(DeepSpeed-Ulysses style) and keep the whole matrix, data-parallel over all ``tp*dp*cp`` ranks
(Galvatron's ``model_tp = 1`` with ``vsp``).

What changes against the layers' own ``tp`` (``batch.tp``), per device of the first/last stage:

* parameters: ``padded_vocab(vtp) * h / vtp`` elements of each vocabulary matrix (``vsp``: the
  whole ``padded_vocab(1) * h``), their ZeRO group ``tp*dp*cp / vtp`` (``vsp``: ``tp*dp*cp``):
  the model states (:mod:`autopar.cost.memory`), the gradient reduction and weight gathers
  (:func:`autopar.cost.stage_time.dp_exposed_s`: collectives of their own over that group) and
  the optimizer step's share (:func:`autopar.cost.stage_time.optimizer_time_s`);
* compute and logits: unchanged: the stage's tokens are spread over all its ranks either way
  (``vtp`` ranks share ``1/vtp`` of the vocabulary for ``vtp/tp`` times the layers' tokens);
* the vocabulary layer's own collective: one all-reduce over the ``vtp`` group of its tokens'
  activation (``b*s*h*vtp/tp`` elements, bf16) per micro-batch, as Megatron's vocab-parallel
  embedding and output layer; none with ``vsp`` (each rank holds whole rows of the vocabulary);
* re-sharding at the boundary to the decoder layers (Galvatron ``core/runtime/redistribute.py``:
  ``gather_from_group`` / ``split_to_group`` along the batch dimension): where the two sides
  replicate the tokens over ``a = tp`` and ``b = vtp`` ranks (``b = 1`` with ``vsp``), the side
  with fewer tokens per rank all-gathers from ``max(a, b) / min(a, b)`` ranks once per micro-batch
  (forward for a gather, backward for a split), the gathered tensor being
  ``b*s*h * max(a, b) / tp`` bf16 elements.

With ``vocab_tp == tp`` and no ``vsp`` every term equals Megatron's (:mod:`autopar.cost.params`,
:mod:`autopar.cost.stage_time`).
"""

from __future__ import annotations

import numpy as np

from autopar.cost import comm
from autopar.cost import flops as F
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def own_layout(batch: LayoutBatch) -> np.ndarray:
    """Where the vocabulary layers differ from the decoder layers' tensor parallelism (bool ``(n,)``)."""
    return (batch.vocab_tp != batch.tp) | batch.vocab_sp


def matrix_shard_params(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Elements of one vocabulary matrix (embedding or output layer) on one device, ``(n,)``:
    ``padded_vocab(vtp) * h / vtp``, with ``vsp`` the whole ``padded_vocab(1) * h``.
    Example: Llama-3-8B (V 128256, h 4096), vtp 4: 128256 * 4096 / 4 = 131.3e6."""
    h = p.model.hidden_size
    vtp = batch.vocab_tp
    return np.where(batch.vocab_sp, p.padded_vocab(1) * h, p.padded_vocab(vtp) * h / vtp)


def data_parallel_ranks(batch: LayoutBatch) -> np.ndarray:
    """Ranks over which ZeRO shards the vocabulary matrices, ``(n,)``: ``tp*dp*cp / vtp``
    (``vsp``: ``tp*dp*cp``); ``dp*cp`` when ``vtp == tp``. Example: tp 2, dp 4, vtp 8 -> 1."""
    stage = batch.tp * batch.dp * batch.cp
    return np.where(batch.vocab_sp, stage, stage // np.maximum(batch.vocab_tp, 1)).astype(np.float64)


def data_parallel_stride(batch: LayoutBatch) -> np.ndarray:
    """Rank distance between the members of the vocabulary matrices' data-parallel group, ``(n,)``:
    ``vtp`` (its ``vtp`` groups are consecutive ranks, as Galvatron's ``hp_config_whole_model``
    forms them; the ranks holding the same shard are ``vtp`` apart), 1 with ``vsp`` (every rank
    of the stage holds the whole matrix). Example: vtp 2 on 16 ranks -> ranks 0, 2, ..., 14."""
    return np.where(batch.vocab_sp, 1, batch.vocab_tp).astype(np.int64)


def own_group_params(batch: LayoutBatch, vocab_params) -> np.ndarray:
    """The vocabulary parameters of a stage that are reduced and ZeRO-sharded over their own group
    (:func:`data_parallel_ranks`) rather than the decoder layers' ``dp*cp``, ``(n,)``: all of
    ``vocab_params`` (:attr:`autopar.cost.params.StageParams.vocab`) where :func:`own_layout`,
    else 0. Galvatron wraps the embedding and the output layer in their own FSDP modules over
    that group, so their gradients are reduced by collectives of their own."""
    return np.where(own_layout(batch), np.asarray(vocab_params, dtype=np.float64), 0.0)


def layer_collective_s(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Seconds per micro-batch of one vocabulary layer's own collectives, ``(n,)``: its all-reduce
    over the ``vtp`` group (none with ``vsp``) plus the re-sharding all-gather at its boundary
    with the decoder layers (module docstring). Where :func:`own_layout` is False this is one
    all-reduce of the layers' activation over tp, as :mod:`autopar.cost.stage_time` costs it."""
    act_bytes = F.BF16 * F.tokens(p, batch) * p.model.hidden_size  # the decoder layers' tokens per rank
    vtp = batch.vocab_tp.astype(np.float64)
    vocab_tokens_share = np.where(batch.vocab_sp, 1.0, vtp)  # ranks holding the same tokens in the vocab layer
    own = np.where(batch.vocab_sp, 0.0, comm.all_reduce_s(p, act_bytes * vtp / batch.tp, batch.vocab_tp, 1))
    low, high = np.minimum(batch.tp, vocab_tokens_share), np.maximum(batch.tp, vocab_tokens_share)
    ratio = np.maximum(np.round(high / low), 1)
    boundary = comm.all_gather_s(p, act_bytes * high / batch.tp, ratio, low)
    return own + boundary
