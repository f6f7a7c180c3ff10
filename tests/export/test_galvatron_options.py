"""Galvatron's own options: GPipe, vocabulary TP (vtp/vsp), non-consecutive TP groups, and ZeRO-2/3
reduced once per step; costed (numbers derived by hand), searched for --target galvatron, written
by the Galvatron export and refused by the others."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.cost.comm import all_reduce_s, reduce_scatter_s
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS, galvatron
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.search import search
from autopar.search.grid import for_target
from autopar.strategy import Strategy
from conftest import make_problem

H, V = 4096, 128256  # Llama-3-8B hidden size and vocabulary


def _stage(e, i=0):
    return e.memory_per_stage[i]


def test_gpipe_holds_every_microbatch():
    """pp 4, 16 micro-batches: 1F1B stage 1 holds pp - 1 = 3 micro-batches of activations, GPipe
    all 16 (Huang et al. 2019); the closed-form makespan is the same (bubble (pp-1)/M both)."""
    p = make_problem("llama3-8b", gbs=32)
    one = dict(dp=2, tp=1, pp=4, zero=0)
    e1, eg = estimate(p, Strategy(**one)), estimate(p, Strategy(**one, schedule="gpipe"))
    assert e1.num_microbatches == 16
    assert _stage(eg, 1).activations_bytes == pytest.approx(_stage(e1, 1).activations_bytes * 16 / 3, rel=1e-12)
    assert _stage(eg, 2).activations_bytes == pytest.approx(_stage(e1, 2).activations_bytes * 16 / 2, rel=1e-12)
    assert eg.step_time_s == pytest.approx(e1.step_time_s, rel=1e-12)
    assert eg.peak_memory_bytes > e1.peak_memory_bytes


def test_gpipe_needs_one_chunk():
    with pytest.raises(ValueError, match="GPipe runs one model chunk"):
        Strategy(dp=2, pp=4, vpp=2, schedule="gpipe")


def _model_states(e, i=0) -> float:
    m = _stage(e, i)
    return m.weights_bytes + m.grads_bytes + m.optimizer_bytes


def test_vocab_tp_shards_the_vocabulary_matrices():
    """Llama-3-8B (untied, V 128256, h 4096) on 8 GPUs, tp 1 dp 8, ZeRO 0 (18 B per parameter:
    bf16 weight, fp32 grad, 12 B Adam). vtp 8 keeps padded_vocab(8)/8 = ceil(128256/1024)*1024/8 =
    126*1024/8 = 16128 rows of each of the 2 matrices instead of padded_vocab(1) = 128256."""
    p = make_problem("llama3-8b", gbs=64)
    base = dict(dp=8, tp=1, zero=0)
    saved = _model_states(estimate(p, Strategy(**base))) - _model_states(estimate(p, Strategy(**base, vocab_tp=8)))
    assert saved == pytest.approx(18 * 2 * H * (128256 - 16128), rel=1e-12)


def test_vocab_tp_has_its_own_zero_group():
    """ZeRO-3, tp 1, dp 8: the layers shard over dp = 8; with vtp 8 the vocabulary group is
    tp*dp/vtp = 1 rank, so each device keeps its 16128-row shards whole: 18 B x 2 x 16128 x h
    instead of 18 B x 2 x 128256 x h / 8."""
    p = make_problem("llama3-8b", gbs=64)
    base = dict(dp=8, tp=1, zero=3)
    delta = _model_states(estimate(p, Strategy(**base, vocab_tp=8))) - _model_states(estimate(p, Strategy(**base)))
    assert delta == pytest.approx(18 * 2 * H * (16128 - 128256 / 8), rel=1e-9)


def test_vocab_sp_keeps_whole_matrices_sharded_over_the_stage():
    """vsp: whole padded_vocab(1) matrices, ZeRO-sharded over tp*dp*cp; with tp 2, dp 4, ZeRO 3
    that is the same 8 ranks, against padded_vocab(2)/2 = 64128 rows over dp 4 for the layers'
    TP (the bf16 weights, fp32 grads and Adam state all sharded: 18 B / group)."""
    p = make_problem("llama3-8b", gbs=64)
    base = dict(dp=4, tp=2, zero=3, sp=True)
    delta = _model_states(estimate(p, Strategy(**base, vocab_tp=8, vocab_sp=True))) - _model_states(
        estimate(p, Strategy(**base)))
    assert delta == pytest.approx(18 * 2 * H * (128256 / 8 - 64128 / 4), rel=1e-9)


def test_vocab_tp_costs_its_collectives_only_when_it_differs():
    p = make_problem("llama3-8b", gbs=64)
    e = estimate(p, Strategy(dp=8, tp=1, zero=1))
    same = estimate(p, Strategy(dp=8, tp=1, zero=1, vocab_tp=1))
    other = estimate(p, Strategy(dp=8, tp=1, zero=1, vocab_tp=4))
    assert same.step_time_s == e.step_time_s
    assert e.time_breakdown_s["tp_comm"] == 0.0 and other.time_breakdown_s["tp_comm"] > 0.0


def test_vocab_tp_whole_samples_rule():
    """tp 8, mbs 1, vtp 1: each vocabulary rank would get 1/8 of a sequence per micro-batch."""
    p = make_problem("llama3-8b", gbs=64)
    with pytest.raises(LayoutError, match="vocab_tp_whole_samples|whole number"):
        estimate(p, Strategy(dp=1, tp=8, sp=True, vocab_tp=1))
    with pytest.raises(LayoutError, match="vocab_tp=16 must divide the ranks of a pipeline stage"):
        estimate(p, Strategy(dp=8, tp=1, vocab_tp=16))


def test_tp_consecutive_only_matters_across_nodes():
    """2 nodes x 8: tp 8 dp 2 spans both nodes, so strided TP groups (stride dp = 2) cross the
    network and the DP groups (stride 1) stay on NVLink: TP slower, DP faster. tp 4 dp 2 on one
    node (8 ranks) costs the same either way."""
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    base = dict(dp=2, tp=8, zero=1, sp=True)
    c, nc = estimate(p, Strategy(**base)), estimate(p, Strategy(**base, tp_consecutive=False))
    assert nc.time_breakdown_s["tp_comm"] > c.time_breakdown_s["tp_comm"]
    assert nc.time_breakdown_s["dp_comm"] <= c.time_breakdown_s["dp_comm"]
    one = make_problem("llama3-8b", nodes=1, gbs=64)
    small = dict(dp=2, tp=4, zero=1, sp=True)
    assert estimate(one, Strategy(**small)).step_time_s == estimate(one, Strategy(**small, tp_consecutive=False)).step_time_s


def test_tp_consecutive_needs_cp1():
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    with pytest.raises(LayoutError, match="tp_consecutive=False with cp=2"):
        estimate(p, Strategy(dp=2, tp=4, cp=2, sp=True, tp_consecutive=False))


def test_grad_reduce_once_keeps_the_full_gradient():
    """Galvatron's no_sync accumulation (grad_reduce_once): ZeRO-3 keeps 2 B (bf16) per stage
    parameter unsharded through the micro-batches, ZeRO-2 4 B (Galvatron cost_model.py: 1/8 and
    2/8 of its 16 B model state); nothing with one micro-batch."""
    p = make_problem("llama3-8b", gbs=64)
    g = for_target(p, "galvatron")
    assert g.train.grad_reduce_once and not p.train.grad_reduce_once
    for zero, per_param in ((3, 2), (2, 4)):
        s = Strategy(dp=4, tp=1, pp=2, zero=zero)
        mine, megatron = estimate(g, s), estimate(p, s)
        for i in range(2):
            assert _stage(mine, i).grads_bytes - _stage(megatron, i).grads_bytes == pytest.approx(
                per_param * _stage(mine, i).params, rel=1e-12)
    single = make_problem("llama3-8b", gbs=8)
    s = Strategy(dp=8, tp=1, zero=3)  # gbs 8 / dp 8 = one micro-batch: no no_sync
    assert estimate(for_target(single, "galvatron"), s).peak_memory_bytes == estimate(single, s).peak_memory_bytes


def test_grad_reduce_once_reduces_once():
    """ZeRO-2, pp 1, 8 micro-batches: Megatron reduce-scatters each micro-batch under its backward
    (nothing exposed here); Galvatron reduce-scatters the stage's fp32 gradient once, after the
    last backward (fsdp_reduce_gradients), with no pipeline drain to hide it: one ring
    reduce-scatter of 4 B x params over the dp 8 group (stride tp 2: it spans both nodes)."""
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    s = Strategy(dp=8, tp=2, sp=True, zero=2, mbs=1)
    assert s.num_microbatches(64) == 8
    mine = estimate(for_target(p, "galvatron"), s)
    every = estimate(p, s).time_breakdown_s["dp_comm"]
    params = _stage(mine).params
    assert every == 0.0
    assert mine.time_breakdown_s["dp_comm"] == pytest.approx(float(reduce_scatter_s(p, 4 * params, 8, 2)), rel=1e-12)


def test_galvatron_writes_its_knobs():
    p = make_problem("llama3-8b", gbs=64)
    s = Strategy(dp=4, tp=1, pp=2, zero=3, vocab_tp=4, schedule="gpipe")
    doc = galvatron.config(p, s)
    assert (doc["pipeline_type"], doc["vtp"], doc["vsp"], doc["dp_types_enc"].split(",")) == (
        "gpipe", 4, 0, ["1"] * 32)
    assert galvatron.check(doc, p.world_size, p.model.num_layers) == []
    p16 = make_problem("llama3-8b", nodes=2, gbs=64)
    doc = galvatron.config(p16, Strategy(dp=2, tp=8, sp=True, zero=0, tp_consecutive=False, vocab_tp=8, vocab_sp=True))
    assert (doc["tp_consecutive_flags"].split(","), doc["vtp"], doc["vsp"]) == (["0"] * 32, 8, 1)
    assert (doc["pipeline_type"], doc["vtp"]) == ("pipedream_flush", 8)


@pytest.mark.parametrize("knob, text", [(dict(schedule="gpipe", pp=2, dp=4), "schedule=gpipe"),
                                        (dict(vocab_tp=4), "vocab_tp=4"),
                                        (dict(vocab_tp=8, vocab_sp=True), "vocab_sp=true"),
                                        (dict(tp=2, dp=4, sp=True, tp_consecutive=False), "tp_consecutive=false")])
@pytest.mark.parametrize("fmt", sorted(set(WRITERS) - {"galvatron"}))
def test_other_writers_refuse_galvatron_knobs(fmt, knob, text):
    p = make_problem("llama3-8b", gbs=64)
    s = Strategy(**{"dp": 8, "zero": 1, **knob})
    with pytest.raises(AutoparError, match=f"{text}.*--format galvatron"):
        WRITERS[fmt](p, s)


def test_search_target_galvatron_offers_the_knobs():
    """--target galvatron enumerates vtp/vsp, GPipe and (across nodes) strided TP; the others do not."""
    p = make_problem("llama3-70b", nodes=2, gbs=64)
    from autopar.search.grid import costed_grid, for_search

    gp, opts = for_search(p, "galvatron", None)
    batch = costed_grid(gp, 0.1, opts).batch
    assert batch.gpipe.any() and batch.vocab_sp.any() and (~batch.tp_consecutive).any()
    assert (batch.vocab_tp != batch.tp).any()
    mp, mopts = for_search(p, "megatron", None)
    plain = costed_grid(mp, 0.1, mopts, full=True).batch  # every candidate (the search builds only the valid ones)
    assert not (plain.gpipe.any() or plain.vocab_sp.any() or (~plain.tp_consecutive).any()
                or (plain.vocab_tp != plain.tp).any())
    result = search(p, top_k=5, target="galvatron")
    for e in result.layouts:  # whatever ranks is written by the Galvatron export
        json.loads(WRITERS["galvatron"](gp, e.strategy))


@settings(max_examples=30, deadline=None)
@given(vtp=st.sampled_from([1, 2, 4, 8]), zero=st.sampled_from([0, 2, 3]), vsp=st.booleans())
def test_vocab_layout_equals_layers_when_the_same(vtp, zero, vsp):
    """Invariant: a LayoutBatch row with vocab_tp == tp and no vsp costs exactly as the default."""
    p = make_problem("llama3-8b", gbs=64)
    s = Strategy(dp=8 // vtp, tp=vtp, zero=zero, sp=vtp > 1)
    explicit = estimate(p, s.model_copy(update={"vocab_tp": vtp}))
    assert explicit.step_time_s == estimate(p, s).step_time_s
    assert explicit.peak_memory_bytes == estimate(p, s).peak_memory_bytes
    row = LayoutBatch.from_strategy(s.model_copy(update={"vocab_tp": vtp, "vocab_sp": vsp}), 64)
    assert int(row.vocab_tp[0]) == vtp and bool(row.vocab_sp[0]) == vsp and bool(row.tp_consecutive[0])
    assert isinstance(p, Problem) and np.all(row.schedule_code == 0)


def test_table_marks_read_back_by_explain():
    """The table's Galvatron marks (vsp8, gpipe, tp-nc) are read by --explain as their fields."""
    from autopar.report.table import galvatron_marks
    from autopar.search.explain import parse_layout

    s = Strategy(dp=4, tp=2, pp=2, sp=True, vocab_tp=8, vocab_sp=True, schedule="gpipe", tp_consecutive=False)
    assert galvatron_marks(s) == ["vsp8", "gpipe", "tp-nc"]
    assert galvatron_marks(Strategy(dp=8, vocab_tp=4)) == ["vtp4"] and galvatron_marks(Strategy(dp=8)) == []
    wanted = parse_layout("tp2+sp pp2 cp1 dp4 vsp8 gpipe tp-nc")
    assert {k: wanted[k] for k in ("vocab_tp", "vocab_sp", "schedule", "tp_consecutive")} == dict(
        vocab_tp=8, vocab_sp=1, schedule=2, tp_consecutive=0)
    assert parse_layout("tp1 pp1 cp1 dp8 vtp4")["vocab_tp"] == 4


