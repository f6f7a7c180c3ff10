"""torchtitan's V schedules (ZB-V, DualPipeV) as layout choices: the rules, the TOML, the other
writers' refusals, the costs on the V placement and the search for --target torchtitan."""

from __future__ import annotations

import pytest

from autopar.cost.stage import all_stages
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.export import WRITERS, torchtitan
from autopar.rules import check_strategy
from autopar.search import search
from autopar.search.constraints import parse_constraints
from autopar.specs import load_model
from autopar.strategy import Strategy
from conftest import make_problem

V = dict(dp=2, tp=8, sp=True, pp=4, vpp=2, zero=3)


@pytest.fixture(scope="module")
def llama70b():
    return make_problem("llama3-70b", nodes=8, gbs=512, seq=8192, framework="torchtitan")


@pytest.mark.parametrize("schedule,name", [("zbv", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_torchtitan_writes_the_schedule_and_ten_layers_per_stage(llama70b, schedule, name):
    doc = torchtitan.read(WRITERS["torchtitan"](llama70b, Strategy(**V, schedule=schedule)))
    par = doc["parallelism"]
    assert par["pipeline_parallel_schedule"] == name
    assert par["pipeline_parallel_layers_per_stage"] == 80 // 8  # 2 pp = 8 stages of 10 layers
    assert torchtitan.check(doc, 64, 80) == []


def test_async_tp_with_a_v_schedule_is_refused(llama70b):
    with pytest.raises(AutoparError, match="refuse compiled stage modules"):
        WRITERS["torchtitan"](llama70b, Strategy(**V, schedule="zbv", tp_comm_overlap=True))


def test_dualpipev_with_ep_turns_torchtitans_ep_overlap_off():
    """torchtitan 0.2.2 defaults pipeline_parallel_expert_parallel_overlap to true, which raises with
    activation checkpointing and is not costed: the export writes false."""
    model = load_model("deepseek-v3").model_copy(update={"num_layers": 64, "mtp_num_layers": 0})
    p = make_problem(model, nodes=64, gbs=1024, seq=4096, framework="torchtitan")
    s = Strategy(dp=32, tp=1, pp=16, vpp=2, ep=32, etp=1, zero=3, recompute="full", schedule="dualpipev")
    par = torchtitan.read(WRITERS["torchtitan"](p, s))["parallelism"]
    assert par["pipeline_parallel_expert_parallel_overlap"] is False


@pytest.mark.parametrize("fmt,words", [("megatron", "Megatron-LM main runs no-pipelining, 1F1B and interleaved"),
                                       ("megatron-bridge", "Megatron-Core's schedules"),
                                       ("deepspeed", "TrainSchedule"), ("galvatron", "pipedream_flush")])
def test_the_other_writers_refuse_with_their_reason(llama70b, fmt, words):
    with pytest.raises(AutoparError, match=f"--format {fmt} cannot express schedule=dualpipev") as err:
        WRITERS[fmt](llama70b, Strategy(**V, schedule="dualpipev"))
    assert words in str(err.value)


def test_rules():
    p = make_problem("llama3-70b", nodes=4, gbs=6, seq=8192)
    with pytest.raises(ValueError, match="exactly 2 model chunks"):
        Strategy(dp=1, tp=8, sp=True, pp=4, vpp=4, schedule="zbv")
    with pytest.raises(LayoutError, match="dualpipev_microbatches"):  # 6 micro-batches < 2 pp
        check_strategy(p, Strategy(dp=1, tp=8, sp=True, pp=4, vpp=2, schedule="dualpipev"))
    check_strategy(p, Strategy(dp=1, tp=8, sp=True, pp=4, vpp=2, schedule="zbv"))  # ZB-V: any m
    odd = make_problem("llama3-70b", nodes=6, gbs=48, seq=8192)  # pp 6: 80 layers over 12 chunks
    with pytest.raises(LayoutError, match="v_schedule_even_chunks"):
        check_strategy(odd, Strategy(dp=1, tp=8, sp=True, pp=6, vpp=2, schedule="zbv"))


def test_the_v_placement_puts_the_loss_and_memory_on_rank_0(llama70b):
    """Rank 0 holds virtual stages 0 and 2pp-1: the embedding and the output layer. ZB-V holds pp
    micro-batches of a rank's layers on every rank (1F1B's rank-0 peak), DualPipeV pp + 1/2."""
    for schedule, in_flight in (("zbv", [4.0] * 4), ("dualpipev", [4.5] * 4)):
        batch, stages = all_stages(llama70b, Strategy(**V, schedule=schedule))
        assert stages.is_last(batch).tolist() == [True, False, False, False]
        assert stages.in_flight.tolist() == in_flight
    e = {name: estimate(llama70b, Strategy(**V, schedule=name)) for name in ("interleaved", "zbv", "dualpipev")}
    act = {name: [m.activations_bytes for m in est.memory_per_stage] for name, est in e.items()}
    other = {name: [m.other_bytes for m in est.memory_per_stage] for name, est in e.items()}
    for name in ("zbv", "dualpipev"):  # equal counts in flight; rank 0 adds the logits, ranks 1..3 alike
        assert act[name][0] > act[name][1] == act[name][2] == act[name][3]
        assert other[name][0] > other[name][3] == other[name][1]  # output layer on rank 0, not pp-1
    assert other["interleaved"][3] > other["interleaved"][1]
    assert act["interleaved"][0] > act["zbv"][0]  # 1 + (pp-1)/(pp vpp) x pp micro-batches vs pp
    assert e["zbv"].time_breakdown_s["pp_bubble"] < e["interleaved"].time_breakdown_s["pp_bubble"]


def test_search_offers_them_for_torchtitan_only(llama70b):
    pins = parse_constraints({"--schedule": "zbv,dualpipev"}, {})
    result = search(llama70b, top_k=5, target="torchtitan", constraints=pins)
    assert {e.strategy.schedule for e in result.layouts} <= {"zbv", "dualpipev"} and result.layouts
    assert all(e.strategy.vpp == 2 and not e.strategy.tp_comm_overlap for e in result.layouts)
    with pytest.raises(AutoparError, match="constraints leave none"):
        search(llama70b, top_k=5, target="megatron", constraints=pins)
