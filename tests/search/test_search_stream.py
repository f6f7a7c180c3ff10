"""The streamed search (:mod:`autopar.search.stream`) ranks and counts as the whole batch did.

Costed chunk by chunk with a running top, the search must give the numbers ``main`` gave before
streaming (copied from ``search`` on main at 2753c63 and ea3bff8), including the walk past layouts the
target cannot write, and its merge of chunks must equal one sort of the whole batch.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from conftest import make_problem, whole_batch_top

import autopar.search.stream as stream
from autopar.search import search
from autopar.search.grid import for_search
from autopar.search.valid_space import count_space, valid_layouts


def _summary(r):
    return [(e.strategy.tp, e.strategy.pp, e.strategy.ep, e.strategy.mbs, e.strategy.zero, e.strategy.recompute,
             e.strategy.moe_dispatcher) for e in r.layouts]


def test_qwen3_moe_on_16_h100_as_before():
    r = search(make_problem("qwen3-30b-a3b", nodes=2, gbs=256, seq=4096), top_k=4)
    assert (r.enumerated, r.out_of_memory, r.marginal, r.not_writable) == (1918080, 91550, 26498, 0)
    assert r.rejected == {"tp_divides_kv_heads": 126720, "sp_needs_tp": 234720, "expert_grid": 976512,
                          "moe_tp_needs_sp": 160704, "ep_overlap_no_full_recompute": 82368}
    assert _summary(r) == [(1, 1, 8, 1, 2, "none", "deepep"), (1, 1, 16, 1, 1, "none", "deepep"),
                           (1, 1, 16, 1, 2, "none", "deepep"), (1, 1, 16, 1, 3, "none", "deepep")]
    assert [e.step_time_s for e in r.layouts] == pytest.approx(
        [4.932316170089515, 4.94639254883287, 4.94639254883287, 4.9550912255387525], rel=1e-12)
    assert [e.peak_memory_bytes for e in r.layouts] == [66562697216.0, 68717918720.0, 62938818560.0, 60276826880.0]


def test_walk_past_refused_layouts_as_before(monkeypatch):
    """DeepSpeed refuses 5 fitting layouts on the way to the top 4 of Llama-3-70B on 32 H100 (16 on
    the way to the RECOST_AT_LEAST = 10 re-balanced first); with a first pass that keeps only 2
    layouts the walk runs out, and the second pass (8 times more kept) finds the same 4 as
    main (ea3bff8)."""
    import autopar.search.grid as grid

    passes = []

    def first_pass_keeps_two(p, count, memory_margin, keep):
        passes.append(keep)
        return stream.stream_costs(p, count, memory_margin, 2 if len(passes) == 1 else keep)

    monkeypatch.setattr(stream, "CHUNK_ROWS", 4096)  # many chunks to merge
    monkeypatch.setattr(grid, "stream_costs", first_pass_keeps_two)
    r = search(make_problem("llama3-70b", nodes=4, gbs=512, seq=8192), top_k=4, target="deepspeed")
    assert len(passes) == 2
    assert (r.enumerated, r.out_of_memory, r.marginal, r.not_writable) == (56800, 23442, 212, 16)
    assert [(e.strategy.tp, e.strategy.cp, e.strategy.mbs, e.strategy.zero, e.strategy.recompute)
            for e in r.layouts] == [(2, 1, 2, 3, "full"), (1, 1, 1, 3, "full"), (1, 2, 2, 3, "full"),
                                    (1, 4, 4, 3, "full")]
    assert [e.step_time_s for e in r.layouts] == pytest.approx(
        [155.2730930854453, 157.87298716418852, 159.54503990018853, 160.4117862681885], rel=1e-12)


def test_streamed_top_is_the_whole_batch_sorted(monkeypatch):
    """The running top of many small chunks, visited best-first and ruled out by their step-time
    floors, equals the first rows of one stable sort of the whole valid batch by (marginal, step
    time to the microsecond, simplicity, row)."""
    monkeypatch.setattr(stream, "CHUNK_ROWS", 1000)
    p, options = for_search(make_problem("llama3-70b", nodes=4, gbs=512, seq=8192), "megatron", None)
    space = valid_layouts(p, options, [])
    expected, step, peak, fit, marginal = whole_batch_top(p, space, 300)
    got = stream.stream_costs(p, count_space(p, options, []), 0.1, keep=300)
    want = space.valid.take(expected)
    for f in fields(want):  # the same layouts in the same order
        assert np.array_equal(getattr(got.top.batch, f.name), getattr(want, f.name)), f.name
    assert (got.fitting, got.marginal, got.truncated) == (len(fit), int(np.sum(marginal[fit])), True)
    assert got.lightest_peak_bytes == peak.min()
    assert np.array_equal(got.top.step_s, step[expected])


def test_nothing_fits_names_the_lightest_layout():
    """A 405B model on one node: nothing fits and the error names the lightest layout, as main did."""
    from autopar.errors import AutoparError

    with pytest.raises(AutoparError, match=r"no layout fits in 79\.6 GiB per device: the smallest predicted peak is "
                                           r"857\.6 GiB \(tp=8 pp=1 cp=1 dp=1 zero=0 recompute=full\)"):
        search(make_problem("llama3.1-405b", nodes=1, gbs=64, seq=8192), top_k=1)