def test_search_constraints_pick_galvatron_choices():
    """--schedule gpipe / --vocab-tp / --no-tp-consecutive keep only those rows (CLI, --target galvatron)."""
    from typer.testing import CliRunner

    from autopar.cli import app

    args = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "64", "--target",
            "galvatron", "--top", "3", "--json"]
    runner = CliRunner()
    for extra, check in ((["--schedule", "gpipe"], lambda s: s["schedule"] == "gpipe" and s["pp"] > 1),
                         (["--vocab-tp", "4"], lambda s: s["vocab_tp"] == 4),
                         (["--no-tp-consecutive"], lambda s: not s["tp_consecutive"] and s["tp"] * s["dp"] > 8)):
        out = runner.invoke(app, args + extra)
        assert out.exit_code == 0, out.output
        layouts = json.loads(out.stdout)["layouts"]
        assert layouts and all(check(e["strategy"]) for e in layouts), extra


def test_gpipe_uneven_split_is_simulated_as_gpipe():
    """An uneven split is simulated op by op under GPipe itself: all forwards, then all backwards.
    Without pipeline sends on the critical path differing, its makespan equals 1F1B's,
    sum_i t_i + (M - 1) max_i t_i (both schedules keep the slowest stage busy from its first
    forward to its last backward); only the activations held differ."""
    p = make_problem("llama3-8b", gbs=256)
    split = dict(dp=2, pp=4, zero=1, layers_per_stage=(7, 9, 9, 7))
    e1, eg = estimate(p, Strategy(**split)), estimate(p, Strategy(**split, schedule="gpipe"))
    assert eg.step_time_s == pytest.approx(e1.step_time_s, rel=1e-9)
    assert eg.num_microbatches == 128  # gbs 256 / dp 2
    assert _stage(eg, 1).activations_bytes == pytest.approx(_stage(e1, 1).activations_bytes * 128 / 3, rel=1e-12)


