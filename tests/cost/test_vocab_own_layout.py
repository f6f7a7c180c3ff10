"""Galvatron's vocabulary layers on their own tp (``vtp``), costed by hand (autopar.cost.vocab).

Llama-3-8B on 2 x 8 H100, tp 1 with vtp 2, sequence 4096, mbs 1: a micro-batch's activation is
``2 B * 4096 * 4096 = 32 MiB`` per rank; each vocabulary layer all-reduces its ``vtp/tp = 2``
ranks' tokens (64 MiB) over its 2 ranks and gathers them at its boundary with the tp-1 layers (an
all-gather whose full tensor is 64 MiB over 2 ranks). Its matrices, ``padded_vocab(2) * h / 2``
elements per device, are replicated over ``tp * dp / vtp = 8`` ranks, 2 apart.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost import comm
from autopar.cost.compute import memory_time_s
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.cost.stage_time import ADAM_BYTES_PER_PARAM, dp_exposed_s, optimizer_time_s, stage_time
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy

ACT_BYTES = 2 * 4096 * 4096  # one rank's micro-batch activation, bf16


def _rows(p, s, layers_per_stage):
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size)
    pp = len(layers_per_stage)
    start = np.concatenate([[0], np.cumsum(layers_per_stage)[:-1]])
    stages = Stages(index=np.arange(pp), start=start, layers=np.array(layers_per_stage))
    return batch.take(np.zeros(pp, dtype=np.int64)), stages


@pytest.mark.parametrize("pp, ends", [(1, [2]), (2, [1, 1])])
def test_each_vocabulary_layer_pays_its_collectives_also_when_one_stage_holds_both(pp, ends):
    """pp 1: the one stage holds the embedding and the output layer, so it pays both layers'
    all-reduce and boundary gather (the sum of two bool arrays is their OR: it counted one)."""
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    s = Strategy(dp=16 // pp, tp=1, pp=pp, mbs=1, zero=0, vocab_tp=2)
    batch, stages = _rows(p, s, [32 // pp] * pp)
    one_layer = comm.all_reduce_s(p, 2 * ACT_BYTES, 2, 1) + comm.all_gather_s(p, 2 * ACT_BYTES, 2, 1)
    assert stage_time(p, batch, stages).tp_s == pytest.approx(np.array(ends) * float(one_layer), rel=1e-12)


def test_vocabulary_gradients_reduce_over_their_own_group():
    """The matrices' gradients are all-reduced over the 8 ranks that hold the same shard (stride 2),
    the rest of the stage's parameters over the layers' 16 (stride 1): two collectives. Gradient
    reduction not overlapped (``overlap_grad_reduce`` off), so the exposed time is their sum."""
    p = make_problem("llama3-8b", nodes=2, gbs=64, overlap_grad_reduce=False)
    batch, stages = _rows(p, Strategy(dp=16, tp=1, mbs=1, zero=0, vocab_tp=2), [32])
    params = stage_params(p, batch, stages)
    vocab = float(params.vocab[0])
    assert vocab == pytest.approx(2 * p.padded_vocab(2) * 4096 / 2)  # embedding and output layer, untied
    rest = float(params.dense[0]) - vocab
    t = stage_time(p, batch, stages)
    want = comm.all_reduce_s(p, rest * 4, 16, 1) + comm.all_reduce_s(p, vocab * 4, 8, 2)
    assert dp_exposed_s(p, batch, params, t, np.zeros(1)) == pytest.approx(want, rel=1e-12)
    assert float(want) != pytest.approx(float(comm.all_reduce_s(p, (rest + vocab) * 4, 16, 1)), rel=1e-3)


def test_vocabulary_optimizer_share_is_over_its_own_group():
    """ZeRO-2: each device steps ``rest / 16 + vocab / 8`` parameters (the memory model's shares)."""
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    batch, stages = _rows(p, Strategy(dp=16, tp=1, mbs=1, zero=2, vocab_tp=2), [32])
    params = stage_params(p, batch, stages)
    vocab = float(params.vocab[0])
    local = (float(params.dense[0]) - vocab) / 16 + vocab / 8
    assert optimizer_time_s(p, batch, params) == pytest.approx(memory_time_s(p, ADAM_BYTES_PER_PARAM * local),
                                                               rel=1e-12)
