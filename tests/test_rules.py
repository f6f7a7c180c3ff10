"""Layout validity rules and the shared cases C-05, C-06, C-07 (shared/cases/README.md)."""

from __future__ import annotations

import pytest

from autopar.errors import LayoutError
from autopar.estimate import estimate
from autopar.export.megatron import megatron_args
from autopar.rules import check_strategy
from autopar.search import search
from autopar.strategy import Strategy, default_layers_per_stage
from conftest import make_problem, toy_model


def _rules(p, s) -> tuple[str, ...]:
    with pytest.raises(LayoutError) as err:
        check_strategy(p, s)
    assert "\n" not in str(err.value)
    return err.value.rules


def test_c05a_layers_per_virtual_stage_must_divide():
    # L=80, PP=16: 80/16 = 5 layers per stage do not cut into 2 equal chunks; the flexible layout
    # does (5 layers per rank in chunks of 2 and 3; E and L take one slot of rank 0's and 15's).
    p = make_problem(toy_model(num_layers=80), nodes=2, gbs=64, seq=8)
    check_strategy(p, Strategy(dp=1, pp=16, vpp=2, schedule="interleaved"))
    # vpp 8: 5 slots per rank over 8 chunks leave rank 0's first chunk no slot for the embedding.
    with pytest.raises(LayoutError, match=r"num_layers=80 .*pp=16 x vpp=8"):
        check_strategy(p, Strategy(dp=1, pp=16, vpp=8, schedule="interleaved"))


@pytest.mark.parametrize("layers, pp, split", [(30, 4, (7, 8, 8, 7)), (61, 8, (7, 8, 8, 8, 8, 8, 8, 6)),
                                               (126, 16, (7,) + (8,) * 14 + (7,)), (32, 4, (8,) * 4)])
def test_c05_uneven_splits_are_explicit_and_sum_to_the_layers(layers, pp, split):
    assert default_layers_per_stage(layers, pp) == split
    assert sum(split) == layers


def test_c05_emitted_args_reproduce_the_uneven_split():
    p = make_problem(toy_model(num_layers=30), per_node=4, gbs=16, seq=8)
    e = estimate(p, Strategy(dp=1, pp=4))
    assert e.strategy.layers_per_stage == (7, 8, 8, 7)
    args = megatron_args(p, e.strategy)
    assert "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7" in args
    assert sum(s.layers for s in e.memory_per_stage) == 30


def test_c05_search_never_builds_a_truncated_model():
    p = make_problem("deepseek-v3", nodes=64, gbs=1024, seq=4096)
    p_dense = make_problem(toy_model(num_layers=30, hidden_size=256, num_attention_heads=8, num_kv_heads=8,
                                     head_dim=32, ffn_hidden_size=1024), nodes=2, gbs=64, seq=256)
    for e in search(p_dense, top_k=50).layouts:
        assert sum(e.strategy.layers_per_stage) == 30
    assert sum(default_layers_per_stage(p.model.num_layers, 8)) == 61


def test_explicit_split_is_checked():
    p = make_problem(toy_model(num_layers=30), per_node=4, gbs=16, seq=8)
    assert "layers_per_stage" in _rules(p, Strategy(dp=1, pp=4, layers_per_stage=(8, 8, 8, 8)))
    assert "layers_per_stage" in _rules(p, Strategy(dp=1, pp=4, layers_per_stage=(10, 10, 10)))


def test_c06_microbatches_and_the_interleaved_schedule():
    interleaved = Strategy(dp=2, tp=2, pp=4, vpp=2, schedule="interleaved")
    p24 = make_problem("llama2-7b", nodes=2, gbs=24, seq=4096)
    check_strategy(p24, interleaved)  # 12 micro-batches, a multiple of pp=4
    p20 = make_problem("llama2-7b", nodes=2, gbs=20, seq=4096)
    with pytest.raises(LayoutError, match="num_microbatches=10 to be a multiple of pp=4"):
        check_strategy(p20, interleaved)
    p4 = make_problem("llama2-7b", nodes=2, gbs=4, seq=4096)
    assert _rules(p4, Strategy(dp=1, tp=2, pp=8)) == ("pipeline_fill",)


def test_c06_every_searched_layout_divides_the_batch():
    p = make_problem("llama2-7b", nodes=2, gbs=24, seq=4096)
    result = search(p, top_k=200)
    for e in result.layouts:
        s = e.strategy
        assert 24 % (s.mbs * s.dp) == 0 and e.num_microbatches == 24 // (s.mbs * s.dp)
        assert s.pp == 1 or e.num_microbatches >= s.pp
        assert s.vpp == 1 or e.num_microbatches % s.pp == 0


def test_c07_tp_must_divide_the_kv_heads():
    p = make_problem("llama3-8b", nodes=2, gbs=256, seq=8192)
    assert all(e.strategy.tp != 16 for e in search(p, top_k=1000).layouts)
    with pytest.raises(LayoutError, match="num_key_value_heads=8"):
        check_strategy(p, Strategy(dp=1, tp=16))
    q = make_problem("qwen3-30b-a3b", gbs=64, seq=4096)
    assert "tp_divides_kv_heads" in _rules(q, Strategy(dp=1, tp=8))
    check_strategy(q, Strategy(dp=2, tp=4, sp=True))


@pytest.mark.parametrize("strategy, rule", [
    (Strategy(dp=4, tp=2, sp=False, zero=2, pp=1), None),
    (Strategy(dp=8, tp=1, sp=True), "sp_needs_tp"),
    (Strategy(dp=2, pp=4, zero=2), None),  # Megatron-FSDP with pp (rule zero_with_pp refuses DeepSpeed only)
    (Strategy(dp=4, cp=2, tp=1), None),
    (Strategy(dp=8, recompute="selective", recompute_layers=2), "recompute_layers"),
    (Strategy(dp=1, pp=8, recompute="full", recompute_layers=5), "recompute_layers"),
    (Strategy(dp=4, tp=2, ep=2), "ep_needs_experts"),
    (Strategy(dp=2, tp=2, pp=2, vpp=2), "schedule"),
    (Strategy(dp=3, tp=2), "world_size"),
])
def test_named_rules(strategy, rule):
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    if rule is None:
        check_strategy(p, strategy)
    else:
        with pytest.raises(LayoutError) as err:
            check_strategy(p, strategy)
        assert rule in err.value.rules or rule in str(err.value)


def test_cp_needs_seq_divisible_by_2cp():
    p = make_problem("llama3-8b", gbs=64, seq=4100)
    assert "cp_divides_seq" in _rules(p, Strategy(dp=1, cp=8))
