"""Stage balancer: DP vs ILP, memory limits, uneven layer counts, cases C-04 and C-05."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem, toy_model

from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export.megatron import megatron_args
from autopar.pipeline.balance import balance
from autopar.pipeline.layers import layer_table
from autopar.pipeline.rebalance import balanced_strategy
from autopar.strategy import Strategy


def _table_memory(tab, split, option, in_flight):
    bounds = np.concatenate([[0], np.cumsum(split)])
    return [tab.stage_bytes[i, option] + tab.static_bytes[a:b].sum() + in_flight[i] * tab.activation_bytes[a:b, option].sum()
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


def test_layer_table_reproduces_the_cost_model_per_stage_c04():
    """C-04: Llama-3-8B pp4; the table's stage memory equals estimate's, and the peak is on the
    first or last stage (embedding / output + fp32 logits)."""
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    s = Strategy(dp=2, pp=4, zero=1)
    tab, e = layer_table(p, s), estimate(p, s)
    got = _table_memory(tab, (8, 8, 8, 8), 0, [4, 3, 2, 1])
    assert got == pytest.approx([m.total_bytes for m in e.memory_per_stage], rel=1e-12)
    assert tab.stage_bytes[3, 0] - tab.stage_bytes[1, 0] >= 8192 * 128256 * 4  # logits on the last
    assert int(np.argmax(got)) in (0, 3)


def test_dp_and_ilp_agree_on_the_pure_split():
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    tab = layer_table(p, Strategy(dp=2, pp=4, zero=1, recompute="selective"))
    dp = balance(tab, 1, 32, "1f1b", options=("selective",))
    from autopar.pipeline import ilp
    from autopar.pipeline.folded import fold, surrogate_s
    folded = fold(tab, 1, np.array([4, 3, 2, 1.0]))
    r = tab.option_index("selective")
    bounds = np.concatenate([[0], np.cumsum(dp.best.layers_per_stage)])
    times = folded.rank_time_s(np.arange(4), bounds[:-1], bounds[1:], r)
    result = ilp.solve(folded, np.array([r]), 32, 1, float(surrogate_s(times, 32, 1)) * 1.01, 10.0)
    assert result.optimal and result.bounds is not None
    ilp_times = folded.rank_time_s(np.arange(4), result.bounds[:-1], result.bounds[1:], r)
    assert ilp_times.max() == pytest.approx(times.max(), rel=1e-9)


@pytest.mark.parametrize("limit_gib", [60, 70, 80])
def test_balancer_never_exceeds_the_memory_limit(limit_gib):
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    tab = layer_table(p, Strategy(dp=2, pp=4, zero=1), memory_limit_bytes=limit_gib * 2**30)
    plan = balance(tab, 1, 32, "1f1b")
    assert max(plan.best.stage_memory_bytes) <= limit_gib * 2**30
    assert sum(plan.best.layers_per_stage) == 32


def test_no_fitting_split_is_one_user_error():
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    tab = layer_table(p, Strategy(dp=2, pp=4, zero=1), memory_limit_bytes=10 * 2**30)
    with pytest.raises(AutoparError, match="memory_limit_bytes=10.0 GiB"):
        balance(tab, 1, 32, "1f1b")


def test_405b_on_pp16_splits_all_126_layers_and_offsets_sum_to_the_remainder():
    p = make_problem("llama3.1-405b", nodes=256, gbs=2048, seq=8192)
    s = Strategy(dp=16, tp=8, pp=16, zero=1, sp=True, recompute="selective")
    plan = balance(layer_table(p, s), 1, 128, "1f1b", baseline="selective")
    assert sum(plan.best.layers_per_stage) == 126
    assert sum(sum(row) for row in plan.offset) == 126 - 16 * (126 // 16)
    assert max(plan.best.stage_memory_bytes) <= p.cluster.device.memory_bytes


@pytest.mark.parametrize("layers,pp", [(30, 4), (61, 8)])
def test_c05_balanced_split_sums_to_L_and_megatron_args_reproduce_it(layers, pp):
    p = make_problem(toy_model(num_layers=layers), per_node=pp, gbs=4 * pp, seq=8)
    s = Strategy(dp=1, pp=pp)
    balanced = balanced_strategy(p, s, p.cluster.device.memory_bytes) or s.model_copy(
        update={"layers_per_stage": estimate(p, s).strategy.layers_per_stage})
    split = balanced.layers_per_stage
    assert sum(split) == layers and len(split) == pp and len(set(split[1:-1])) <= 1
    args = " ".join(megatron_args(p, balanced).split())
    first = int(args.split("--decoder-first-pipeline-num-layers ")[1].split()[0])
    last = int(args.split("--decoder-last-pipeline-num-layers ")[1].split()[0])
    assert (first, last) == (split[0], split[-1])
    assert (layers - first - last) == (pp - 2) * split[1]  # the middle stages Megatron builds
