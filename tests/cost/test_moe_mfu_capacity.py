"""MFU of a token-dropping MoE counts the token copies the experts compute, never more than 100%.

The numerator of MFU (:func:`autopar.cost.flops.model_flops_per_token`) scales the routed experts
by :func:`autopar.cost.moe.processed_fraction` = ``min(1, C)``: with a capacity factor ``C`` < 1 an
expert keeps ``C`` times its balanced share and drops the rest (Megatron-Core
``moe_utils.apply_router_token_dropping``). Before, the dropped copies were counted as work done
while the step time no longer paid for them: the shipped Mixtral script with ``C`` = 0.1 showed
MFU 103.3% on H100, and 176.6% with ``C`` = 0.01 in ``search``.
"""

from __future__ import annotations

import pytest
from conftest import make_problem, toy_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.cost.flops import model_flops_per_token
from autopar.cost.moe import processed_fraction
from autopar.estimate import estimate
from autopar.specs.moe_runtime import MoeRuntime
from autopar.strategy import Strategy

# toy MoE: L=4, h=16, 4 experts of width 64 (GeLU, not gated), top-2, vocab 32
TOY = toy_model(num_experts=4, num_experts_per_tok=2, moe_ffn_hidden_size=64, moe_layers=(0, 1, 2, 3))
# Routed experts per token, training (3x forward): 4 layers x k=2 copies x (2*h*f up + 2*f*h down)
# = 4 * 2 * (2*16*64 + 2*64*16) * 3 = 4 * 2 * 4096 * 3 = 98,304 FLOPs.
ROUTED_PER_TOKEN = 98_304


def _flops(capacity: float | None, pad: bool = False) -> float:
    p = make_problem(TOY, per_node=1, gbs=1, seq=8, moe=MoeRuntime(capacity_factor=capacity, pad_to_capacity=pad))
    return model_flops_per_token(p)


def test_processed_fraction_is_capacity_below_one():
    assert processed_fraction(make_problem(TOY, per_node=1, gbs=1, seq=8).train) == 1.0
    for capacity, share in ((0.1, 0.1), (0.5, 0.5), (1.0, 1.0), (1.25, 1.0), (4.0, 1.0)):
        train = make_problem(TOY, per_node=1, gbs=1, seq=8, moe=MoeRuntime(capacity_factor=capacity)).train
        assert processed_fraction(train) == share


def test_model_flops_drop_the_dropped_copies():
    dropless = _flops(None)
    assert dropless - _flops(0.5) == pytest.approx(0.5 * ROUTED_PER_TOKEN)
    assert dropless - _flops(0.1, pad=True) == pytest.approx(0.9 * ROUTED_PER_TOKEN)
    # padding above the share adds rows that are not tokens: no model FLOPs
    assert _flops(2.0, pad=True) == pytest.approx(dropless)
    assert _flops(1.25) == pytest.approx(dropless)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.floats(min_value=0.001, max_value=4.0), pad=st.booleans(),
       imbalance=st.floats(min_value=1.0, max_value=3.0))
def test_mfu_never_exceeds_100_percent_over_capacity_factors(capacity, pad, imbalance):
    """Mixtral 8x7B on 32 H100s, the shipped script's layout (tp 2 + SP, pp 4, ep 4)."""
    p = make_problem("mixtral-8x7b", nodes=4, gbs=512, seq=4096, moe_token_imbalance=imbalance,
                     moe=MoeRuntime(capacity_factor=capacity, pad_to_capacity=pad))
    est = estimate(p, Strategy(dp=4, tp=2, sp=True, pp=4, ep=4, etp=2, mbs=1, zero=1))
    assert 0 < est.mfu <= 1.0
