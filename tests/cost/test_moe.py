"""Mixture of experts, MLA and MTP: shared cases C-01, C-02, C-08 and the EP cost model."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autopar.cost import activations as act
from autopar.cost import comm, moe
from autopar.cost.flops import model_flops_per_token
from autopar.cost.memory import stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import all_stages
from autopar.errors import LayoutError
from autopar.estimate import estimate
from autopar.export.megatron import megatron_args
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.strategy import Strategy
from conftest import MODELS, link_bandwidths, make_problem, toy_model

MIXTRAL = str(MODELS / "mixtral-8x7b.json")
QWEN3_MOE = str(MODELS / "qwen3-30b-a3b.json")


def _toy_moe(**over):
    """C-01: L=4, h=16, 4 heads of 4, FFN 64 (not gated), vocab 32 tied; MoE on layers 0 and 2,
    8 experts of width 32, top-1."""
    fields = dict(tie_word_embeddings=True, num_experts=8, num_experts_per_tok=1, moe_ffn_hidden_size=32,
                  moe_layers=(0, 2))
    fields.update(over)
    return toy_model(**fields)


def test_c01_expert_params_and_model_states_under_ep():
    p = make_problem(_toy_moe(), nodes=4, per_node=8, gbs=16, seq=8, make_vocab_size_divisible_by=1)
    s = Strategy(dp=8, tp=2, cp=2, ep=4, etp=1, mbs=2, sp=True, zero=1)
    batch, stages = all_stages(p, s)
    params = stage_params(p, batch, stages)
    mem = stage_memory(p, batch, stages)
    # Routed experts: 2 layers x 8 experts x 2 x 16 x 32 = 16,384; per device / (EP*ETP) = 4,096.
    assert p.model.num_params - p.model.num_active_params == 16_384 - 2 * 1 * 1024  # top-1 active
    assert params.experts[0] == 4096
    # EDP = 32 / (1*4*1) = 8: 6 + 12/8 = 7.5 B per expert param -> 30,720 B exactly.
    routed = 4096 * (2 + 4) + 4096 * 12 / 8
    assert routed == 30_720
    # Dense: attention 4 x (16x48 + 16x16)/2 = 2,048; dense MLPs 2 x 2x16x64/2 = 2,048; norms
    # 8 x 16 + final 16 = 144; router 2 x 8 x 16 = 256 (replicated); embedding 32x16/2 = 256.
    # The case text's 4,496 leaves out the 256 router (or embedding) params; both exist in
    # Megatron-Core (TopKRouter.weight is a replicated parameter).
    assert params.dense[0] == 2048 + 2048 + 144 + 256 + 256
    dense = params.dense[0] * (6 + 12 / 16)  # DP*CP = 16 -> 6.75 B per param
    states = mem.weights_bytes[0] + mem.grads_bytes[0] + mem.optimizer_bytes[0]
    assert states == pytest.approx(routed + dense, rel=1e-12)
    assert states == pytest.approx(61_068 + 256 * 6.75, rel=1e-12)
    assert states < 70_000  # dividing everything by TP only gives about 95 KB


def _mixtral(ep, tp=1, **train):
    p = make_problem(MIXTRAL, gbs=64, seq=4096, **train)
    s = Strategy(dp=8 // tp, tp=tp, ep=ep, etp=tp, sp=tp > 1, zero=1)
    return p, s, LayoutBatch.from_strategy(s, p.train.global_batch_size)


def test_c02_moe_activations_do_not_shrink_with_ep():
    acts = []
    for ep in (1, 2, 4, 8):
        p, s, _ = _mixtral(ep)
        acts.append(estimate(p, s).memory_per_stage[0].activations_bytes)
        weights = estimate(p, s).memory_per_stage[0].weights_bytes
        if ep > 1:
            assert weights < previous_weights  # only weights and optimizer state change with EP
        previous_weights = weights
    assert max(acts) == pytest.approx(min(acts), rel=0.01)


def test_c02_routed_expert_term_is_topk_dense_mlps_and_halves_with_tp():
    p, s, b = _mixtral(ep=8)
    n, h = 4096, 4096
    dense_mlp = act.mlp_bytes(p, b, moe=False) - 2 * n * h  # fc1 input + SwiGLU of width 14336
    assert p.model.ffn_hidden_size == 14336
    routed = moe.routed_expert_bytes(p, b)
    assert routed[0] == pytest.approx(2 * dense_mlp[0], rel=0.05)
    assert routed[0] == 2 * (2 * n * h + 6 * n * 14336)
    p2, _, b2 = _mixtral(ep=4, tp=2)
    routed2 = moe.routed_expert_bytes(p2, b2)
    # The ffn-wide part halves exactly; the gathered fc1 input (n*k*etp/tp rows of h) is held by
    # both ETP ranks, so the whole term is (2h + 3f)/(2h + 6f) = 0.543 of TP=1.
    intermediate = lambda r, bb: r - 2 * moe.expert_rows(p, bb) * h  # noqa: E731
    assert intermediate(routed2, b2)[0] == pytest.approx(intermediate(routed, b)[0] / 2)
    assert routed2[0] / routed[0] == pytest.approx((2 * h + 3 * 14336) / (2 * h + 6 * 14336))


def test_imbalance_factor_scales_expert_activations():
    _, _, b = _mixtral(ep=8)
    p1, _, _ = _mixtral(ep=8)
    p2, _, _ = _mixtral(ep=8, moe_token_imbalance=1.5)
    assert moe.routed_expert_bytes(p2, b)[0] == pytest.approx(1.5 * moe.routed_expert_bytes(p1, b)[0])


def test_expert_rows_follow_tp_not_etp():
    # tp=2 with SP: each rank routes n/2 tokens; etp=1 gives n*k/2 full-width rows, etp=2 n*k rows
    # of half width: the same n*k*f/tp activation elements.
    p = make_problem(QWEN3_MOE, gbs=64, seq=4096)
    b1 = LayoutBatch.from_strategy(Strategy(dp=4, tp=2, ep=4, etp=1, sp=True), 64)
    b2 = LayoutBatch.from_strategy(Strategy(dp=4, tp=2, ep=2, etp=2, sp=True), 64)
    k = p.model.num_experts_per_tok
    assert moe.expert_rows(p, b1)[0] == 4096 * k / 2
    assert moe.expert_rows(p, b2)[0] == 4096 * k
    f = p.model.moe_ffn_hidden_size
    assert moe.expert_rows(p, b1)[0] * f == moe.expert_rows(p, b2)[0] * f / 2


# ----- C-08: the expert grid ------------------------------------------------------------------
def _qwen_c08():
    return make_problem(QWEN3_MOE, gbs=64, seq=4096)


def test_c08_expert_grid_must_divide_the_world():
    p = _qwen_c08()
    with pytest.raises(LayoutError, match=r"etp\*ep\*pp = 1\*8\*2 = 16 must divide the world size 8") as err:
        check_strategy(p, Strategy(dp=2, tp=2, pp=2, ep=8, etp=1, sp=True))
    assert err.value.rules == ("expert_grid",)
    check_strategy(p, Strategy(dp=2, tp=2, pp=2, ep=4, etp=1, sp=True))
    unset = Strategy(dp=2, tp=2, pp=2, ep=4, sp=True)
    assert unset.expert_tp == 2
    with pytest.raises(LayoutError, match=r"2\*4\*2 = 16") as err:
        check_strategy(p, unset)
    assert err.value.rules == ("expert_grid",)


def test_c08_other_expert_rules():
    p = _qwen_c08()
    with pytest.raises(LayoutError, match="must divide the number of routed experts"):
        check_strategy(p, Strategy(dp=8, ep=3))  # 128 experts
    with pytest.raises(LayoutError, match="needs sequence parallelism"):
        check_strategy(p, Strategy(dp=4, tp=2, ep=4, etp=1))
    tiny = make_problem(_toy_moe(moe_ffn_hidden_size=30), per_node=4, gbs=16, seq=8)
    with pytest.raises(LayoutError, match="etp=4 must divide moe_ffn_hidden_size=30"):
        check_strategy(tiny, Strategy(dp=1, tp=4, ep=1, sp=True))


def test_c08_emitted_args_state_expert_tp():
    p = _qwen_c08()
    e = estimate(p, Strategy(dp=2, tp=2, pp=2, ep=4, etp=1, sp=True))
    args = megatron_args(p, e.strategy)
    assert re.search(r"--expert-model-parallel-size 4\b", args)
    assert re.search(r"--expert-tensor-parallel-size 1\b", args)
    e = estimate(p, Strategy(dp=4, tp=2, ep=2, sp=True))  # etp unset -> 2, written out
    assert re.search(r"--expert-tensor-parallel-size 2\b", megatron_args(p, e.strategy))


# ----- time ---------------------------------------------------------------------------------------
def test_all_to_all_across_nodes_is_nic_bound():
    p = make_problem("deepseek-v3", nodes=8, gbs=1024, seq=4096)
    dev = p.cluster.device
    intra, nic = link_bandwidths(p)
    size = 64e6
    # ep=8 inside a node: 7/8 of the data over NVLink.
    inside = comm.all_to_all_s(p, size, 8, 1)
    assert inside == pytest.approx(size * 7 / 8 / intra + 3 * dev.intra_node_latency_s)
    # ep=64 over 8 nodes (stride 1): 56/64 of the data leaves the node through the rank's NIC.
    across = comm.all_to_all_s(p, size, 64, 1)
    assert across == pytest.approx(size * 56 / 64 / nic + 6 * dev.inter_node_latency_s)
    assert across > 5 * inside


def test_ep_comm_grows_when_ep_leaves_the_node():
    p = make_problem("deepseek-v3", nodes=8, gbs=1024, seq=4096)
    b = LayoutBatch.from_strategy(Strategy(dp=64, ep=8, etp=1), 1024)
    b64 = LayoutBatch.from_strategy(Strategy(dp=64, ep=64, etp=1), 1024)
    assert moe.layer_comm_s(p, b64)[0] > 5 * moe.layer_comm_s(p, b)[0]


def test_moe_mfu_counts_active_parameters_only():
    # Mixtral-8x7B: ~6 x 12.88e9 active params per token (+ attention); far below 6 x 46.7e9.
    p = make_problem(MIXTRAL, gbs=64, seq=4096)
    per_token = model_flops_per_token(p)
    m = p.model
    attention = 3 * 2 * 4096 * m.num_layers * m.num_attention_heads * 2 * m.head_dim * 0.5
    lm_head = 6 * m.hidden_size * m.vocab_size
    assert per_token == pytest.approx(6 * (m.num_active_params - m.embedding_params() - m.output_params())
                                      + attention + lm_head, rel=0.001)
    assert m.num_active_params == pytest.approx(12.88e9, rel=0.01)


def test_grouped_gemm_small_experts_are_slower_per_flop():
    # Few tokens per expert (ep=1, 128 local experts of Qwen3-30B-A3B) pad to the 128-row tile.
    p = make_problem(QWEN3_MOE, gbs=64, seq=1024)
    b = LayoutBatch.from_strategy(Strategy(dp=8, ep=1, etp=1), 64)
    local, padded, rows = moe.expert_gemm_shapes(p, b)
    assert local == 128 and rows[0] == 1024 * 8 / 128 and padded[0] == 128


# ----- MLA and MTP ----------------------------------------------------------------------------
def test_mla_attention_activations_by_hand():
    p = make_problem("deepseek-v3", nodes=1, gbs=64, seq=4096)
    b = LayoutBatch.from_strategy(Strategy(dp=1, tp=8, sp=True), 64)
    n, t = 4096, 8
    # norm in + down-proj in (SP shard), latents 2x(1536 + 512) + rope 64 (SP shard),
    # q and k 128 x 192, v 128 x 128 (TP-split), flash output 128 x 128 + fp32 LSE per head.
    expected = 2 * n * 7168 * 2 / t + 2 * n * (2 * (1536 + 512) + 64) / t
    expected += 2 * n * (2 * 128 * 192 + 128 * 128) / t + 2 * n * 128 * 128 / t + 4 * n * 128 / t
    assert act.attention_bytes(p, b, np.array([False]))[0] == pytest.approx(expected)


def test_mtp_lives_on_the_last_stage():
    p = make_problem("deepseek-v3", nodes=32, gbs=1024, seq=4096)
    e = estimate(p, Strategy(dp=16, pp=16, ep=16, etp=1, zero=1))
    m, h, v = p.model, 7168, 129280  # 129280 is already a multiple of 128
    assert e.strategy.layers_per_stage[-1] == 2
    layer = m.layer_params(60)
    per_layer = layer.tp + layer.replicated + layer.experts / 16
    # Last stage: 2 layers, final norm, output layer, and the MTP module (norms, 2h x h projection,
    # one layer) with its embedding copy (pp > 1).
    mtp = 2 * h + 2 * h * h + per_layer + v * h
    expected = 2 * per_layer + h + v * h + mtp
    assert e.memory_per_stage[-1].params == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("shared_ffn, framework, per_moe_layer", [
    (0, "megatron", 2),     # attention's AG+RS forward, their conjugates backward; no MLP pair
    (32, "megatron", 4),    # shared experts: a TP-split MLP with SP linears adds its pair
    (0, "torchtitan", 4),   # other frameworks keep the dense MLP's pair
])
def test_moe_layer_tp_collectives_follow_the_dispatcher(shared_ffn, framework, per_moe_layer):
    """Megatron-Core's alltoall dispatcher takes the SP shard [S/TP, B, H] directly
    (token_dispatcher.py), so a MoE layer without shared experts has only its attention's TP
    collectives: with backward overlap off, C-01's toy (dense layers 1, 3; MoE 0, 2) on one stage
    runs 2 x 4 (dense) + 2 x per_moe_layer + 2 (embedding, output layer) all-reduce volumes."""
    from autopar.cost.stage_time import stage_time
    p = make_problem(_toy_moe(shared_expert_ffn_hidden_size=shared_ffn), gbs=16, seq=8,
                     make_vocab_size_divisible_by=1, tp_backward_overlap=False, framework=framework)
    s = Strategy(dp=4, tp=2, ep=4, etp=1, mbs=1, sp=True, zero=1)
    batch, stages = all_stages(p, s)
    one = float(comm.all_reduce_s(p, 2 * 8 * 16, 2, 1))  # bf16 x (s/cp * mbs = 8 tokens) x h=16
    assert stage_time(p, batch, stages).tp_s[0] == pytest.approx((8 + 2 * per_moe_layer + 2) * one, rel=1e-12)
    assert moe.mlp_tp_collective_pairs(p) == (per_moe_layer - 2) // 2


def test_c08_expert_grid_reason_says_the_etp_it_computed_with():
    """The reason said 'etp defaults to tp' while computing with etp 1 (tp 2): it names the etp used."""
    p = _qwen_c08()
    with pytest.raises(LayoutError) as err:
        check_strategy(p, Strategy(dp=2, tp=2, pp=2, ep=8, etp=1, sp=True))
    assert "etp is 1 here, Megatron's default when unset is tp = 2" in str(err.value)
    assert "etp defaults to tp" not in str(err.value)
