"""Framework-specific behaviour (TrainSpec.framework): hand-derived numbers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.cost import framework
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from autopar.validate.rows import FAMILIES, Row, framework_of
from conftest import make_problem, toy_model

ZERO3 = Strategy(dp=16, tp=1, pp=1, mbs=1, zero=3, recompute="full")


def _problem(fw: str):
    # 2 nodes x 8 A100: the 16-rank DP group crosses nodes, 20 us per ring step (DeviceSpec default).
    return make_problem(toy_model(), device="a100-80gb", nodes=2, gbs=32, seq=64, framework=fw)


def test_deepspeed_zero3_latency_by_hand():
    p = _problem("deepspeed")
    batch = LayoutBatch.from_strategy(ZERO3, p.train.global_batch_size)
    # 4 layers, full recompute: 2 passes x (6*4 + 3) gathers + 6*4 recomputed gathers = 78,
    # one reduce-scatter bucket (toy model << 5e8 elements): 79 collectives x 15 steps x 20 us.
    got = framework.zero3_latency_s(p, batch, 4, np.array([4]), np.array([1e4]), 20e-6)
    assert got[0] == pytest.approx(79 * 15 * 20e-6)
    assert framework.zero3_latency_s(_problem("megatron"), batch, 4, np.array([4]), np.array([1e4]), 20e-6)[0] == 0


def _no_host(p):
    # The toy model is host-bound, and Megatron pays Transformer Engine's host cost per op
    # (autopar.cost.host): without host time the frameworks differ only in the ZeRO-3 latency.
    device = p.cluster.device.model_copy(update={"host_op_s": 0.0})
    return dataclasses.replace(p, cluster=p.cluster.model_copy(update={"device": device}))


def test_deepspeed_zero3_step_pays_the_latency_per_microbatch():
    ds, mg = estimate(_no_host(_problem("deepspeed")), ZERO3), estimate(_no_host(_problem("megatron")), ZERO3)
    assert ds.num_microbatches == 2
    extra = ds.time_breakdown_s["dp_comm"] - mg.time_breakdown_s["dp_comm"]
    assert extra == pytest.approx(2 * 79 * 15 * 20e-6)
    assert ds.step_time_s == pytest.approx(mg.step_time_s + extra)


def test_rows_run_on_deepspeed_when_the_row_says_so():
    sc21 = FAMILIES["megatron-2021"]
    assert framework_of(Row({"zero_or_distopt": "ZeRO-3 (DeepSpeed)"}), sc21) == "deepspeed"
    assert framework_of(Row({"zero_or_distopt": ""}), sc21) == "megatron"
    assert framework_of(Row({"zero_or_distopt": "ZeRO-1"}), FAMILIES["megatron-deepspeed"]) == "deepspeed"
