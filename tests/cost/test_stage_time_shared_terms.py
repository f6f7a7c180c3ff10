"""Terms stage_time costs once and hands on (autopar.cost.stage_time): the MoE MLP's per-GEMM
seconds (LayerTimes.mlp_gemm_s) for the expert-compute overlap, one pass_comm_s for the exposed,
recomputed and MTP EP terms, the output and embedding forward times for the MTP block. Each
handed-on value gives bit for bit what the callee costs on its own, on DeepSeek-V3 layouts (MoE
with shared experts, MLA, one MTP layer) and Qwen3-30B-A3B ones (MoE without shared experts)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost import compute as C
from autopar.cost import moe as moe_cost
from autopar.cost import moe_dispatch, mtp
from autopar.search.grid import for_search
from autopar.search.valid_space import valid_layouts


@lru_cache(maxsize=None)
def _rows(model: str):
    p, options = for_search(make_problem(model, nodes=4, gbs=1024, seq=4096), "megatron", None)
    valid = valid_layouts(p, options, []).valid
    return p, valid.take(np.linspace(0, len(valid) - 1, 200).round().astype(np.int64))


@pytest.mark.parametrize("model", ["deepseek-v3", "qwen3-30b-a3b"])
def test_handed_on_moe_gemm_seconds_equal_the_expert_compute_costed_alone(model):
    p, batch = _rows(model)
    layer = C.layer_forward_times(p, batch, moe=True)
    assert layer.mlp_gemm_s is not None and len(layer.mlp_gemm_s) >= 3
    for got, alone in zip(moe_dispatch.expert_compute_s(p, batch, layer.mlp_gemm_s),
                          moe_dispatch.expert_compute_s(p, batch)):
        assert np.array_equal(np.broadcast_to(got, (len(batch),)), np.broadcast_to(alone, (len(batch),)))


def test_handed_on_pass_and_forward_seconds_equal_the_mtp_terms_costed_alone():
    p, batch = _rows("deepseek-v3")
    dense, moe = C.layer_forward_times(p, batch, moe=False), C.layer_forward_times(p, batch, moe=True)
    handed = mtp.forward_s(p, batch, dense.forward_s, moe.forward_s, C.output_forward_time_s(p, batch),
                           C.embedding_forward_time_s(p, batch))
    assert np.array_equal(handed, mtp.forward_s(p, batch, dense.forward_s, moe.forward_s))
    layer_comm = 2 * moe_dispatch.pass_comm_s(p, batch)
    assert np.array_equal(layer_comm, moe_cost.layer_comm_s(p, batch))
    assert np.array_equal(mtp.ep_comm_s(p, batch, layer_comm), mtp.ep_comm_s(p, batch))
    assert np.any(mtp.ep_comm_s(p, batch) > 0)  # ep > 1 rows (ep = 1 ones exchange nothing)
    one_pass = moe_dispatch.pass_comm_s(p, batch)
    shared_s, routed_s = moe_dispatch.expert_compute_s(p, batch)
    assert np.array_equal(moe_dispatch.exposed_layer_comm_s(p, batch, moe.forward_s, shared_s, routed_s, one_pass),
                          moe_dispatch.exposed_layer_comm_s(p, batch, moe.forward_s, shared_s, routed_s))
