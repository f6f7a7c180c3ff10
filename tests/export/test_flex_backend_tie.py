"""deepep and hybridep on an 8-GPU NVLink domain (issue 19 item 1): autopar costs them the same
there (both forward within the node at DeepEP's measured fractions), so the search offers one of
them, the one the target's recipe runs on the device, and says so, instead of breaking an exact
tie by row order."""

from __future__ import annotations

from conftest import make_problem

from autopar.cost.moe_dispatch import pass_comm_s
from autopar.export.comm_knobs import flex_backends_tie, flex_tie_note, preferred_flex
from autopar.layout_batch import LayoutBatch
from autopar.search.grid import for_search
from autopar.space import SpaceOptions
from autopar.strategy import Strategy


def _dispatch_s(p, dispatcher: str) -> float:
    s = Strategy(dp=4, tp=1, pp=1, ep=16, mbs=1, moe_dispatcher=dispatcher)
    return float(pass_comm_s(p, LayoutBatch.from_strategy(s, p.train.global_batch_size))[0])


def test_deepep_and_hybridep_cost_the_same_on_eight_gpu_nodes():
    p = make_problem("deepseek-v3", nodes=2)
    assert flex_backends_tie(p)
    assert _dispatch_s(p, "deepep") == _dispatch_s(p, "hybridep") > 0


def test_the_search_offers_the_recipe_backend_on_h100():
    """Megatron-Bridge's DeepSeek-V3 recipe (deepseek/h100/deepseek_v3.py) runs hybridep on H100,
    Qwen3-235B-A22B's deepep; --target megatron has no recipe: DeepEP's."""
    dsv3 = make_problem("deepseek-v3", nodes=32)
    assert for_search(dsv3, "megatron-bridge", SpaceOptions())[1].moe_dispatchers == ("alltoall", "hybridep")
    qwen = make_problem("qwen3-235b-a22b", nodes=32)
    assert for_search(qwen, "megatron-bridge", SpaceOptions())[1].moe_dispatchers == ("alltoall", "deepep")
    assert for_search(dsv3, "megatron", SpaceOptions())[1].moe_dispatchers == ("alltoall", "deepep")
    assert preferred_flex(dsv3, "megatron-bridge")[0] == "hybridep"


def test_the_note_names_the_backend_and_the_recipe():
    note = flex_tie_note(make_problem("deepseek-v3", nodes=32), "megatron-bridge")
    assert "the search offers hybridep, the one Megatron-Bridge's deepseek-v3 recipe runs on h100-80gb" in note
    assert "--moe-dispatcher deepep (or alltoall" in note
    assert flex_tie_note(make_problem("llama3-8b"), "megatron") is None  # dense: no dispatcher
    assert flex_tie_note(make_problem("deepseek-v3", nodes=32), "mindspeed") is None  # no MoE choice there
