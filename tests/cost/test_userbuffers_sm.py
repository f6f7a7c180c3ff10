"""The SMs Transformer Engine's userbuffers kernels take from the GEMMs they overlap under
Megatron's --tp-comm-overlap (:mod:`autopar.cost.userbuffers_sm`, :mod:`autopar.specs.userbuffers`)."""

from dataclasses import replace

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost import compute as C
from autopar.cost import flops as F
from autopar.cost import userbuffers_sm
from autopar.cost.stage_time import userbuffers_layer_s
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.layout_batch import LayoutBatch
from autopar.specs.userbuffers import TE1_DEFAULTS, TE2_DEFAULTS, UbGemm, Userbuffers
from autopar.strategy import Strategy
from autopar.validate import DEFAULT_CSV
from autopar.validate.measurements import read_rows
from autopar.validate.ub_recipes import userbuffers_of

H100_BF16_GEMM = 989.4e12 * 0.64  # h100-80gb: bf16 dense peak x gemm_efficiency (devices.json)


def _batch(**over) -> LayoutBatch:
    return LayoutBatch.from_strategy(Strategy(**{**dict(dp=2, tp=4, sp=True, tp_comm_overlap=True), **over}), 64)


def test_output_projection_on_108_of_132_sms_by_hand():
    # Llama-3-70B, seq 8192, mbs 1, tp 4 on an H100 (132 SMs): the output projection's GEMM is
    # 8192 tokens x 8192 outputs x 2048 inputs per rank, 2 * 8192 * 8192 * 2048 = 2.749e11 FLOP:
    # 0.4341 ms at 64% of 989.4 TFLOP/s on all SMs. NeMo's userbuffers_bf16_h100_h8192_tp4 runs its
    # reduce-scatter on 24 SMs with set_sm_margin: the GEMM on 108 SMs, 0.4341 x 132/108 = 0.5306 ms
    # (+4 us launch each; its 201 MB of operands take 0.086 ms of HBM, so it stays compute-bound).
    p = make_problem("llama3-70b", seq=8192)
    b = _batch()
    proj = F.attention_gemms(p, b)[-1]
    assert (proj.m[0], proj.n, proj.k[0]) == (8192, 8192, 2048)
    full = C.gemm_time_s(p, proj)
    assert full[0] == pytest.approx(2 * 8192 * 8192 * 2048 / H100_BF16_GEMM + 4e-6)
    fewer = userbuffers_sm.gemm_with_comm_s(p, proj, full, UbGemm(method="pipeline", num_sm=24, set_sm_margin=True),
                                            np.array([1e-3]))
    assert fewer[0] == pytest.approx(2 * 8192 * 8192 * 2048 / (H100_BF16_GEMM * 108 / 132) + 4e-6)
    assert fewer[0] == pytest.approx(0.5306e-3 + 4e-6, rel=1e-3)


def test_without_margin_the_gemm_loses_the_sms_only_while_the_collective_runs():
    # TE 1.x default (set_sm_margin 0): the 16-SM kernel of a 0.2 ms collective costs the GEMM
    # 0.2 ms x 16/132 = 24.2 us; a collective outlasting the GEMM costs no more than the margin would.
    p = make_problem("llama3-70b", seq=8192)
    b = _batch()
    proj = F.attention_gemms(p, b)[-1]
    full = C.gemm_time_s(p, proj)
    ub = UbGemm(method="pipeline", num_sm=16, set_sm_margin=False)
    short = userbuffers_sm.gemm_with_comm_s(p, proj, full, ub, np.array([0.2e-3]))
    assert (short - full)[0] == pytest.approx(0.2e-3 * 16 / 132)
    margin = userbuffers_sm.gemm_with_comm_s(p, proj, full, ub.model_copy(update={"set_sm_margin": True}), 0.0)
    long = userbuffers_sm.gemm_with_comm_s(p, proj, full, ub, np.array([1.0]))
    assert long[0] == pytest.approx(margin[0])
    # Copy-engine ring exchange takes no SM.
    ring = UbGemm(method="ring_exchange", num_sm=0, set_sm_margin=False)
    assert userbuffers_sm.gemm_with_comm_s(p, proj, full, ring, np.array([1.0]))[0] == full[0]


