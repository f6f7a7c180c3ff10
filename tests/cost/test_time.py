"""Time model: FLOPs, collectives, pipeline makespan and throughput identities."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import comm
from autopar.cost import flops as F
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.strategy import Strategy
from conftest import link_bandwidths, make_problem, toy_model


def test_model_flops_match_the_narayanan_formula():
    # Narayanan et al. SC'21 eq. 3 without recompute (3 passes instead of 4):
    # 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) per step for GPT with a 4h MLP and MHA. Their attention
    # term counts the full s x s matrix; ours halves it for the causal mask, so compare with s/(12h).
    model = toy_model(num_layers=96, hidden_size=12288, num_attention_heads=96, num_kv_heads=96, head_dim=128,
                      ffn_hidden_size=4 * 12288, vocab_size=51200, norm="layernorm")
    p = make_problem(model, gbs=8, seq=2048)
    l, h, s, v = 96, 12288, 2048, 51200
    expected = 72 * s * l * h**2 * (1 + s / (12 * h) + v / (12 * l * h)) / s
    assert F.model_flops_per_token(p) == pytest.approx(expected, rel=1e-9)


def test_gemm_shapes_are_sharded():
    p = make_problem("llama3-70b", gbs=8, seq=4096)
    batch = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, cp=1), 8)
    qkv, out = F.attention_gemms(p, batch)
    assert (qkv.m[0], qkv.n[0], qkv.k) == (4096, (8192 + 2 * 1024) / 8, 8192)
    assert (out.n, out.k[0]) == (8192, 8192 / 8)
    up, down = F.mlp_gemms(p, batch, moe=False)
    assert up.n[0] == 2 * 28672 / 8 and down.k[0] == 28672 / 8


def test_ring_collectives_closed_forms():
    p = make_problem("llama3-8b", nodes=2, gbs=8, seq=4096)
    dev = p.cluster.device
    intra, nic = link_bandwidths(p)
    size = 1e9
    ar = comm.all_reduce_s(p, size, 8, 1)
    assert ar == pytest.approx(2 * 7 / 8 * size / intra + 14 * dev.intra_node_latency_s)
    # A group of 2 with stride 8 spans both nodes with one member each: one NIC.
    ag = comm.all_gather_s(p, size, 2, 8)
    assert ag == pytest.approx(0.5 * size / nic + dev.inter_node_latency_s)
    # 16 ranks with stride 1: 8 members per node drive 8 NICs.
    assert comm.all_gather_s(p, size, 16, 1) == pytest.approx(15 / 16 * size / min(intra, 8 * nic)
                                                               + 15 * dev.inter_node_latency_s)
    assert comm.all_reduce_s(p, size, 1, 1) == 0.0


def test_throughput_identity_and_breakdown_sum():
    p = make_problem("llama3-8b", nodes=2, gbs=64, seq=8192)
    e = estimate(p, Strategy(dp=2, tp=2, pp=4, sp=True, recompute="selective"))
    assert e.tokens_per_s_per_device * e.step_time_s * 16 == pytest.approx(64 * 8192)
    assert sum(e.time_breakdown_s.values()) == pytest.approx(e.step_time_s)


def test_uniform_1f1b_bubble_is_pp_minus_one_stage_times():
    # Uniform stages (tiny embedding and head): bubble = (pp - 1) * t_stage, so bubble/compute-part
    # = (pp - 1)/M at zero communication.
    model = toy_model(num_layers=8, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, head_dim=128,
                      ffn_hidden_size=16384, vocab_size=128)
    p = make_problem(model, per_node=4, gbs=16, seq=2048)
    e = estimate(p, Strategy(dp=1, pp=4))
    t = e.time_breakdown_s
    m = e.num_microbatches
    assert t["pp_bubble"] / (t["compute"] + t["tp_comm"]) == pytest.approx(3 / m, rel=0.02)


def test_interleaving_shrinks_the_bubble_by_vpp():
    # Narayanan et al. SC'21 sec. 2.2.2: the interleaved bubble is (pp-1)/vpp stage times.
    model = toy_model(num_layers=16, hidden_size=4096, num_attention_heads=32, num_kv_heads=32, head_dim=128,
                      ffn_hidden_size=16384, vocab_size=128)
    p = make_problem(model, per_node=8, gbs=64, seq=4096)
    plain = estimate(p, Strategy(dp=2, pp=4))
    inter = estimate(p, Strategy(dp=2, pp=4, vpp=4, schedule="interleaved"))
    assert inter.time_breakdown_s["pp_bubble"] == pytest.approx(plain.time_breakdown_s["pp_bubble"] / 4, rel=0.05)


def test_recompute_costs_time_and_saves_memory():
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    runs = {r: estimate(p, Strategy(dp=4, tp=2, sp=True, recompute=r)) for r in ("none", "selective", "full")}
    assert runs["none"].step_time_s < runs["selective"].step_time_s < runs["full"].step_time_s
    peaks = [runs[r].peak_memory_bytes for r in ("none", "selective", "full")]
    assert peaks[0] > peaks[1] > peaks[2]
    # Full recompute adds one forward: compute grows by about a third (fwd + 2 fwd + 1 fwd).
    ratio = runs["full"].time_breakdown_s["compute"] / runs["none"].time_breakdown_s["compute"]
    assert ratio == pytest.approx(4 / 3, rel=0.03)


def test_cross_node_tp_is_slower_than_in_node_tp():
    p = make_problem("llama2-7b", nodes=2, gbs=32, seq=4096)
    inside = estimate(p, Strategy(dp=2, tp=8, sp=True))
    across = estimate(p, Strategy(dp=1, tp=16, sp=True))
    per_mb_inside = inside.time_breakdown_s["tp_comm"] / inside.num_microbatches
    per_mb_across = across.time_breakdown_s["tp_comm"] / across.num_microbatches
    assert per_mb_across > per_mb_inside


def test_mfu_is_model_flops_over_peak():
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    e = estimate(p, Strategy(dp=8))
    flops = F.model_flops_per_token(p) * 64 * 4096
    assert e.mfu == pytest.approx(flops / (e.step_time_s * 8 * 989.4e12))
    assert 0 < e.mfu < p.cluster.device.gemm_efficiency


def test_hopper_attention_runs_at_the_flashattention2_rate():
    # FlashAttention-2 (Dao 2023) reaches ~335 TFLOP/s fwd+bwd on H100 counting backward as 2.5x
    # forward: 335 * 3/3.5 = 287 TFLOP/s on autopar's 3x-forward count, 0.28 of 989.4 TFLOP/s.
    from autopar.cost import compute as C
    p = make_problem("llama2-7b", seq=65536)
    flops = np.array([1e15])
    assert C.attention_time_s(p, flops)[0] == pytest.approx(1e15 / (989.4e12 * 0.28) + C.KERNEL_OVERHEAD_S)
    capped = make_problem("llama2-7b", device="h100-96gb-500w", seq=65536)
    assert capped.cluster.device.attention_efficiency == pytest.approx(0.765 * 0.28, abs=0.005)  # sustained clock


def test_torchtitan_selective_recompute_is_the_even_matmuls():
    # torchtitan per-op SAC recomputes wk, wo, w3 of Llama-3-8B: 4096 x (1024 + 4096 + 14336) MACs
    # per token, plus the element-wise ops; Megatron's selective recompute is the core attention.
    from autopar.cost import compute as C
    from autopar.cost.recompute import layer_recompute_s
    p = make_problem("llama3-8b", seq=8192, framework="torchtitan")
    batch = LayoutBatch.from_strategy(Strategy(dp=8, tp=1, cp=1, mbs=1, zero=3, recompute="selective"), 64)
    dense = C.layer_forward_times(p, batch, moe=False)
    flops = 2 * 8192 * 4096 * (1024 + 4096 + 14336)
    gemm_s = flops / (989.4e12 * 0.64) + 3 * C.KERNEL_OVERHEAD_S
    assert layer_recompute_s(p, batch, dense, moe=False)[0] == pytest.approx(gemm_s + dense.elementwise_s[0], rel=1e-6)
    megatron = make_problem("llama3-8b", seq=8192)
    assert layer_recompute_s(megatron, batch, dense, moe=False)[0] == dense.attention_s[0]


def test_deepspeed_fp16_reduces_16_bit_gradients():
    from autopar.cost.stage_time import grad_comm_bytes
    assert grad_comm_bytes(make_problem("llama3-8b", precision="fp16", framework="deepspeed")) == 2
    assert grad_comm_bytes(make_problem("llama3-8b", precision="bf16", framework="deepspeed")) == 4
    assert grad_comm_bytes(make_problem("llama3-8b", precision="fp16")) == 4  # Megatron fp32 main grads


def test_zero3_leaves_one_layer_of_gather_and_reduce_scatter_exposed():
    # Llama-3-8B on one node, FSDP over 8 ranks, compute >> comm: only the first layer's gather
    # (bf16) and the last layer's reduce-scatter (fp32) per micro-batch stay exposed.
    from autopar.cost.params import stage_params
    from autopar.cost.stage import Stages
    from autopar.cost.stage_time import dp_exposed_s, stage_time
    p = make_problem("llama3-8b", seq=8192, gbs=16)
    batch = LayoutBatch.from_strategy(Strategy(dp=8, tp=1, cp=1, mbs=2, zero=3, recompute="none"), 16)
    stages = Stages(index=np.array([0]), start=np.array([0]), layers=np.array([32]))
    params = stage_params(p, batch, stages)
    dev = p.cluster.device
    bw = dev.intra_node_bandwidth_bytes_per_s * dev.intra_node_comm_efficiency
    ag = 7 / 8 * params.dense[0] * 2 / bw + 7 * dev.intra_node_latency_s
    rs = 7 / 8 * params.dense[0] * 4 / bw + 7 * dev.intra_node_latency_s
    exposed = dp_exposed_s(p, batch, params, stage_time(p, batch, stages), np.zeros(1))
    assert exposed[0] == pytest.approx((ag + rs) / 32, rel=1e-6)


def test_pipeline_send_is_one_tp_slice_plus_an_nvlink_gather():
    # Narayanan et al. SC'21 sec. 4.1 scatter/gather: each of the 8 tp ranks sends 1/8 of the
    # 2*s*h activation over its NIC (pp crosses nodes), the receiver all-gathers it over NVLink.
    from autopar.cost.stage_time import p2p_time_s
    p = make_problem("llama3-70b", nodes=2, gbs=8, seq=4096)
    dev = p.cluster.device
    intra, nic = link_bandwidths(p)
    slice_bytes = 2 * 4096 * 8192 / 8
    no_sp = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, pp=2, sp=False), 8)
    send = slice_bytes / nic + dev.inter_node_latency_s
    gather = 7 / 8 * 8 * slice_bytes / intra + 7 * dev.intra_node_latency_s
    assert p2p_time_s(p, no_sp)[0] == pytest.approx(send + gather)
    with_sp = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, pp=2, sp=True), 8)
    assert p2p_time_s(p, with_sp)[0] == pytest.approx(send)  # already sequence-sharded


def test_tied_embedding_gradients_are_all_reduced_once_per_step_between_first_and_last_stage():
    # BLOOM-like 250880-token vocabulary tied to h=14336 under DeepSpeed fp16 (2-byte grads), tp4 pp2
    # on 2 nodes: each tp rank all-reduces its 62720 x 14336 shard with its peer on the other node
    # (a 2-rank ring moves the whole shard once: 2*(2-1)/2 = 1) -- DeepSpeed ReduceTiedGrads.
    from autopar.cost.stage_time import tied_embedding_grad_s
    bloom = toy_model(num_layers=4, hidden_size=14336, num_attention_heads=64, num_kv_heads=64, head_dim=224,
                      ffn_hidden_size=57344, vocab_size=250880, tie_word_embeddings=True)
    p = make_problem(bloom, nodes=2, gbs=8, seq=2048, precision="fp16", framework="deepspeed")
    dev = p.cluster.device
    _, nic = link_bandwidths(p)
    shard_bytes = 2 * 250880 / 4 * 14336
    batch = LayoutBatch.from_strategy(Strategy(dp=2, tp=4, pp=2), 8)
    assert tied_embedding_grad_s(p, batch)[0] == pytest.approx(shard_bytes / nic + 2 * dev.inter_node_latency_s)
    assert tied_embedding_grad_s(p, LayoutBatch.from_strategy(Strategy(dp=4, tp=4, pp=1), 8))[0] == 0.0
    untied = make_problem(bloom.model_copy(update={"tie_word_embeddings": False}), nodes=2, gbs=8, seq=2048)
    assert tied_embedding_grad_s(untied, batch)[0] == 0.0
    # It is part of pp_comm, and so of the step time.
    untied_fp16 = make_problem(bloom.model_copy(update={"tie_word_embeddings": False}), nodes=2, gbs=8,
                               seq=2048, precision="fp16", framework="deepspeed")
    for split in (None, (3, 1)):  # closed-form 1F1B and the simulated pipeline of uneven stages
        s = Strategy(dp=2, tp=4, pp=2, mbs=1, layers_per_stage=split)
        extra = estimate(p, s).time_breakdown_s["pp_comm"] - estimate(untied_fp16, s).time_breakdown_s["pp_comm"]
        assert extra == pytest.approx(tied_embedding_grad_s(p, batch)[0])


def test_launch_blocking_adds_host_time_per_layer_pass():
    # One device (pp=1, dp=1, no DP traffic), 4 micro-batches of a 32-layer model. With synchronous
    # launches each layer pays the host time once per forward, once per recomputed forward and
    # twice per backward: 4 micro-batches * 32 layers * (1 + 1 + 2) * 2.6 ms = 1.3312 s more per
    # step with full recompute, 4 * 32 * 3 * 2.6 ms = 0.9984 s without.
    from autopar.cost.framework import LAUNCH_BLOCKING_HOST_S_PER_LAYER_PASS as host_s
    assert host_s == 2.6e-3

    def step(blocking: bool, recompute: str) -> float:
        p = make_problem("llama3-8b", per_node=1, gbs=4, seq=4096, overlap_grad_reduce=False,
                         launch_blocking=blocking)
        return float(estimate(p, Strategy(dp=1, tp=1, pp=1, mbs=1, recompute=recompute)).step_time_s)

    assert step(True, "full") - step(False, "full") == pytest.approx(4 * 32 * 4 * 2.6e-3, rel=1e-9)
    assert step(True, "none") - step(False, "none") == pytest.approx(4 * 32 * 3 * 2.6e-3, rel=1e-9)


def test_backward_tp_collectives_hide_behind_their_gemms():
    # Megatron's async TP all-reduce (autopar.cost.tp_overlap), tp 8 in one H100 node: one
    # all-reduce of the activation = 1 ms, its latency 2*7 steps of alpha (an AG/RS: half of each).
    # QKV's weight-gradient GEMM 0.4 ms (shorter than the collective), FC1's 5 ms (longer).
    from autopar.cost import tp_overlap
    p = make_problem("llama3-8b", gbs=8, seq=4096)
    alpha = p.cluster.device.intra_node_latency_s
    one, gemms = np.array([1e-3]), [np.array([0.4e-3]), np.array([5e-3])]
    no_sp = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, sp=False), 8)
    # no SP: (1 - 0.4) ms + one latency (14 alpha) for the FC1 all-reduce hidden by its 5 ms GEMM
    assert tp_overlap.layer_backward_tp_s(p, no_sp, one, gemms)[0] == pytest.approx(0.6e-3 + 14 * alpha)
    # SP, per linear: the dY all-gather (0.5 ms) exposed, the dX reduce-scatter under dW and the input
    # re-gather under dX: QKV 0.5 + 2 * (0.5 - 0.4) ms, FC1 0.5 ms + 2 * 7 alpha
    sp = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, sp=True), 8)
    assert tp_overlap.layer_backward_tp_s(p, sp, one, gemms)[0] == pytest.approx(0.7e-3 + 0.5e-3 + 14 * alpha)
    # no GEMM to hide behind (MoE MLP, MLA attention): the whole collective, as with the flag off
    assert tp_overlap.layer_backward_tp_s(p, no_sp, one, [None, None])[0] == pytest.approx(2e-3)
    off = make_problem("llama3-8b", gbs=8, seq=4096, tp_backward_overlap=False)
    assert tp_overlap.layer_backward_tp_s(off, sp, one, gemms)[0] == pytest.approx(2e-3)


def test_tp_backward_overlap_off_reproduces_four_exposed_collectives_per_layer():
    # Flag off: (4 per layer + embedding + output) all-reduces of the 2*s*h activation per micro-batch,
    # the model before the async TP all-reduce; on (the default, as `autopar search` plans): less.
    from autopar.cost.stage import Stages
    from autopar.cost.stage_time import stage_time
    from autopar.specs import TrainSpec
    assert TrainSpec(global_batch_size=8, seq_len=4096).tp_backward_overlap is True
    batch = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, sp=False), 8)
    stages = Stages(index=np.array([0]), start=np.array([0]), layers=np.array([32]))
    ar = comm.all_reduce_s(make_problem("llama3-8b"), 2 * 4096 * 4096, 8, 1)
    off = make_problem("llama3-8b", gbs=8, seq=4096, tp_backward_overlap=False)
    assert stage_time(off, batch, stages).tp_s[0] == pytest.approx(130 * ar)
    on = stage_time(make_problem("llama3-8b", gbs=8, seq=4096), batch, stages).tp_s[0]
    assert 66 * ar < on < 130 * ar


def test_validate_families_set_the_tp_backward_overlap_by_code_date():
    # Async TP all-reduce: Megatron-LM from 2021-09 (Korthikanti 2022, NeMo); not the 2020/SC'21 code,
    # DeepSpeed's Megatron fork or torchtitan's synchronous DTensor collectives.
    from autopar.validate.rows import FAMILIES, Row, tp_backward_overlap_of
    row = Row({"zero_or_distopt": ""})
    on = {name for name, f in FAMILIES.items() if tp_backward_overlap_of(row, f)}
    assert on == {"megatron-2022", "megatron-2024", "nemo", "megatron-bridge"}
    assert all(f.tp_backward_why for f in FAMILIES.values())
    assert not tp_backward_overlap_of(Row({"zero_or_distopt": "DeepSpeed ZeRO-3"}), FAMILIES["megatron-2022"])
