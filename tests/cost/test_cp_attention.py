"""Attention kernel efficiency by block length and the per-step costs of ring context parallelism."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import attention as A
from autopar.cost import comm
from autopar.cost import compute as C
from autopar.cost.stage import Stages
from autopar.cost.stage_time import stage_time
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.specs import TrainSpec, load_device, make_cluster
from autopar.strategy import Strategy
from conftest import make_problem


def _batch(**layout) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**layout), 64)


def test_causal_kernel_efficiency_follows_the_flashattention2_h100_curve():
    # FA3 paper (Shah et al. 2024), H100 forward, head dim 128, causal FA2: 260/298/319/333/335
    # TFLOP/s at 1k/2k/4k/8k/16k. The model's ratio to the 16k point is within 2% of each.
    measured = {1024: 260, 2048: 298, 4096: 319, 8192: 333}
    at_16k = A.kernel_efficiency(16384 / 2, causal=True)
    for seq, tflops in measured.items():
        assert A.kernel_efficiency(seq / 2, causal=True) / at_16k == pytest.approx(tflops / 335, rel=0.02)
    # causal over 4096 tokens: 2048 keys per query row on average -> 2048 / (2048 + 170)
    assert A.kernel_efficiency(2048, causal=True) == pytest.approx(2048 / 2218)


def test_ring_steps_run_at_the_efficiency_of_their_short_blocks():
    # seq 8192, cp 8: every step has 8192 / 16 = 512 keys per query row on the slowest rank;
    # one causal step (512 / 682) and 7 non-causal (512 / 572) of equal work: harmonic mean.
    p = make_problem("llama3-8b", seq=8192)
    eff = A.block_efficiency(p, _batch(dp=1, cp=8))[0]
    assert eff == pytest.approx(8 / (682 / 512 + 7 * 572 / 512))
    assert A.block_efficiency(p, _batch(dp=8, cp=1))[0] == pytest.approx(4096 / 4266)
    unfused = make_problem("llama3-8b", seq=8192, flash_attention=False)
    assert A.block_efficiency(unfused, _batch(dp=1, cp=8))[0] == 1.0


def test_torchtitan_ring_carries_repeated_kv_heads():
    # Llama-3-8B: 8 KV heads x 128; torchtitan repeat_kv's them to the 32 query heads first.
    assert A.ring_kv_width(make_problem("llama3-8b")) == 2 * 1024
    assert A.ring_kv_width(make_problem("llama3-8b", framework="torchtitan")) == 2 * 4096


def test_ring_merge_bytes_by_hand():
    # Megatron/TE, Llama-3-8B, seq 8192, cp 2, tp 1, mbs 1: 4096 tokens per rank.
    # forward: 1 correction x 6 B x 4096 x 4096 outputs; backward: 2 steps x 6 B x (dq 4096 + dkv 2048) x 4096.
    p = make_problem("llama3-8b", seq=8192)
    fwd, bwd = A.ring_merge_bytes(p, _batch(dp=4, cp=2))
    assert fwd[0] == 6 * 4096 * 4096
    assert bwd[0] == 2 * 6 * 4096 * (4096 + 2048)
    # torchtitan: forward 1 x (4 B x 8192 K/V + 38 B x 4096 out) x 4096; backward 2 x (22 x 8192 + 10 x 4096) x 4096
    tt = make_problem("llama3-8b", seq=8192, framework="torchtitan")
    fwd, bwd = A.ring_merge_bytes(tt, _batch(dp=4, cp=2))
    assert fwd[0] == (4 * 8192 + 38 * 4096) * 4096
    assert bwd[0] == 2 * (22 * 8192 + 10 * 4096) * 4096
    assert A.ring_merge_bytes(p, _batch(dp=8, cp=1))[0][0] == 0.0


def test_slow_ring_exposes_each_steps_excess_and_the_last_grad_hand_back():
    # A 1 GB/s NVLink makes every K/V step slower than its attention step: per layer, forward
    # exposes (cp-1) x (kv - attn/cp), backward (cp-1) x (kv + dkv - 2 attn/cp) + one dkv hand-back.
    device = load_device("h100-80gb").model_copy(update={"intra_node_bandwidth_bytes_per_s": 1e9})
    p = Problem(make_problem("llama3-8b").model, make_cluster(device, 1, 8), TrainSpec(global_batch_size=64, seq_len=8192))
    batch, cp = _batch(dp=2, cp=4), 4
    stages = Stages(index=np.array([1]), start=np.array([0]), layers=np.array([1]))
    batch.pp = np.array([3])  # a middle stage of one layer: no embedding or output layer
    kv = float(comm.send_recv_s(p, 2 * (8192 / cp) * 2048, cp, 1))
    attn_step = C.layer_forward_times(p, batch, moe=False).attention_s[0] / cp
    fwd_bytes, bwd_bytes = A.ring_merge_bytes(p, batch)
    expected = ((cp - 1) * (kv - attn_step) + C.memory_time_s(p, fwd_bytes)[0]
                + (cp - 1) * (2 * kv - 2 * attn_step) + kv + C.memory_time_s(p, bwd_bytes)[0])
    assert kv > 2 * attn_step
    assert stage_time(p, batch, stages).cp_s[0] == pytest.approx(expected)


def test_cp_and_micro_batch_swaps_no_longer_tie():
    # cp2 x mbs1 and cp4 x mbs2 hold the same tokens per rank and micro-batch count; cp4 runs shorter
    # attention blocks and twice the ring steps, so it is slower and its CP cost is not zero.
    p = make_problem("llama3-8b", seq=8192, gbs=64)
    cp2 = estimate(p, Strategy(dp=4, cp=2, mbs=1))
    cp4 = estimate(p, Strategy(dp=2, cp=4, mbs=2))
    assert cp2.num_microbatches == cp4.num_microbatches
    assert cp4.step_time_s > cp2.step_time_s
    assert cp4.time_breakdown_s["cp_comm"] > cp2.time_breakdown_s["cp_comm"] > 0


def test_torchtitan_gathers_all_kv_at_step_zero_and_hides_it_only_under_that_step():
    # A 1 GB/s NVLink, Llama-3-8B, seq 8192, cp 4, tp 1: each rank holds 2048 tokens of K/V at the
    # 32 repeated heads (2 x 4096 elements per token), 2 B each -> 33.55 MB per block.
    # PyTorch's _AllGatherRotater: one all-gather of the 4 blocks, 3/4 x 134.2 MB over the ring,
    # waited for after step 0 only; backward gathers again (hidden under 2x step 0) and sends the
    # fp32 dK/dV (67.1 MB) step by step, the last one exposed.
    device = load_device("h100-80gb").model_copy(update={"intra_node_bandwidth_bytes_per_s": 1e9})
    cluster = make_cluster(device, 1, 8)
    train = TrainSpec(global_batch_size=64, seq_len=8192, framework="torchtitan")
    p = Problem(make_problem("llama3-8b").model, cluster, train)
    batch, cp = _batch(dp=2, cp=4), 4
    eff = device.intra_node_comm_efficiency
    block = 2 * 2048 * 2 * 4096
    gather = 3 / 4 * 4 * block / (1e9 * eff) + 3 * device.intra_node_latency_s
    dkv = 2 * block / (1e9 * eff) + device.intra_node_latency_s
    attention = np.array([0.040])  # 10 ms per ring step
    fwd, bwd = A.ring_exposed_s(p, batch, attention)
    assert fwd[0] == pytest.approx(gather - 0.010)
    assert bwd[0] == pytest.approx(gather - 0.020 + (cp - 1) * (dkv - 0.020) + dkv)
    # Megatron/TE on the same links: each block to the neighbour while its step runs.
    te = Problem(p.model, cluster, TrainSpec(global_batch_size=64, seq_len=8192))
    kv = (block / 4) / (1e9 * eff) + device.intra_node_latency_s  # GQA: 8 KV heads, a quarter of the block
    fwd_te, _ = A.ring_exposed_s(te, batch, attention)
    assert kv > 0.010
    assert fwd_te[0] == pytest.approx((cp - 1) * (kv - 0.010))
    assert A.ring_exposed_s(p, _batch(dp=8, cp=1), attention)[0][0] == 0.0