def test_grad_reduce_once_ddp_all_reduces_after_the_last_backward():
    """ddp (FSDP NO_SHARD) under no_sync, pp 1: Megatron overlaps the fp32 all-reduce with the last
    micro-batch's backward, exposing ``all_reduce - backward``; Galvatron all-reduces 4 B x params
    over dp after it, exposed whole, so the difference is that backward; no gradient memory beyond
    the unsharded fp32 gradient ddp keeps anyway."""
    p = make_problem("llama3-8b", nodes=2, gbs=64)
    s = Strategy(dp=8, tp=2, sp=True, zero=0)
    mine, megatron = estimate(for_target(p, "galvatron"), s), estimate(p, s)
    params = _stage(mine).params
    ring = float(all_reduce_s(p, 4 * params, 8, 2))
    assert mine.time_breakdown_s["dp_comm"] == pytest.approx(ring, rel=1e-12)
    (t,) = megatron.time_per_stage
    assert megatron.time_breakdown_s["dp_comm"] == pytest.approx(ring - t.backward_s - t.recompute_s, rel=1e-9)
    assert mine.peak_memory_bytes == megatron.peak_memory_bytes


def test_galvatron_export_says_the_sequence_parallel_launch_flag(tmp_path):
    """Megatron sp is Galvatron's runtime --sequence-parallel (store_true in its bundled Megatron
    arguments, off unless given), not a JSON key: export names it on stderr where the plan has sp
    (tp 2 + sp), and not where it has none (tp 1); the JSON itself is unchanged."""
    from typer.testing import CliRunner

    from autopar.cli import app

    base = ["export", "--format", "galvatron", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64",
            "--zero", "2"]
    runner = CliRunner()
    with_sp = runner.invoke(app, base + ["--tp", "2", "--sp", "--out", str(tmp_path / "sp.json")])
    assert with_sp.exit_code == 0, with_sp.output
    assert "note: launch Galvatron with --sequence-parallel: the plan shards activations over tp=2" in with_sp.stderr
    assert json.loads((tmp_path / "sp.json").read_text())["tp_sizes_enc"].startswith("2,2,")
    without = runner.invoke(app, base + ["--tp", "1"])
    assert without.exit_code == 0 and "--sequence-parallel" not in without.stderr
    assert json.loads(without.stdout)["pp_deg"] == 1
