"""Multi-token prediction (DeepSeek-V3 report sec. 2.2; Megatron-Core
``multi_token_prediction.py``, ``--mtp-num-layers``): costs on the last pipeline stage.

Each MTP module normalises the next token's embedding and the previous hidden state (two
RMSNorms), projects their concatenation ``2h -> h`` (TP column-parallel ``eh_proj``), runs one
decoder layer (shaped like the model's last layer: MoE in DeepSeek-V3) and the shared output
layer and loss. Megatron places the MTP block after the last decoder layer, on the last
pipeline stage, which then also holds a copy of the embedding (shared with stage 0 like a tied
output layer) when ``pp > 1``.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import activations as act
from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import moe as moe_cost
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem


def _last_is_moe(p: Problem) -> bool:
    return p.model.is_moe_layer(p.model.num_layers - 1)


def params(p: Problem, batch: LayoutBatch) -> tuple[np.ndarray, np.ndarray]:
    """(dense, routed-expert) parameters of the MTP modules on one device of the last stage,
    including the embedding copy when ``pp > 1``."""
    m = p.model
    if not m.mtp_num_layers:
        return np.zeros(len(batch)), np.zeros(len(batch))
    layer = m.layer_params(m.num_layers - 1)
    h = m.hidden_size
    dense = (layer.tp + 2 * h * h) / batch.tp + layer.replicated + 2 * m.norm_params
    experts = layer.experts / (batch.ep * batch.etp)
    embedding = np.where(batch.pp > 1, p.padded_vocab(batch.tp) * h / batch.tp, 0.0)
    return m.mtp_num_layers * dense + embedding, m.mtp_num_layers * experts


def activation_bytes(p: Problem, batch: LayoutBatch, layers=None) -> np.ndarray:
    """Activations of the MTP modules per micro-batch: the two norm inputs and the ``eh_proj``
    input (``2h`` each, SP-sharded), one decoder layer, and one more set of fp32 logits.
    ``layers``: the rows' :func:`autopar.cost.memory.layer_bytes` when the caller has them (the
    layer's bytes are taken from there instead of costed again)."""
    m = p.model
    if not m.mtp_num_layers:
        return np.zeros(len(batch))
    shard = np.where(batch.sp, batch.tp, 1)
    n = F.tokens(p, batch)
    inputs = 2 * act.BF16 * n * 2 * m.hidden_size / shard
    if layers is not None:
        layer = layers.moe if _last_is_moe(p) else layers.dense_megatron
    else:
        selective = batch.recompute == 1
        layer = act.attention_bytes(p, batch, selective) + act.mlp_bytes(p, batch, _last_is_moe(p), selective)
    return m.mtp_num_layers * (inputs + layer + act.output_bytes(p, batch))


def forward_s(p: Problem, batch: LayoutBatch, dense_s: np.ndarray, moe_s: np.ndarray, output_s: np.ndarray | None = None,
              embedding_s: np.ndarray | None = None) -> np.ndarray:
    """Forward compute of the MTP modules per micro-batch: ``eh_proj``, one layer (``moe_s`` or
    ``dense_s``, the forward of one MoE / dense layer), the output layer with its loss
    (``output_s``: :func:`autopar.cost.compute.output_forward_time_s`), and the embedding lookup
    (``embedding_s``: :func:`~autopar.cost.compute.embedding_forward_time_s`); either is costed here when None."""
    m = p.model
    if not m.mtp_num_layers:
        return np.zeros(len(batch))
    n = F.tokens(p, batch)
    proj = C.gemm_time_s(p, F.Gemm(n, m.hidden_size / batch.tp, 2 * m.hidden_size))
    layer = moe_s if _last_is_moe(p) else dense_s
    output_s = C.output_forward_time_s(p, batch) if output_s is None else output_s
    embedding_s = C.embedding_forward_time_s(p, batch) if embedding_s is None else embedding_s
    per = proj + layer + output_s + embedding_s
    return m.mtp_num_layers * per


def ep_comm_s(p: Problem, batch: LayoutBatch, layer_comm_s: np.ndarray | None = None) -> np.ndarray:
    """EP/ETP communication of the MTP layers per micro-batch (forward and backward);
    ``layer_comm_s``: :func:`autopar.cost.moe.layer_comm_s` when the caller has it (costed here when None)."""
    if not (p.model.mtp_num_layers and _last_is_moe(p)):
        return np.zeros(len(batch))
    return p.model.mtp_num_layers * (moe_cost.layer_comm_s(p, batch) if layer_comm_s is None else layer_comm_s)
