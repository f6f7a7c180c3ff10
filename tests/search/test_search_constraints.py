"""Search constraints (issue 19 item 1): pinned fields and switched-off dimensions remove exactly
the layouts derived by hand, before the rules and the costing; bad values get one error line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.search.constraints import FIELD_BY_OPTION, apply_constraints, parse_constraints, parse_values

runner = CliRunner()
# llama3-8b (32 layers, dense) on 8 H100 (one NVLink domain). Per pipeline split (pp, vpp) the
# recompute options are none, selective, full and full on the partial layer counts {n/4, n/2,
# 3n/4} of the n = 32/(pp vpp) layers per chunk (0 and n left out): R = 6 for n >= 4, 4 for
# n = 2, 3 for n = 1. Summed over the pp/vpp splits of the d devices left to pp, S(d):
#   pp 1: vpp 1 (R 6); pp 2: vpp 1, 2, 4, 8, 16 (6+6+6+4+3 = 25); pp 4: vpp 1, 2, 4, 8 (6+6+4+3 = 19);
#   pp 8: vpp 1, 2, 4 (6+4+3 = 13); so S(1) = 6, S(2) = 31, S(4) = 50, S(8) = 63.
# Each point also holds mbs (1, 2, 4, 8) x zero (0-3) = 16 rows, times the TP modes (no SP, SP,
# and with tp > 1 SP + overlap: 2 or 3) times the CP algorithms --target megatron offers with cp > 1
# (p2p, a2a, allgather; a2a+p2p never, its all-to-all group tp*a <= 8 is all of cp on one node:
# 1 or 3). Over the (tp, cp) pairs:
#   tp*cp = 1: (1,1) 2 x S(8); tp*cp = 2: (1,2) 6 + (2,1) 3 = 9 x S(4);
#   tp*cp = 4: (1,4) 6 + (2,2) 9 + (4,1) 3 = 18 x S(2); tp*cp = 8: (1,8) 6 + (2,4) 9 + (4,2) 9 + (8,1) 3 = 27 x S(1)
# -> 16 x (2 x 63 + 9 x 50 + 18 x 31 + 27 x 6) = 16 x 1,296 = 20,736 enumerated layouts.
TOY = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096",
       "--top", "3", "--json"]
ENUMERATED = 16 * (2 * 63 + 9 * 50 + 18 * 31 + 27 * 6)
# Rows without SP: one TP mode per point, so the weights are the CP counts alone:
# (1,1) 1; (1,2) 3 + (2,1) 1 = 4; (1,4) 3 + (2,2) 3 + (4,1) 1 = 7; (1,8), (2,4), (4,2) 3 each + (8,1) 1 = 10.
NO_SP = 16 * (63 + 4 * 50 + 7 * 31 + 10 * 6)
# Rows with TP overlap (tp > 1, one mode): (2,1) 1 x S(4); (2,2) 3 + (4,1) 1 = 4 x S(2); (2,4) 3 + (4,2) 3 + (8,1) 1 = 7 x S(1).
OVERLAP = 16 * (50 + 4 * 31 + 7 * 6)
# ... of which with cp > 1: (2,2) 3 x S(2); (2,4), (4,2) 3 each x S(1); a2a and allgather are 2 of each 3.
OVERLAP_CP_NOT_P2P = 16 * (3 * 31 + 6 * 6) * 2 // 3
# The default space (SpaceOptions(): no overlap, the ring only): 2 TP modes everywhere, one CP mode:
# 32 x (S(8) + 2 S(4) + 3 S(2) + 4 S(1)) = 32 x 280.
DEFAULT_SPACE = 32 * (63 + 2 * 50 + 3 * 31 + 4 * 6)


def _search(*extra: str) -> dict:
    out = runner.invoke(app, [*TOY, *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_product_factors_remove_their_exact_share():
    """zero is a whole factor of the enumeration (4 values), so ``--zero 1`` removes 3/4 of it;
    ``--sp`` then removes a quarter of the rows without SP (first failing constraint counts)."""
    doc = _search("--zero", "1", "--sp")
    assert doc["enumerated"] == ENUMERATED == 20736
    assert doc["constraints"] == {"--zero 1": ENUMERATED * 3 // 4, "--sp": NO_SP // 4}
    assert all(x["strategy"]["zero"] == 1 and x["strategy"]["sp"] for x in doc["layouts"])


def test_comm_fields_are_constraints():
    """``--tp-comm-overlap`` keeps the overlap rows; ``--cp-comm-type p2p`` then removes those of
    them with a2a or allgather."""
    doc = _search("--tp-comm-overlap", "--cp-comm-type", "p2p")
    assert doc["constraints"] == {"--tp-comm-overlap": ENUMERATED - OVERLAP, "--cp-comm-type p2p": OVERLAP_CP_NOT_P2P}
    assert all(x["strategy"]["tp_comm_overlap"] and x["strategy"]["cp_comm_type"] == "p2p" for x in doc["layouts"])
    doc = _search("--no-tp-comm-overlap", "--cp-comm-type", "a2a", "--tp", "2")
    assert all(not x["strategy"]["tp_comm_overlap"] and x["strategy"]["cp_comm_type"] == "a2a" for x in doc["layouts"])


def test_switches_leave_the_hand_counted_layouts():
    """tp 8 with pp 1 and cp 1 is one grid point; 32 layers on one stage give recompute none,
    selective, full and full on 8, 16, 24 layers (R = 6), with 3 TP modes: 6 x 16 x 3 = 288 layouts remain."""
    doc = _search("--tp", "8", "--no-pp", "--no-cp")
    assert sum(doc["constraints"].values()) == ENUMERATED - 288
    assert list(doc["constraints"]) == ["--tp 8", "--no-pp", "--no-cp"]
    assert sum(doc["rejected"].values()) + doc["out_of_memory"] <= 288
    assert {(x["strategy"]["tp"], x["strategy"]["pp"], x["strategy"]["cp"]) for x in doc["layouts"]} == {(8, 1, 1)}


def test_a_pinned_set_and_named_values():
    doc = _search("--pp", "1,2", "--recompute", "none,selective", "--schedule", "1f1b", "--no-fsdp")
    for x in doc["layouts"]:
        s = x["strategy"]
        assert s["pp"] in (1, 2) and s["recompute"] in ("none", "selective") and s["vpp"] == 1 and s["zero"] < 3


def test_mbs_outside_the_default_space_is_enumerated():
    """The default space has mbs 1, 2, 4, 8; a pinned 16 widens it (gbs 16, one data-parallel rank)."""
    gbs = TOY.index("--gbs")
    out = runner.invoke(app, [*TOY[:gbs], "--gbs", "16", *TOY[gbs + 2:], "--mbs", "16", "--dp", "1"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert {x["strategy"]["mbs"] for x in doc["layouts"]} == {16}


def test_apply_constraints_counts_each_row_once():
    """Four hand-made rows: tp 1/2/4/8 with pp 2/1/1/2. ``--tp 2,4`` removes rows 0 and 3;
    ``--no-pp`` would also remove them but counts only what is left (none)."""
    col = lambda *v: np.asarray(v, dtype=np.int64)  # noqa: E731
    batch = LayoutBatch(dp=col(1, 1, 1, 1), tp=col(1, 2, 4, 8), pp=col(2, 1, 1, 2), vpp=col(1, 1, 1, 1),
                        cp=col(1, 1, 1, 1), ep=col(1, 1, 1, 1), etp=col(1, 2, 4, 8), mbs=col(1, 1, 1, 1),
                        sp=np.zeros(4, bool), zero=col(0, 1, 2, 3), recompute=col(0, 0, 0, 0),
                        recompute_layers=col(0, 0, 0, 0), num_microbatches=col(1, 1, 1, 1))
    constraints = parse_constraints({"--tp": "2,4"}, {"--no-pp": True, "--no-fsdp": True})
    kept, removed = apply_constraints(batch, constraints)
    assert kept.tolist() == [False, True, True, False]
    assert removed == {"--tp 2,4": 2, "--no-pp": 0, "--no-fsdp": 0}


@pytest.mark.parametrize("args, message", [
    (["--tp", "0"], "--tp='0': must be an integer in 1..1048576"),
    (["--pp", "2,x"], "--pp='2,x': expected a whole number in the ASCII digits 0-9"),
    (["--zero", "4"], "--zero='4': must be an integer in 0..3"),
    (["--recompute", "partial"], "--recompute='partial': allowed none, selective, full"),
    (["--schedule", "zb"], "--schedule='zb': allowed 1f1b, interleaved"),
    (["--cp", "2", "--no-cp"], "--cp 2 with --no-cp: the switch leaves no value of --cp"),
    (["--tp", "3"], "the constraints leave none of the 20,736 layouts of llama3-8b on 8 devices (gbs=8); removed "
                    "by: --tp 3 (20,736); tp sizes divide the 8 devices: 1, 2, 4, 8"),
    (["--cp-comm-type", "ring"], "--cp-comm-type='ring': allowed p2p, a2a, allgather, a2a+p2p"),
])
def test_bad_constraints_get_one_error_line(args, message):
    out = runner.invoke(app, [*TOY, *args])
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.output


def test_parse_values_rejects_empty_items():
    with pytest.raises(AutoparError, match="--mbs"):
        parse_values(FIELD_BY_OPTION["--mbs"], "1,,2")


def test_summary_line_names_the_constraints():
    out = runner.invoke(app, [*TOY[:-1], "--zero", "1"])
    assert out.exit_code == 0, out.output
    assert f"removed by constraints: --zero 1 {ENUMERATED * 3 // 4:,} ({ENUMERATED * 3 // 4:,} in all)" in out.output


@settings(max_examples=40, deadline=None)
@given(tp=st.sets(st.sampled_from([1, 2, 4, 8]), min_size=1), pp=st.sets(st.sampled_from([1, 2, 4, 8]), min_size=1),
       zero=st.sets(st.integers(0, 3), min_size=1), no_cp=st.booleans(), no_vpp=st.booleans())
def test_constraints_partition_the_space(tp, pp, zero, no_cp, no_vpp):
    """Kept rows pass every constraint, every removed row fails the one it is counted under and
    no earlier one, and kept + removed = enumerated."""
    from autopar.cli.inputs import problem_from_options
    from autopar.space import enumerate_layouts

    batch = _toy_batch(problem_from_options, enumerate_layouts)
    constraints = parse_constraints({"--tp": ",".join(map(str, tp)), "--pp": ",".join(map(str, pp)),
                                     "--zero": ",".join(map(str, zero))}, {"--no-cp": no_cp, "--no-vpp": no_vpp})
    kept, removed = apply_constraints(batch, constraints)
    passes = [c.passes(batch) for c in constraints]
    assert np.array_equal(kept, np.logical_and.reduce(passes))
    for k, c in enumerate(constraints):
        first_fail = ~passes[k] & np.logical_and.reduce([np.ones(len(batch), bool), *passes[:k]])
        assert removed[c.text] == int(first_fail.sum())
    assert int(kept.sum()) + sum(removed.values()) == len(batch) == DEFAULT_SPACE


_BATCH: list = []


def _toy_batch(problem_from_options, enumerate_layouts) -> LayoutBatch:
    if not _BATCH:
        _BATCH.append(enumerate_layouts(problem_from_options("llama3-8b", "h100-80gb", 1, None, 8, 4096, *[None] * 9)))
    return _BATCH[0]


def test_a_constraint_the_space_was_built_with_says_why_it_removed_none():
    """--moe-dispatcher narrows the enumeration itself; its '0' had read as if the flag did nothing."""
    from autopar.report.table import search_summary
    from autopar.search import SearchResult

    result = SearchResult(layouts=[], enumerated=10, rejected={}, out_of_memory=0, marginal=0, search_time_s=0.1, global_batch_size=8,
                          constraints={"--moe-dispatcher alltoall": 0, "--zero 1": 4})
    text = search_summary(result)
    assert ("removed by constraints: --moe-dispatcher alltoall 0 (the space was enumerated with it: every layout "
            "has it), --zero 1 4 (4 in all)") in text
