"""Layer tables and chunk op times of several layouts costed in one pass equal each costed alone
(the search's top-k re-balancing builds them together; every cost term is row-wise)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem

from autopar.cost.stage import all_stages
from autopar.pipeline.layers import chunk_op_times_many_s, chunk_op_times_s, layer_table, layer_tables, op_times_s
from autopar.pipeline.rebalance import TableCache
from autopar.strategy import Strategy

TABLE_FIELDS = ("forward_s", "backward_s", "recompute_s", "activation_bytes", "static_bytes", "stage_forward_s",
                "stage_backward_s", "stage_recompute_s", "stage_bytes")


@pytest.fixture(scope="module")
def p():
    return make_problem("llama3-8b", device="a100-40gb", gbs=64, seq=4096)


@pytest.fixture(scope="module")
def moe():
    """DeepSeek-V3-like: MoE, MLA, and the MTP layers on a stage of their own rank."""
    return make_problem("deepseek-v3", nodes=8, gbs=512, seq=4096)


SHAPES = [Strategy(dp=2, pp=4), Strategy(dp=1, tp=2, pp=4, recompute="selective"),
          Strategy(dp=4, pp=2, vpp=2, schedule="interleaved"), Strategy(dp=8, pp=1)]


def _same(a, b) -> None:
    assert a.options == b.options and a.p2p_s == b.p2p_s and a.memory_limit_bytes == b.memory_limit_bytes
    for name in TABLE_FIELDS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_layer_tables_of_several_shapes_equal_each_table_alone(p):
    limits = [30 * 2**30, None, 20 * 2**30, 35 * 2**30]
    together = layer_tables(p, SHAPES, limits, module_sets=(("core_attn",),))
    assert [t.pp for t in together] == [4, 4, 2, 1]
    for s, limit, table in zip(SHAPES, limits, together):
        _same(table, layer_table(p, s, limit, module_sets=(("core_attn",),)))


def test_layer_tables_refuse_a_limit_that_is_not_positive(p):
    with pytest.raises(Exception, match="memory_limit_bytes=0.0: must be positive"):
        layer_tables(p, SHAPES[:2], [1e9, 0.0])


def test_table_cache_fill_builds_each_shape_once_and_get_finds_it(p):
    cache = TableCache()
    limit = 30 * 2**30
    # the same shard shape under another recompute option and split is one table
    cache.fill(p, [(SHAPES[0], limit), (SHAPES[0].model_copy(update={"recompute": "full"}), limit),
                   (SHAPES[1], limit)])
    assert len(cache) == 2
    _same(cache.get(p, SHAPES[0], limit), layer_table(p, SHAPES[0], limit))
    assert len(cache) == 2  # found, not rebuilt


def test_chunk_times_of_several_layouts_equal_each_alone_and_sum_to_the_stage_times(p, moe):
    layouts = [(p, [Strategy(dp=2, pp=4, layers_per_stage=(9, 7, 8, 8), recompute="selective"),
                   Strategy(dp=4, pp=2, vpp=2, schedule="interleaved", layers_per_stage=(14, 18)),
                   Strategy(dp=8, pp=1)]),
               (moe, [Strategy(dp=4, tp=8, pp=2, ep=4, sp=True, recompute="full"),
                     Strategy(dp=2, tp=8, pp=4, ep=2, sp=True, recompute="selective")])]
    for q, strategies in layouts:
        staged = [(s, *all_stages(q, s)) for s in strategies]
        for (s, batch, stages), chunks in zip(staged, chunk_op_times_many_s(q, staged)):
            assert chunks.shape == (3, s.pp, s.vpp)
            np.testing.assert_array_equal(chunks, chunk_op_times_s(q, s, batch, stages))
            # fixed part + per-layer share * layers = the stage's own op times
            np.testing.assert_allclose(chunks.sum(axis=2), op_times_s(q, batch, stages), rtol=1e-12)


def test_interleaved_chunks_without_the_fixed_part_hold_half_their_ranks_layer_time(p):
    """pp=2, vpp=2, 14 + 18 layers: chunks of 7, 7 and 9, 9 layers. The embedding sits on rank 0's
    chunk 0 and the output layer and loss on rank 1's chunk 1, so rank 0's chunk 1 and rank 1's
    chunk 0 hold half their rank's layer time: the stage minus the same stage with no layer."""
    s = Strategy(dp=4, pp=2, vpp=2, schedule="interleaved", layers_per_stage=(14, 18))
    batch, stages = all_stages(p, s)
    other = Strategy(dp=8, pp=1)  # batched alongside, so the slices of the one pass are exercised
    chunks = chunk_op_times_many_s(p, [(other, *all_stages(p, other)), (s, batch, stages)])[1]
    empty = all_stages(p, s)[1]
    empty.layers = np.zeros_like(empty.layers)
    layer_s = op_times_s(p, batch, stages) - op_times_s(p, batch, empty)
    np.testing.assert_allclose(chunks[:, 0, 1], layer_s[:, 0] / 2, rtol=1e-12)
    np.testing.assert_allclose(chunks[:, 1, 0], layer_s[:, 1] / 2, rtol=1e-12)
    assert chunks[0, 0, 0] > chunks[0, 0, 1]  # the embedding's forward on top
