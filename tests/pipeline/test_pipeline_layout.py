"""PipelineLayout: Megatron-LM's layout string (parse, validate, write), the classic splits as cases
of it, per-chunk in-flight counts, the simulated schedule with unequal chunks, and the layouts the
issue names (DeepSeek-V3 recipes, Llama-2-70B pp 16 x vpp 2) end to end."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export.layout_flags import layout_flags
from autopar.pipeline.layout import PipelineLayout, chunk_in_flight, default_layout, layout_of
from autopar.pipeline.simulate import PipelineTimes, simulate
from autopar.strategy import Strategy
from conftest import make_problem, toy_model

runner = CliRunner()


# ----- the string -------------------------------------------------------------------------------

def test_parses_megatrons_own_docstring_example():
    # Megatron-LM pipeline_parallel_layer_layout.py parse_str_to_list: "Ettt|(tt|)*29,m|L" ->
    # [E,t,t,t] + [t,t]*29 + [m] + [L]; 32 stages over pp 16 = vpp 2; stage 30 = chunk 1 of rank 14.
    layout = PipelineLayout.parse("Ettt|(tt|)*29,m|L", pp=16)
    assert layout.vpp == 2 and len(layout.stages) == 32
    assert layout.stages[0] == "Ettt" and layout.stages[30] == "m" and layout.stages[31] == "L"
    assert layout.decoder[0].tolist() == [3, 2] and layout.decoder[15].tolist() == [2, 0]
    assert layout.mtp_rank == 14 and layout.num_layers == 3 + 2 * 29
    layout.validate(num_layers=61, mtp_num_layers=1)


@pytest.mark.parametrize("text, pp, why", [
    ("Et|tL|x", 3, "'x' is not a layer character"),
    ("Et|t|tL", 2, "3 virtual stages is not a multiple of pp=2"),
])
def test_syntax_errors_name_the_option(text, pp, why):
    with pytest.raises(AutoparError, match=why) as err:
        PipelineLayout.parse(text, pp)
    assert str(err.value).startswith("--pipeline-layout=")


@pytest.mark.parametrize("text, layers, mtp, why", [
    ("Et|tLE", 2, 0, "exactly once"),
    ("tE|tL", 2, 0, "first layer must be the embedding"),
    ("Ett|tL", 2, 0, "it has 3 decoder layers t; the model has num_layers=2"),
    ("Et|tL", 2, 1, "it has 0 MTP layers"),
    ("Etm|tL", 2, 1, "decoder layers must be placed before MTP layers"),
    ("Ett|ttm|L|", 4, 1, "MTP layers must be in the last virtual stage of a rank"),  # m in rank 1's chunk 0
    ("|Ett|t|L", 3, 0, "embedding on pipeline rank 0's first chunk"),
    ("Ettt|L", 3, 0, "every pipeline rank to hold at least one decoder layer"),
])
def test_megatron_validation_rules(text, layers, mtp, why):
    layout = PipelineLayout.parse(text, pp=2)
    with pytest.raises(AutoparError, match=why):
        layout.validate(layers, mtp)


def test_standalone_mtp_in_a_ranks_last_chunk_is_valid():
    # "Et|t|m|L": m is chunk 1 of rank 0, L chunk 1 of rank 1 (Megatron's "MTP standalone")
    layout = PipelineLayout.parse("Et|t|m|L", pp=2)
    layout.validate(2, 1)
    assert layout.mtp_rank == 0 and layout.first_last() is None


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 6), vpp=st.integers(1, 4), data=st.data())
def test_written_string_parses_back_to_the_same_layout(pp, vpp, data):
    decoder = np.array(data.draw(st.lists(st.integers(0, 9), min_size=pp * vpp, max_size=pp * vpp))).reshape(pp, vpp)
    mtp = data.draw(st.integers(0, 2))
    layout = PipelineLayout.from_chunks(decoder, mtp)
    back = PipelineLayout.parse(layout.megatron(), pp)
    assert back == layout
    assert (back.decoder == decoder).all() and back.mtp.sum() == mtp


# ----- the classic splits as layouts --------------------------------------------------------------

def test_issue_split_5_3_4x13_1_is_written_as_the_issues_string():
    layout = PipelineLayout.from_stage_split((5, 3) + (4,) * 13 + (1,), 1, mtp_num_layers=1)
    assert layout.megatron() == "Ettttt|ttt|(tttt|)*13tmL"
    assert layout.first_last() is None  # unequal middle stages: only the layout string says it
    layout.validate(61, 1)


def test_first_last_flags_where_they_suffice():
    assert PipelineLayout.from_stage_split((7, 8, 8, 7)).first_last() == (7, 7)
    assert PipelineLayout.from_stage_split((8, 8, 8, 8), 2).first_last() == (None, None)
    assert PipelineLayout.from_stage_split((6, 8, 8, 8), 2).first_last() == (6, None)
    # 7 layers on a rank cannot split over vpp 2 with the flags (transformer_config.py: first % vpp)
    assert PipelineLayout.from_stage_split((7, 8, 8, 9), 2).first_last() is None


def test_accounted_split_is_a_layout():
    # 126 layers, pp 8, vpp 8, both flags: chunks [0,0] and [7,7] hold 1 layer, the rest 2.
    layout = PipelineLayout.accounted(126, 8, 8, True, True)
    assert layout.megatron() == "Et|(tt|)*62tL"
    offsets = layout.sapp_offsets()  # [chunk][rank], layers minus 126 // 64 = 1
    assert offsets[0][0] == 0 and offsets[7][7] == 0 and offsets[0][1] == 1


@pytest.mark.parametrize("layers, pp, vpp, mtp, text", [
    # NVIDIA Megatron-Bridge DeepSeek-V3 pp 16 x vpp 2 (and pp 8 x vpp 4: the same 32 chunks)
    (61, 16, 2, 1, "Et|(tt|)*30mL"),
    (61, 8, 4, 1, "Et|(tt|)*30mL"),
    # pp 4 x vpp 4: default ranks 15, 16, 16, 14; 16 slots per rank in chunks of 4
    (61, 4, 4, 1, "Ettt|(tttt|)*14ttmL"),
    # Llama-2-70B pp 16 x vpp 2: 5 layers per rank in chunks of 2 and 3
    (80, 16, 2, 0, "Ett|(tt|)*14(ttt|)*16ttL"),
])
def test_flexible_default_where_the_even_split_cannot_interleave(layers, pp, vpp, mtp, text):
    layout = default_layout(layers, pp, vpp, mtp)
    assert layout.megatron() == text
    layout.validate(layers, mtp)


def test_even_split_is_unchanged():
    layout = default_layout(32, 4, 2)
    assert layout.decoder.tolist() == [[4, 4]] * 4 and layout.first_last() == (None, None)


# ----- in flight per chunk -----------------------------------------------------------------------

def test_chunk_in_flight_by_hand():
    # pp 4, vpp 4, rank 0: W = 2*3 + 3*4 + 1 = 19 forwards in groups of 4 per chunk:
    # chunks 0,1,2,3,0 -> 4+3 = 7 on chunk 0, 4 on each other.
    assert chunk_in_flight(4, 4, 0, 128).tolist() == [7, 4, 4, 4]
    # rank 3: W = 0 + 12 + 1 = 13 -> 4, 4, 4, 1
    assert chunk_in_flight(4, 4, 3, 128).tolist() == [4, 4, 4, 1]
    assert chunk_in_flight(4, 1, 1, 128).tolist() == [3]  # 1F1B: pp - rank
    assert chunk_in_flight(4, 1, 1, 2).tolist() == [2]  # fewer micro-batches than stages


def test_first_rank_memory_counts_its_heavier_first_chunk():
    """Two layouts with the same 8 layers on rank 0 of pp 2 x vpp 2 (m = 8): 2+6 and 6+2. Rank 0
    holds W = 2*1 + 2 + 1 = 5 forwards: chunk 0 three micro-batches (0, 1, then 4), chunk 1 two.
    Activations per micro-batch and layer a: 2*3 + 6*2 = 18a against 6*3 + 2*2 = 22a, the equal
    4+4 split 20a = 5/2 micro-batches x 8 layers (the even formula), and 1+1 gives 3 + 2 = 5a."""
    p = make_problem(toy_model(num_layers=16), nodes=1, per_node=2, gbs=8, seq=64)
    acts = {}
    for name, text in (("light_first", "Ett|tttt|tttttt|ttttL"), ("heavy_first", "Etttttt|tttt|tt|ttttL"),
                       ("even", "Etttt|tttt|tttt|ttttL")):
        s = Strategy(dp=1, pp=2, vpp=2, schedule="interleaved", pipeline_layout=text)
        acts[name] = estimate(p, s).memory_per_stage[0].activations_bytes
    base = estimate(p, Strategy(dp=1, pp=2, vpp=2, schedule="interleaved",
                                pipeline_layout="Et|t*7|t|t*7L")).memory_per_stage[0].activations_bytes
    # activations = per-layer share x (count-weighted layers) + the same fixed part on rank 0
    unit = (acts["even"] - acts["light_first"]) / 2  # 20a - 18a
    assert acts["heavy_first"] - acts["even"] == pytest.approx(2 * unit, rel=1e-9)
    assert acts["even"] - base == pytest.approx(15 * unit, rel=1e-9)
    assert unit > 0


# ----- the schedule with unequal chunks ------------------------------------------------------------

def test_1f1b_with_unequal_stages_by_hand():
    """pp 2, m 3, stage 0 f=1 b=2, stage 1 f=2 b=4 (twice as heavy), no p2p. Rank 0 runs F0 | F1 B0
    F2 B1 | B2, rank 1 F0 B0 F1 B1 F2 B2: stage 1 F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13] F2 [13,15]
    B2 [15,19]; stage 0 B0 [7,9] F2 [9,10] B1 [13,15] B2 [19,21]. Makespan 21; busy 9 + 18 of 2 x 21:
    bubble 15/42; peak in flight 2 on rank 0 (F0, F1 before B0), 1 on rank 1."""
    t = PipelineTimes(np.array([[1.0], [2.0]]), np.array([[2.0], [4.0]]), np.zeros((2, 1)))
    r = simulate(t, 3, "1f1b")
    assert r.makespan_s == pytest.approx(21.0)
    assert r.bubble_fraction == pytest.approx(15 / 42)
    assert r.peak_in_flight.tolist() == [2, 1]


def test_interleaved_with_unequal_chunks_by_hand():
    """pp 2, vpp 2, m 2; virtual stages j0 = rank 0 chunk 0 (f 1, b 2), j1 = rank 1 chunk 0 (f 2,
    b 4), j2 = rank 0 chunk 1 (f 2, b 4), j3 = rank 1 chunk 1 (f 1, b 2). Rank 0 warms up with all
    4 forwards: j0 [0,1] [1,2], j2 [3,5] [5,7] (waiting on j1 [1,3] [3,5]); rank 1: j3 F0 [5,6]
    B0 [6,8] F1 [8,9] B1 [9,11]; rank 0 j2 B0 [8,12] B1 [12,16]; rank 1 j1 B0 [12,16] B1 [16,20];
    rank 0 j0 B0 [16,18] B1 [20,22]. Makespan 22, each rank busy 18: bubble 8/44; peak in flight
    4 on rank 0, 3 on rank 1 (j1 x 2 and j3's first)."""
    t = PipelineTimes(np.array([[1.0, 2.0], [2.0, 1.0]]), np.array([[2.0, 4.0], [4.0, 2.0]]), np.zeros((2, 2)))
    r = simulate(t, 2, "interleaved")
    assert r.makespan_s == pytest.approx(22.0)
    assert r.bubble_fraction == pytest.approx(8 / 44)
    assert r.peak_in_flight.tolist() == [4, 3]


# ----- end to end -----------------------------------------------------------------------------------

DSV3 = ["--model", "deepseek-v3", "--gbs", "8192", "--recompute", "full"]


@pytest.mark.parametrize("cluster, layout", [
    (["--device", "gb200", "--nodes", "64", "--devices-per-node", "4"], ["--tp", "1", "--pp", "4", "--vpp", "4", "--ep", "64"]),
    (["--device", "b200", "--nodes", "32", "--devices-per-node", "8"], ["--tp", "1", "--pp", "4", "--vpp", "4", "--ep", "64"]),
    (["--device", "h100-80gb", "--nodes", "128", "--devices-per-node", "8"],
     ["--tp", "2", "--pp", "8", "--vpp", "4", "--ep", "64"]),
    (["--device", "h100-80gb", "--nodes", "128", "--devices-per-node", "8"], ["--tp", "1", "--pp", "16", "--ep", "64"]),
])
def test_deepseek_v3_recipes_estimate(cluster, layout):
    out = runner.invoke(app, ["estimate", *DSV3, *cluster, *layout, "--json"])
    assert out.exit_code == 0, out.output


def test_estimate_takes_a_layout_string_and_refuses_a_bad_one():
    args = ["estimate", *DSV3, "--device", "gb200", "--nodes", "64", "--devices-per-node", "4", "--tp", "1",
            "--pp", "4", "--ep", "64"]
    out = runner.invoke(app, [*args, "--pipeline-layout", "Et*4|(t*4|)*14tmL", "--json"])
    assert out.exit_code == 0, out.output
    bad = runner.invoke(app, [*args, "--pipeline-layout", "Et*4|(t*4|)*14ttmL"])
    assert bad.exit_code == 2 and "it has 62 decoder layers t; the model has num_layers=61" in bad.output


def test_megatron_export_writes_the_layout_for_unequal_middle_stages():
    p = make_problem("deepseek-v3", nodes=128, gbs=8192)
    s = Strategy(dp=64, tp=1, pp=16, ep=64, layers_per_stage=(5, 3) + (4,) * 13 + (1,))
    flags = layout_flags(p, s, "megatron")
    assert flags["--pipeline-model-parallel-layout"] == "'Ettttt|ttt|(tttt|)*13tmL'"
    assert flags["--decoder-first-pipeline-num-layers"] is None and flags["--num-virtual-stages-per-pipeline-rank"] is None
    assert layout_of(p, s).layers_per_stage == (5, 3) + (4,) * 13 + (1,)


def test_balance_llama2_70b_pp16_vpp2_runs():
    out = runner.invoke(app, ["balance", "--model", "llama2-70b", "--tp", "8", "--pp", "16", "--vpp", "2",
                              "--device", "h100-80gb", "--nodes", "16"])
    assert out.exit_code == 0, out.output
    assert "Megatron-LM:" in out.output


def test_search_offers_flexible_vpps_where_nothing_else_interleaves():
    from autopar.space import _flexible_vpps, enumerate_layouts, SpaceOptions

    p = make_problem("deepseek-v3", nodes=128, gbs=8192)  # 64 slots: 61 layers + MTP + E + L
    assert [_flexible_vpps(p, pp, 16) for pp in (4, 8, 16, 32)] == [[4, 8], [2, 4], [2], []]
    batch = enumerate_layouts(p, SpaceOptions(tp=(1,), cp=(1,), pp=(8,), mbs=(1,), zero=(1,)))
    assert sorted(set(batch.vpp.tolist())) == [1, 2, 4]
    # a search row with vpp 4 is written with its layout string
    row = int(np.nonzero(batch.vpp == 4)[0][0])
    assert batch.strategy(row, 61, 1).pipeline_layout == "Et|(tt|)*30mL"


def test_standalone_mtp_is_costed_on_its_own_rank():
    """Megatron's docstring layout "Ettt|(tt|)*29,m|L" puts the MTP layer alone on chunk 1 of rank 14
    and the loss on rank 15; "...|mL" keeps both on rank 15. The MTP block's parameters move from
    rank 15 to rank 14 and nothing else changes: the same amount leaves one and joins the other."""
    p = make_problem("deepseek-v3", nodes=128, gbs=8192)
    def params(text):
        s = Strategy(dp=64, tp=1, pp=16, vpp=2, ep=64, schedule="interleaved", pipeline_layout=text)
        return [m.params for m in estimate(p, s).memory_per_stage]
    alone, together = params("Ettt|(tt|)*29,m|L"), params("Ettt|(tt|)*29|mL")
    moved = alone[14] - together[14]
    assert moved > 1e9 and together[15] - alone[15] == pytest.approx(moved)
    assert alone[:14] == together[:14]
