"""DeepEP/HybridEP where they run (NVIDIA; DeepEP at etp*ep > 1) and the flex dispatchers without the
EP overlap when the user switches it off (autopar.rules_moe, autopar.search.constraints.widen_space)."""

from __future__ import annotations

import pytest
from conftest import make_problem

from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.search import search
from autopar.search.constraints import parse_constraints
from autopar.strategy import Strategy


def test_deepep_needs_more_than_one_rank_in_its_group():
    """token_dispatcher.py: 'DeepEP dispatcher requires TPxEP > 1' (it had been costed and exported)."""
    p = make_problem("mixtral-8x7b", nodes=2)
    with pytest.raises(AutoparError, match=r"deepep_needs_tp_ep: moe_dispatcher=deepep with etp=1, ep=1"):
        estimate(p, Strategy(dp=16, ep=1, moe_dispatcher="deepep", zero=3, recompute="full"))


def test_deepep_and_hybridep_are_nvidia_only():
    p = make_problem("mixtral-8x7b", device="mi300x", nodes=2)
    with pytest.raises(AutoparError, match=r"flex_needs_nvidia: moe_dispatcher=deepep on mi300x"):
        estimate(p, Strategy(dp=16, ep=8, moe_dispatcher="deepep"))
    best = search(p, top_k=20, target="megatron").layouts
    assert best and all(e.strategy.moe_dispatcher == "alltoall" for e in best)  # it had offered deepep


def test_switching_the_ep_overlap_off_searches_the_flex_dispatcher_without_it():
    """--moe-dispatcher hybridep --no-moe-ep-overlap: the space had paired hybridep with the overlap
    only, so the constraint left pp2 without vpp (11.09 s) where pp2x8 without the overlap is 10.90 s."""
    p = make_problem("mixtral-8x7b", nodes=2, gbs=256)
    constraints = parse_constraints({"--moe-dispatcher": "hybridep", "--moe-ep-overlap": "off"}, {})
    best = search(p, top_k=1, target="megatron", constraints=constraints).layouts[0]
    s = best.strategy
    assert (s.moe_dispatcher, s.moe_ep_overlap, s.pp, s.vpp) == ("hybridep", False, 2, 8)
    assert best.step_time_s == pytest.approx(10.90, abs=0.01)


def _explain_rank(label: str) -> dict:
    import json

    from typer.testing import CliRunner

    from autopar.cli import app

    out = CliRunner().invoke(app, ["search", "-m", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "2", "--gbs",
                                   "256", "--top", "1", "--json", "--explain", label])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["explain"]


def test_explain_ranks_a_pinned_dispatcher_among_the_others():
    """--explain ep=8,moe_dispatcher=alltoall had re-enumerated alltoall alone and called it #1 (the
    table's deepep rows were missing); a flex dispatcher without the overlap was 'not enumerated'."""
    alltoall = _explain_rank("ep=8,moe_dispatcher=alltoall")
    assert alltoall["rank"] > 1
    deepep_off = _explain_rank("tp1 pp2x8 cp2:allgather dp4 ep8/etp1:deepep")
    assert deepep_off["rank"] > alltoall["rank"] and deepep_off["estimate"]["strategy"]["moe_ep_overlap"] is False
