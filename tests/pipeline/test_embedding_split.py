"""Megatron's embedding/loss-aware pipeline split (``--account-for-embedding-in-pipeline-split``,
``--account-for-loss-in-pipeline-split``; Megatron-Core ``TransformerConfig.__post_init__`` and
``get_num_layers_to_build``; ecosystem.md 1.3 rules 18, 21, 22)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.stage import Stages, all_stages
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import megatron, mindspeed
from autopar.export.checks import violations
from autopar.export.rewrite import rewrite_script
from autopar.pipeline.layers import chunk_op_times_s, op_times_s
from autopar.pipeline.layout import PipelineLayout, layout_of
from autopar.rules import RULE_NAMES, check_strategy, first_failure
from autopar.space import enumerate_layouts
from autopar.specs.script import read_script
from autopar.specs.script_cli import layout_defaults
from autopar.strategy import Strategy, default_layers_per_stage
from autopar.validate.measurements import read_rows
from autopar.validate.rows import to_case
from conftest import MEASUREMENTS, make_problem, toy_model

BOTH = dict(account_for_embedding=True, account_for_loss=True)
# 126 layers as Llama-3.1-405B, tiny widths: 64 devices = tp 1 x pp 8 x dp 8; gbs 64 -> 8 micro-batches.
P126 = make_problem(toy_model(num_layers=126), nodes=8, per_node=8, gbs=64, seq=8)
PP8_VPP8 = Strategy(dp=8, pp=8, vpp=8, schedule="interleaved", **BOTH)


def _failing(p, s) -> tuple[str, ...]:
    try:
        check_strategy(p, s)
    except LayoutError as err:
        return err.rules
    return ()


def test_rule_accepts_126_layers_pp8_vpp8_only_with_both_flags():
    check_strategy(P126, PP8_VPP8)  # (126 + 2) / (8 * 8) = 2 per chunk
    plain = PP8_VPP8.model_copy(update=dict(account_for_embedding=False, account_for_loss=False))
    # 126 / 8 = 15.75 does not interleave evenly: the flexible default, (126 + 2) / 64 = 2 slots per
    # chunk with E and L one slot each, is exactly the split the two flags give.
    assert _failing(P126, plain) == ()
    assert (layout_of(P126, plain).decoder == layout_of(P126, PP8_VPP8).decoder).all()
    # vpp 32: 16 slots per rank over 32 chunks leave the embedding chunk no slot.
    assert _failing(P126, plain.model_copy(update=dict(vpp=32))) == ("interleaved_layer_split",)
    # One flag: 127 is not a multiple of 64.
    assert _failing(P126, PP8_VPP8.model_copy(update=dict(account_for_loss=False))) == ("embedding_loss_split",)
    # vpp 16: 128 / 128 = 1 slot per chunk would leave the embedding chunk without a decoder layer.
    assert "embedding_loss_split" in _failing(P126, PP8_VPP8.model_copy(update=dict(vpp=16)))


def test_vectorised_rule_agrees_with_the_single_layout_check():
    from autopar.layout_batch import LayoutBatch
    batch = LayoutBatch.concat([LayoutBatch.from_strategy(s, 64) for s in (
        PP8_VPP8, PP8_VPP8.model_copy(update=dict(account_for_embedding=False, account_for_loss=False)),
        PP8_VPP8.model_copy(update=dict(account_for_loss=False)))])
    names = [RULE_NAMES[i] if i >= 0 else None for i in first_failure(P126, batch)]
    assert names == [None, None, "embedding_loss_split"]  # the second: a flexible layout (see above)


def test_per_chunk_and_per_stage_layer_counts_by_hand():
    chunks = PipelineLayout.accounted(126, 8, 8, True, True).decoder
    assert chunks[0, 0] == 1 and chunks[7, 7] == 1  # embedding + 1 layer, 1 layer + loss
    others = np.ones((8, 8), dtype=bool)
    others[0, 0] = others[7, 7] = False
    assert (chunks[others] == 2).all() and chunks.sum() == 126
    assert default_layers_per_stage(126, 8, True, True) == (15,) + (16,) * 6 + (15,)
    # Embedding only: 7 + 1 = 8 slots over pp 2 x vpp 2 -> [[1, 2], [2, 2]].
    assert PipelineLayout.accounted(7, 2, 2, True, False).decoder.tolist() == [[1, 2], [2, 2]]
    assert default_layers_per_stage(7, 2, True, False) == (3, 4)
    with pytest.raises(AutoparError, match="127 is not a multiple of pp\\*vpp = 64"):
        PipelineLayout.accounted(126, 8, 8, True, False)
    assert estimate(P126, PP8_VPP8).strategy.layers_per_stage == (15,) + (16,) * 6 + (15,)


def test_first_and_last_stage_memory_and_time_by_hand():
    # Toy layer (h 16, 4 heads of 4, kv 4, FFN 64, no gate, RMSNorm): qkv 16*48 + o 16*16 +
    # fc1/fc2 2*16*64 + 2 norms 2*16 = 3104 params; vocab 32 padded to 128: 128*16 = 2048.
    # L 6, pp 4, both flags: 8 slots / 4 = 2 per stage -> 1, 2, 2, 1 decoder layers.
    p = make_problem(toy_model(num_layers=6), nodes=1, per_node=4, gbs=8, seq=8)
    e = estimate(p, Strategy(dp=1, pp=4, zero=1, **BOTH))
    params = [m.params for m in e.memory_per_stage]
    assert [m.layers for m in e.memory_per_stage] == [1, 2, 2, 1]
    assert params == [3104 + 2048, 2 * 3104, 2 * 3104, 3104 + 2048 + 16]  # last: head + final norm
    first = e.memory_per_stage[0]  # bf16 weights, fp32 grads, Adam 12 B/param (dp 1: nothing to shard)
    assert (first.weights_bytes, first.grads_bytes, first.optimizer_bytes) == (2 * 5152, 4 * 5152, 12 * 5152)
    # The switches are a split, not a cost: the same as the explicit split 1,2,2,1.
    explicit = estimate(p, Strategy(dp=1, pp=4, zero=1, layers_per_stage=(1, 2, 2, 1)))
    assert e.step_time_s == explicit.step_time_s
    assert [m.total_bytes for m in e.memory_per_stage] == [m.total_bytes for m in explicit.memory_per_stage]


def test_explicit_split_must_be_the_derived_one():
    check_strategy(P126, PP8_VPP8.model_copy(update=dict(layers_per_stage=(15,) + (16,) * 6 + (15,))))
    with pytest.raises(LayoutError, match="cannot combine --account-for-embedding/loss-in-pipeline-split"):
        check_strategy(P126, PP8_VPP8.model_copy(update=dict(layers_per_stage=(16,) * 7 + (14,))))


def test_full_recompute_of_every_layer_counts_the_short_chunks():
    # Stage 0 holds 15 layers in 8 chunks (1 + 7 x 2). "full" on every layer and "block 2 per
    # chunk" recompute the same 15 layers (a chunk of 1 recomputes its 1), so they cost the same.
    every = estimate(P126, PP8_VPP8.model_copy(update=dict(recompute="full")))
    block2 = estimate(P126, PP8_VPP8.model_copy(update=dict(recompute="full", recompute_layers=2)))
    none = estimate(P126, PP8_VPP8)
    assert [m.activations_bytes for m in every.memory_per_stage] == [m.activations_bytes for m in
                                                                      block2.memory_per_stage]
    assert every.step_time_s == block2.step_time_s > none.step_time_s
    with pytest.raises(LayoutError, match="at most num_layers/\\(pp\\*vpp\\) = 2 layers per model chunk"):
        check_strategy(P126, PP8_VPP8.model_copy(update=dict(recompute="full", recompute_layers=3)))


def test_search_offers_it_only_where_it_makes_interleaving_possible():
    batch = enumerate_layouts(P126)
    flagged = batch.account_embedding
    assert (flagged == batch.account_loss).all()
    # 128 / pp slots per rank; the two largest vpp <= 16 with >= 2 per chunk: pp 2 -> 16, 8; 4 -> 16, 8;
    # 8 -> 8, 4; 16 -> 4, 2; 32 -> 2 (the only one).
    assert set(zip(batch.pp[flagged].tolist(), batch.vpp[flagged].tolist())) == {
        (2, 16), (2, 8), (4, 16), (4, 8), (8, 8), (8, 4), (16, 4), (16, 2), (32, 2)}
    assert (batch.vpp[flagged] > 1).all()  # vpp 1: same split as the default uneven one
    p128 = make_problem(toy_model(num_layers=128), nodes=8, per_node=8, gbs=64, seq=8)
    for p, b in ((P126, batch), (p128, enumerate_layouts(p128))):
        layers, f = p.model.num_layers, b.account_embedding
        plain_ok = (layers % b.pp[f] == 0) & ((layers // b.pp[f]) % b.vpp[f] == 0)
        assert not plain_ok.any()  # only where the default split cannot interleave
        assert ((layers + 2) % (b.pp[f] * b.vpp[f]) == 0).all()
    b128 = enumerate_layouts(p128)
    assert not b128.account_embedding[(b128.pp == 8) & (b128.vpp == 8)].any()  # 128 / 8 / 8 = 2 already
    # Qwen3-235B-A22B's 94 layers: pp 8 -> 96 / 8 = 12 slots, vpp 6 and NVIDIA's recipe's vpp 4 (3 a chunk)
    qwen = enumerate_layouts(make_problem(toy_model(num_layers=94), nodes=8, per_node=8, gbs=64, seq=8))
    f = qwen.account_embedding & (qwen.pp == 8)
    assert set(qwen.vpp[f].tolist()) == {6, 4}
    valid = first_failure(P126, batch) < 0
    assert (valid & flagged & (batch.pp == 8) & (batch.vpp == 8)).any()  # NVIDIA's 405B layout passes
    assert not (valid & ~flagged & (batch.pp == 8) & (batch.vpp == 8)).any()


def test_megatron_export_emits_the_switches_and_reads_back(tmp_path):
    text = megatron.write(P126, PP8_VPP8)
    assert "--account-for-embedding-in-pipeline-split" in text and "--account-for-loss-in-pipeline-split" in text
    assert "--decoder-first-pipeline-num-layers" not in text
    assert "--num-virtual-stages-per-pipeline-rank 8" in text
    path = tmp_path / "run.sh"
    path.write_text(text)
    plan = read_script(path)
    assert violations(plan) == []
    assert plan.strategy(64, 126).model_copy(update={"etp": None}) == PP8_VPP8  # etp: read back resolved
    # Rewrite to tp 2 (pp 8 vpp 4) and read back again.
    s2 = Strategy(dp=4, tp=2, pp=8, vpp=4, sp=True, schedule="interleaved", **BOTH)
    back = read_script(path, rewrite_script(plan, P126, s2)).strategy(64, 126)
    assert back.model_copy(update={"etp": None}) == s2
    plain = Strategy(dp=8, pp=8)
    assert "--account-for" not in rewrite_script(plan, P126, plain)


def test_script_reader_counts_the_switches_in_the_vpp_flag(tmp_path):
    text = megatron.write(P126, PP8_VPP8).replace("--num-virtual-stages-per-pipeline-rank 8",
                                                  "--num-layers-per-virtual-pipeline-stage 2")
    path = tmp_path / "run.sh"
    path.write_text(text)
    assert read_script(path).layout["vpp"] == 8  # (126 + 2) / 8 / 2
    path.write_text(text.replace("--account-for-loss-in-pipeline-split",
                                 "--account-for-loss-in-pipeline-split --decoder-first-pipeline-num-layers 14"))
    with pytest.raises(AutoparError, match="cannot be combined with --decoder-first/last-pipeline-num-layers"):
        read_script(path)


def test_mindspeed_gets_the_same_split_as_a_layer_list_or_a_refusal():
    with pytest.raises(AutoparError, match="MindSpeed-LLM: the embedding/loss-aware split"):
        mindspeed.write(P126, PP8_VPP8)
    text = mindspeed.write(P126, Strategy(dp=8, pp=8, **BOTH))
    assert "--num-layer-list 15,16,16,16,16,16,16,15" in text and "--account-for" not in text


def test_405b_pp8_vpp8_validate_rows_are_mapped_with_the_switches():
    rows = {r.id: r for r in read_rows(MEASUREMENTS)}
    for row_id in ("DGXC2505-L405B-H100-BF16-512", "MLM-LLAMA-FP8-3"):
        case = to_case(rows[row_id])
        assert case.strategy.account_for_embedding and case.strategy.account_for_loss
        assert (case.strategy.pp, case.strategy.vpp) == (8, 8)
        assert any("embedding and loss" in a for a in case.assumed)
        check_strategy(case.problem, case.strategy)
    # 126 / 9 / 7 = 2 per chunk: no switches needed, none assumed.
    assert not to_case(rows["DGXC2411-L405B-BF16-576"]).strategy.account_for_embedding


def test_simulator_chunks_hold_the_embedding_and_loss_where_megatron_puts_them():
    s = estimate(P126, PP8_VPP8).strategy  # with its split written out
    batch, stages = all_stages(P126, s)
    chunks = chunk_op_times_s(P126, s, batch, stages).sum(axis=0)  # (pp, vpp) seconds per micro-batch
    assert np.allclose(chunks.sum(axis=1), op_times_s(P126, batch, stages).sum(axis=0))  # stage totals kept
    fixed = op_times_s(P126, batch, Stages(index=stages.index, start=stages.start,
                                            layers=np.zeros(8, dtype=np.int64))).sum(axis=0)
    # Per rank: chunks other than the one holding the fixed part have 2 layers and nothing else.
    assert chunks[0, 0] == pytest.approx(chunks[0, 1] / 2 + fixed[0])  # 1 layer + embedding
    assert chunks[7, 7] == pytest.approx(chunks[7, 0] / 2 + fixed[7])  # 1 layer + output layer and loss
    assert np.allclose(chunks[0, 1:], chunks[0, 1]) and np.allclose(chunks[7, :7], chunks[7, 0])
    assert chunks[3, 0] == pytest.approx(chunks[3, 1] + fixed[3])  # middle rank: 2 layers per chunk


def test_cli_estimate_takes_the_switch_and_names_it_when_missing():
    args = ["estimate", "--model", "llama3.1-405b", "--device", "h100-80gb", "--nodes", "64", "--gbs", "256",
            "--seq-len", "8192", "--tp", "8", "--pp", "8", "--vpp", "8", "--cp", "2"]
    out = CliRunner().invoke(app, args + ["--embedding-loss-split", "--json"])
    assert out.exit_code == 0, out.output
    strategy = json.loads(out.output)["strategy"]
    assert strategy["account_for_embedding"] and strategy["account_for_loss"]
    assert strategy["layers_per_stage"] == [15] + [16] * 6 + [15]
    # Without the switch 126 / 8 does not interleave: the flexible default places E and L as one
    # slot each, the same chunks (the switch's split written as a layout string), the same costs.
    flexible = CliRunner().invoke(app, args + ["--json"])
    assert flexible.exit_code == 0, flexible.output
    plain = json.loads(flexible.output)
    assert plain["strategy"]["pipeline_layout"] == "Et|(tt|)*62tL"
    assert plain["step_time_s"] == pytest.approx(json.loads(out.output)["step_time_s"], rel=1e-12)


def test_script_switches_fill_the_command_line_layout_unless_a_split_is_given(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(megatron.write(P126, PP8_VPP8))
    plan = read_script(path)
    keys = dict(pp=None, layers_per_stage=None, account_for_embedding=None, account_for_loss=None)
    assert layout_defaults(plan, keys) == dict(pp=8, layers_per_stage=None, account_for_embedding=True,
                                               account_for_loss=True)
    assert layout_defaults(plan, dict(keys, account_for_embedding=False))["account_for_embedding"] is False
    split = dict(keys, layers_per_stage=(16,) * 7 + (14,))
    assert layout_defaults(plan, split)["account_for_loss"] is False  # an explicit split replaces them
    assert layout_defaults(None, keys)["account_for_loss"] is False
