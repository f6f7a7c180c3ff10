"""Host (CPU) launch bound of eager training (autopar.cost.host) and the DeepSeek-V3 GB200 row mapping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from autopar.cost import host
from autopar.cost.stage import all_stages
from autopar.cost.stage_time import stage_time
from autopar.layout_batch import LayoutBatch
from autopar.specs import load_device
from autopar.strategy import Strategy
from autopar.validate import DEFAULT_CSV
from autopar.validate.measurements import read_rows
from autopar.validate.rows import to_case
from conftest import MODELS, make_problem, toy_model

MIXTRAL = str(MODELS / "mixtral-8x7b.json")


def _batch(p, s):
    return LayoutBatch.from_strategy(s, p.train.global_batch_size)


def test_op_counts_by_hand_mixtral_tp1():
    # Mixtral: GQA attention, softmax top-2 router, no shared experts; ep=8 -> 1 local expert.
    p = make_problem(MIXTRAL, gbs=64)
    b = _batch(p, Strategy(dp=8, ep=8, zero=1))
    assert host.layer_forward_ops(p, b, False)[0] == 8 + 5  # attention + dense MLP, no TP collectives
    # MoE: attention 8, norm + residual 2, router 24, dispatch 12, experts 2 splits + 2 grouped
    # GEMM calls + act.
    assert host.layer_forward_ops(p, b, True)[0] == 8 + 2 + 24 + 12 + 5
    # Backward: one node per forward op plus a weight-gradient GEMM per forward GEMM (QKV, out,
    # router, fc1, fc2).
    assert host.layer_backward_ops(p, b, True)[0] == 51 + 5


def test_op_counts_by_hand_deepseek_v3_tp2_ep32():
    # MLA (+11), TP collectives 2 per block, DeepSeek router 72 (Megatron-LM GB200 guide 2.1.4),
    # grouped experts: 2 splits + 2 GroupedLinear calls + activation (the 8 local experts' GEMMs
    # come from one C++ call each), shared expert fc1/act/fc2/add + 2 collectives.
    p = make_problem("deepseek-v3", nodes=16, gbs=1024)
    b = _batch(p, Strategy(dp=64, tp=2, ep=32, etp=1, sp=True, zero=1))
    attention = 8 + 11 + 2
    moe = 2 + 72 + 12 + (2 + 2 + 1) + (3 + 1 + 2)
    assert host.layer_forward_ops(p, b, True)[0] == attention + moe == 118
    gemms = 5 + 1 + 2 + 2  # MLA q/kv down/up + out, router, 2 grouped calls, shared fc1/fc2
    assert host.layer_backward_ops(p, b, True)[0] == 118 + gemms


def test_host_ops_do_not_grow_with_local_experts():
    # dgxc DeepSeek-V3 GB200: 34.17 s per step at ep 32 (8 local experts), 34.19 s at ep 64 (4):
    # the per-expert GEMMs are launched from C++ inside one GroupedLinear call.
    p = make_problem("deepseek-v3", nodes=32, gbs=1024)
    ep32 = _batch(p, Strategy(dp=128, tp=2, ep=32, etp=1, sp=True, zero=1))
    ep64 = _batch(p, Strategy(dp=128, tp=2, ep=64, etp=1, sp=True, zero=1))
    for ops in (host.layer_forward_ops, host.layer_backward_ops):
        assert ops(p, ep32, True)[0] == ops(p, ep64, True)[0]


def test_megatron_pays_transformer_engine_host_cost_per_op():
    # TransformerEngine #2053 on GB200: te.Linear forward 99.66 us of CPU, torch.nn.Linear 37.08 us.
    p = make_problem("llama3-8b", device="gb200", nodes=1, per_node=4, gbs=8)
    assert host.host_op_s(p) == pytest.approx(37.1e-6 * 99.66 / 37.08)
    titan = dataclasses.replace(p, train=p.train.model_copy(update={"framework": "torchtitan"}))
    assert host.host_op_s(titan) == pytest.approx(37.1e-6)


def test_grace_host_costs_more_per_op_than_x86():
    # TransformerEngine #2053: torch.nn.Linear forward CPU time 37.08 us (GB200) vs 13.48 us (DGX H100).
    assert load_device("gb200").host_op_s == pytest.approx(37.1e-6)
    assert load_device("h100-80gb").host_op_s == pytest.approx(13.5e-6)


def test_tiny_layers_are_host_bound_and_take_the_host_time():
    # A toy model's kernels take microseconds: a micro-batch lasts as long as the host needs to
    # launch its ops (forward + backward), not the GPU time.
    p = make_problem(toy_model(), device="gb200", nodes=1, per_node=1, gbs=1, seq=8)
    s = Strategy(dp=1, zero=1)
    batch, stages = all_stages(p, s)
    t = stage_time(p, batch, stages)
    ops = 4 * (host.layer_forward_ops(p, batch, False) + host.layer_backward_ops(p, batch, False))
    assert ops[0] == 4 * (13 + 13 + 4)  # 4 layers; backward adds QKV, out, fc1, fc2 weight GEMMs
    # Megatron (the default framework) issues them through Transformer Engine: 99.66 / 37.08 x.
    assert t.total_s[0] == pytest.approx(ops[0] * 37.1e-6 * 99.66 / 37.08, rel=1e-9)
    # Without host cost the same stage is far faster: the bound is what sets the time.
    free = dataclasses.replace(p, cluster=p.cluster.model_copy(
        update={"device": p.cluster.device.model_copy(update={"host_op_s": 0.0})}))
    assert stage_time(free, batch, stages).total_s[0] < 0.2 * t.total_s[0]


def test_large_layers_are_not_host_bound():
    # Llama-3-70B on H100 at 8k tokens: GPU milliseconds per layer dwarf 0.4 ms of launches.
    p = make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192)
    s = Strategy(dp=8, tp=8, pp=1, zero=1, sp=True)
    batch, stages = all_stages(p, s)
    free = dataclasses.replace(p, cluster=p.cluster.model_copy(
        update={"device": p.cluster.device.model_copy(update={"host_op_s": 0.0})}))
    assert stage_time(p, batch, stages).total_s[0] == stage_time(free, batch, stages).total_s[0]


def _case(row_id):
    return to_case(next(r for r in read_rows(DEFAULT_CSV) if r.id == row_id))


def test_deepseek_v3_gb200_rows_run_unfused_attention_with_core_attention_recompute():
    # dgxc-benchmarking launch.sh: GB200 --recompute_modules core_attn; no MLA fused attention on
    # Blackwell before cuDNN 9.11. The H100 runs: --recompute_modules mla_up_proj, fused attention.
    gb200 = _case("DGXC2505-DSV3-GB200-BF16-128")
    assert gb200.strategy.recompute == "selective" and not gb200.problem.train.flash_attention
    assert gb200.strategy.recompute_modules == ("core_attn",)
    h100 = _case("DGXC2505-DSV3-H100-BF16-512")
    assert h100.strategy.recompute == "selective" and h100.problem.train.flash_attention
    assert h100.strategy.recompute_modules == ("mla_up_proj",)
    grok = _case("DGXC2505-GROK1-GB200-BF16-128")
    assert grok.strategy.recompute == "none" and grok.problem.train.flash_attention


def test_unfused_attention_issues_its_kernels_from_the_host():
    # dgxc DeepSeek-V3 GB200 runs unfused attention with core_attn recompute: baddbmm, softmax,
    # bmm (no dropout in DeepSeek-V3) instead of one fused kernel: 2 more ops forward, and the
    # recompute reruns all 3 per layer.
    case = _case("DGXC2505-DSV3-GB200-BF16-128")
    p, batch = case.problem, _batch(case.problem, case.strategy)
    assert host.core_attention_ops(p) == 3
    assert host.layer_forward_ops(p, batch, True)[0] == 118 + 2
    layers, op_s = 16, 37.1e-6 * 99.66 / 37.08
    fwd, rest = host.stage_host_s(p, batch, np.array([0]), np.array([layers]), np.array([0]))
    assert fwd[0] == pytest.approx(layers * 120 * op_s)
    assert rest[0] == pytest.approx(layers * (120 + 10 + 3) * op_s)  # + 10 weight GEMMs + recompute