def test_which_layers_and_frameworks_pay():
    p = make_problem("llama3-70b", seq=8192)
    b = _batch()
    assert userbuffers_sm.applies(p, b)[0]
    assert not userbuffers_sm.applies(p, _batch(tp_comm_overlap=False))[0]
    assert not userbuffers_sm.applies(make_problem("llama3-70b", framework="torchtitan"), b)[0]  # async TP: no userbuffers
    assert not userbuffers_sm.applies(make_problem("llama3-70b", device="ascend-910b"), b)[0]  # no SM count
    pair = np.array([1e-3])
    fwd, bwd = userbuffers_sm.layer_extra_s(p, b, pair, moe=False)
    # TE >= 2.0: proj/fc2 forward and the four QKV/fc1 backward GEMMs each on 116 of 132 SMs.
    gemms = F.attention_gemms(p, b)[::-1][:1] + F.mlp_gemms(p, b, moe=False)[1:]
    slower = [(C.gemm_time_s(p, g) - 4e-6) * 16 / 116 for g in gemms]
    assert fwd[0] == pytest.approx(sum(s[0] for s in slower), rel=1e-6)
    assert bwd[0] > fwd[0] > 0
    # A MoE layer: only its attention's GEMMs.
    moe_fwd, _ = userbuffers_sm.layer_extra_s(p, b, pair, moe=True)
    assert moe_fwd[0] == pytest.approx(slower[0][0], rel=1e-6)


def test_no_sm_taken_leaves_the_estimate_unchanged():
    none = Userbuffers(**{name: UbGemm(method="ring_exchange", num_sm=0, set_sm_margin=False)
                          for name in Userbuffers.model_fields})
    s = Strategy(dp=2, tp=4, sp=True, tp_comm_overlap=True)
    base = estimate(make_problem("llama3-8b", userbuffers=none), s).step_time_s
    te1 = estimate(make_problem("llama3-8b", userbuffers=TE1_DEFAULTS), s).step_time_s
    te2 = estimate(make_problem("llama3-8b"), s).step_time_s
    assert base < te1 < te2
    p = make_problem("llama3-8b", userbuffers=none)
    b = _batch()
    assert userbuffers_layer_s(p, b)[0][0] == 0.0


def test_published_runs_take_their_recipes_userbuffers():
    rows = {r.id: r for r in read_rows(DEFAULT_CSV)}
    gpt3, source = userbuffers_of(rows["DGXC2411-G175B-BF16-128"])
    assert "gpt3_175b_hydra.yaml" in source
    assert (gpt3.proj_fprop.num_sm, gpt3.fc2_fprop.num_sm, gpt3.qkv_wgrad.num_sm) == (24, 20, 8)
    assert gpt3.proj_fprop.set_sm_margin and not gpt3.qkv_wgrad.set_sm_margin
    assert userbuffers_of(rows["DGXC2411-N15B-BF16-16"])[0] == TE1_DEFAULTS  # the YAML states none
    assert userbuffers_of(rows["DGXC2505-N340B-H100-BF16-256"])[0] == TE2_DEFAULTS  # NeMo 25.04: TE 2.x


def _with_sm_count(device: str, sm_count: int):
    p = make_problem("llama3-8b", device=device)
    return replace(p, cluster=p.cluster.model_copy(update={
        "device": p.cluster.device.model_copy(update={"sm_count": sm_count})}))


def test_ascend_tp_overlap_is_mc2_not_userbuffers():
    """MindSpeed's MC2 takes no SMs of Transformer Engine's kind: an sm_count set on an Ascend device
    had made llama3-70b tp 8 1.85x slower with overlap."""
    assert userbuffers_sm.may_apply(_with_sm_count("h100-80gb", 132))
    assert not userbuffers_sm.may_apply(_with_sm_count("ascend-910b", 24))


def test_an_sm_count_within_the_userbuffers_share_is_refused():
    with pytest.raises(AutoparError, match=r"sm_count=16 \(device h100-80gb, --device-set or --device-file\): "
                       r"Transformer Engine's userbuffers kernels take 16 SMs .*allowed more than 16"):
        userbuffers_sm.may_apply(_with_sm_count("h100-80gb", 16))
