"""The data-parallel weight all-gather in fp8 with fp8 parameter storage (autopar.cost.fp8_param_gather)."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import comm
from autopar.cost.fp8_param_gather import gathered_params
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.cost.stage_time import StageTime, dp_exposed_s
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import make_problem, toy_model

# 8 layers of h = 1024 with a 4h MLP and no biases: 12 h^2 = 12,582,912 linear weights per layer.
MODEL = toy_model(num_layers=8, hidden_size=1024, num_attention_heads=8, num_kv_heads=8, head_dim=128,
                  ffn_hidden_size=4096, vocab_size=32000)
LINEAR_PER_LAYER = 12 * 1024**2


def _batch(dp: int = 2, tp: int = 2, pp: int = 2) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(dp=dp, tp=tp, pp=pp, zero=1), 64)


def test_fp8_stored_weights_of_a_stage_are_its_layers_linear_weights_over_tp():
    p = make_problem(MODEL, precision="fp8", fp8_param_storage=True)
    stages = Stages(index=np.array([0, 1]), start=np.array([0, 4]), layers=np.array([4, 4]))
    dense, experts = gathered_params(p, _batch(), stages)
    # 4 layers x 12 h^2 / tp 2 = 25,165,824 on each stage; embedding and output layer stay bf16.
    assert dense == pytest.approx([4 * LINEAR_PER_LAYER / 2] * 2)
    assert experts == pytest.approx([0.0, 0.0])


def test_no_fp8_gather_without_fp8_storage_or_in_bf16():
    stages = Stages(index=np.array([0]), start=np.array([0]), layers=np.array([4]))
    for p in (make_problem(MODEL, precision="fp8"), make_problem(MODEL, precision="bf16")):
        dense, experts = gathered_params(p, _batch(), stages)
        assert dense[0] == 0.0 and experts[0] == 0.0


def test_bf16_end_layers_gather_their_weights_in_bf16():
    # first/last layers kept in bf16 (tensorwise recipe): stage 0 holds layer 0 in bf16.
    p = make_problem(MODEL, precision="fp8", fp8_param_storage=True, fp8_recipe="tensorwise", fp8_bf16_layers=(1, 1))
    stages = Stages(index=np.array([0, 1]), start=np.array([0, 4]), layers=np.array([4, 4]))
    dense, _ = gathered_params(p, _batch(), stages)
    assert dense == pytest.approx([3 * LINEAR_PER_LAYER / 2] * 2)


def test_weight_all_gather_moves_one_byte_per_fp8_weight():
    # dp 16 over two nodes, nothing to hide under (zero compute): the exposed time is the whole
    # reduce-scatter plus the all-gather; storing the linear weights in fp8 takes 1 B per linear
    # weight off the gathered tensor: (g - 1) / g * F / bw less, with the latency unchanged.
    batch = LayoutBatch.from_strategy(Strategy(dp=16, tp=1, pp=1, zero=1), 64)
    stages = Stages(index=np.array([0]), start=np.array([0]), layers=np.array([8]))
    zero = np.zeros(1)
    idle = StageTime(forward_s=zero, backward_s=zero, recompute_s=zero, tp_s=zero, cp_s=zero, ep_s=zero)
    times = []
    for storage in (False, True):
        p = make_problem(MODEL, nodes=2, precision="fp8", fp8_param_storage=storage)
        times.append(dp_exposed_s(p, batch, stage_params(p, batch, stages), idle, zero)[0])
    bw, _ = comm.group_bus_bandwidth(p, np.array([16]), np.array([1]), "all_gather")
    fp8_weights = 8 * LINEAR_PER_LAYER
    assert times[0] - times[1] == pytest.approx(15 / 16 * fp8_weights / bw[0], rel=1e-9)
