"""1F1B's p2p hand-offs cost the same whether the stages are equal (closed form) or not (simulated
pipeline): Megatron-LM's non-interleaved schedule sends and receives synchronously, so each of the
``2 (m + pp - 2)`` hand-offs is exposed (:mod:`autopar.cost.step`). The simulation of uneven
stages used to charge only what its overlapped p2p added, about the fill and drain's."""

from __future__ import annotations

import pytest
from conftest import make_problem

from autopar.estimate import estimate
from autopar.strategy import Strategy


@pytest.mark.parametrize("split", [(16, 16), (17, 15)])
def test_1f1b_handoffs_are_2_m_plus_pp_minus_2_sends_even_or_uneven(split):
    """llama3-8b (untied embeddings: no tied-gradient all-reduce), gbs 128 over dp 2, mbs 1: m = 64
    micro-batches, pp 2: 2 x (64 + 2 - 2) = 128 sends of one activation."""
    p = make_problem("llama3-8b", gbs=128, seq=8192)
    e = estimate(p, Strategy(dp=2, tp=2, pp=2, mbs=1, layers_per_stage=split))
    assert e.num_microbatches == 64 and not p.model.tie_word_embeddings
    assert e.time_breakdown_s["pp_comm"] == pytest.approx(128 * e.time_per_stage[0].p2p_s, rel=1e-12)


def test_interleaved_uneven_keeps_the_simulated_overlap():
    """Interleaving overlaps p2p with compute (Megatron's overlap_p2p_comm): an uneven interleaved
    layout is charged what p2p adds to its simulated makespan, less than 2 (m + pp - 2) sends."""
    p = make_problem("llama3-8b", gbs=128, seq=8192)
    e = estimate(p, Strategy(dp=2, tp=2, pp=2, vpp=2, mbs=1, schedule="interleaved",
                             pipeline_layout="Et*9|t*8|t*8|t*7L"))
    assert 0 < e.time_breakdown_s["pp_comm"] < 128 * e.time_per_stage[0].p2p_s
