"""Activation CPU offloading (``TrainSpec.activation_offload_layers``,
:mod:`autopar.cost.activation_offload`): memory saved, host-link time charged beyond the layers
it hides under, Megatron-Core's rules, the exports."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from autopar.cost import activation_offload, memory
from autopar.cost.stage import all_stages
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron_bridge import overrides
from autopar.problem import Problem
from autopar.rules import check_strategy
from autopar.specs.train import TrainSpec
from autopar.strategy import Strategy
from conftest import make_problem

GIB = 2**30
S = Strategy(dp=4)


def _problem(n: int, device: str = "gb200"):
    return make_problem("llama3-8b", device=device, per_node=4, seq=8192, gbs=64, activation_offload_layers=n)


def test_offloading_n_layers_frees_n_minus_one_layers_of_activations():
    p = _problem(8)
    batch, stages = all_stages(p, S)
    layer = memory.stored_layer_bytes(p, batch, stages)[0] / 32
    freed = estimate(_problem(0), S).peak_memory_bytes - estimate(p, S).peak_memory_bytes
    assert freed == pytest.approx(7 * layer)  # the double buffer keeps one offloaded layer on the device
    assert estimate(_problem(1), S).peak_memory_bytes == estimate(_problem(0), S).peak_memory_bytes
    assert activation_offload.offloaded_layers(p, np.array([32, 4]))[1] == 3  # the last layer stays


def test_copies_beyond_the_layer_they_hide_under_are_exposed():
    # 1 GiB per layer over 64 GB/s = 16.78 ms each way, under a 10 ms forward and a 20 ms backward.
    p = make_problem("llama3-8b", device="h100-80gb", activation_offload_layers=8)  # PCIe Gen5: 64 GB/s
    assert p.cluster.device.host_bandwidth_bytes_per_s == 64e9
    exposed = activation_offload.exposed_s(p, np.array([32]), np.array([GIB]), np.array([10e-3]), np.array([20e-3]))
    assert exposed[0] == pytest.approx(8 * (GIB / 64e9 - 10e-3))
    # On GB200's NVLink-C2C the copies hide under Llama-3-8B's layers: the step time is unchanged.
    assert estimate(_problem(8), S).step_time_s == estimate(_problem(0), S).step_time_s


def test_a_device_without_a_host_link_number_is_refused():
    p = make_problem("llama3-8b", activation_offload_layers=8)
    device = p.cluster.device.model_copy(update={"host_bandwidth_bytes_per_s": None})
    p = Problem(p.model, p.cluster.model_copy(update={"device": device}), p.train)
    with pytest.raises(AutoparError, match="--activation-offload-layers=8: device h100-80gb has no host link"):
        estimate(p, Strategy(dp=8))


def test_megatron_core_rules():
    p = _problem(8)
    with pytest.raises(LayoutError, match="activation_offload_pp1_no_recompute|pp 1 and no recompute"):
        check_strategy(p, Strategy(dp=2, pp=2))
    with pytest.raises(LayoutError, match="activation_offload_pp1_no_recompute|pp 1 and no recompute"):
        check_strategy(p, Strategy(dp=4, recompute="selective"))
    with pytest.raises(ValidationError, match="activation offloading is Megatron-Core's"):
        TrainSpec(global_batch_size=8, seq_len=128, activation_offload_layers=2, framework="torchtitan")


def test_exports_write_megatron_bridge_fields_or_refuse():
    p = _problem(8)
    ov = overrides(p, S)
    assert (ov["model.cpu_offloading"], ov["model.cpu_offloading_num_layers"]) == (True, 8)
    script = WRITERS["megatron"](p, S)  # Megatron-LM main's flag, with a comment on the version it needs
    assert "--cpu-offloading-num-layers 8" in script and "needs Megatron-LM main" in script
    with pytest.raises(AutoparError, match="MindSpeed-LLM has no --cpu-offloading-num-layers"):
        WRITERS["mindspeed"](p, S)
    with pytest.raises(AutoparError, match="export --format torchtitan: activation CPU offloading"):
        WRITERS["torchtitan"](p, Strategy(dp=4, zero=3))
