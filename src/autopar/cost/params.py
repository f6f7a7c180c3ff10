"""Parameters held by one device of one pipeline stage, split by how they are sharded.

Sharding follows Megatron-Core: attention/MLP/shared-expert matrices split over ``tp``; norm
weights, row-parallel biases, the router and MLA down-projections replicated; routed experts
split over ``ep * etp``; the word embedding and output layer vocab-parallel over ``tp`` with
the padded vocabulary. With ``pp > 1`` and tied embeddings the last stage keeps its own copy
of the embedding matrix (Megatron ``shared_embedding_or_output_weight``), so tying saves
nothing there.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from autopar.cost import fp8_param_gather, mtp, vocab
from autopar.cost.stage import Stages
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs import ModelSpec


@dataclass
class StageParams:
    """Parameter counts (elements) on one device of a stage; arrays of shape ``(n,)``.

    ``dense`` is sharded for the optimizer over the dp*cp group, ``experts`` over the
    expert-data-parallel group; ``vocab`` is the part of ``dense`` that is the embedding and
    output matrices, whose group differs with Galvatron's ``vtp``/``vsp``
    (:func:`autopar.cost.vocab.data_parallel_ranks`).
    """

    dense: np.ndarray
    experts: np.ndarray
    layer_max: np.ndarray  # largest single decoder layer on the device (ZeRO-3 gather unit)
    vocab: np.ndarray | float = 0.0  # the embedding / output matrices among ``dense`` (autopar.cost.vocab)
    # the fp8 linear weights among ``dense`` / ``experts`` that the all-gather moves at 1 B
    # (fp8 parameter storage, autopar.cost.fp8_param_gather); 0 otherwise
    fp8_dense: np.ndarray | float = 0.0
    fp8_experts: np.ndarray | float = 0.0

    @property
    def total(self) -> np.ndarray:
        return self.dense + self.experts


@lru_cache(maxsize=64)
def _layer_table(model: ModelSpec) -> tuple[np.ndarray, np.ndarray]:
    """Prefix sums over layers of the (tp, replicated, expert) buckets, shape ``(L+1, 3)``, and
    the largest layer's buckets, shape ``(3,)``."""
    rows = np.array([model.layer_params(i) for i in range(model.num_layers)], dtype=np.float64)
    return np.concatenate([np.zeros((1, 3)), np.cumsum(rows, axis=0)]), rows.max(axis=0)


def stage_params(p: Problem, batch: LayoutBatch, stages: Stages) -> StageParams:
    """Per-device parameters of each (layout, stage) row.

    Shapes: every array ``(n,)``; element counts as float64.
    """
    model = p.model
    cum, biggest = _layer_table(model)
    cum_tp, cum_rep, cum_exp = cum[:, 0], cum[:, 1], cum[:, 2]
    end = stages.start + stages.layers
    tp_part = (cum_tp[end] - cum_tp[stages.start]) / batch.tp
    replicated = cum_rep[end] - cum_rep[stages.start]
    experts = (cum_exp[end] - cum_exp[stages.start]) / (batch.ep * batch.etp)

    vocab_shard = vocab.matrix_shard_params(p, batch)  # padded_vocab(tp) * h / tp unless vtp/vsp differ
    positions = model.hidden_size * (model.max_position_embeddings or 0) if model.position_embedding == "learned" else 0
    first, last = stages.is_first(), stages.is_last(batch)
    embedding = np.where(first, vocab_shard + positions, 0.0)
    # Output layer: own matrix if untied; a copy of the embedding if tied and pp > 1.
    head = np.where(last & (~first | (not model.tie_word_embeddings)), vocab_shard, 0.0)
    final_norm = np.where(last, model.norm_params, 0.0)

    mtp_dense, mtp_experts = mtp.params(p, batch)  # MTP block (and its embedding copy) where the layout puts it
    holds = stages.holds_mtp(batch)
    dense = tp_part + replicated + embedding + head + final_norm + np.where(holds, mtp_dense, 0.0)
    experts = experts + np.where(holds, mtp_experts, 0.0)
    layer_max = biggest[0] / batch.tp + biggest[1] + biggest[2] / (batch.ep * batch.etp)
    fp8_dense, fp8_experts = fp8_param_gather.gathered_params(p, batch, stages)
    return StageParams(dense=dense, experts=experts, layer_max=layer_max,
                       vocab=np.where(first, vocab_shard, 0.0) + head, fp8_dense=fp8_dense, fp8_experts=fp8_experts)


@lru_cache(maxsize=64)
def _moe_prefix(model: ModelSpec) -> np.ndarray:
    flags = np.array([model.is_moe_layer(i) for i in range(model.num_layers)], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(flags)])


def layer_kinds(model: ModelSpec, stages: Stages) -> tuple[np.ndarray, np.ndarray]:
    """(dense layers, MoE layers) on each stage row, as float arrays."""
    prefix = _moe_prefix(model)
    n_moe = (prefix[stages.start + stages.layers] - prefix[stages.start]).astype(np.float64)
    return stages.layers - n_moe, n_moe
