"""Every pipelined layout of the search JSON says its split: ``layers_per_stage`` holds the stage
sums of a flexible ``pipeline_layout`` (DeepSeek-V3's 61 layers + MTP over pp 16 x vpp 2), and a
result read back (``export --from``) takes the layout string, not the sums."""

from __future__ import annotations

import json

from autopar.estimate import estimate
from autopar.export.result import strategy_from_result
from autopar.pipeline.layout import layout_of
from autopar.search import search
from autopar.search.constraints import parse_constraints
from autopar.strategy import Strategy
from conftest import make_problem


def test_deepseek_v3_vpp2_layouts_list_their_split(tmp_path):
    p = make_problem("deepseek-v3", nodes=128, gbs=4096, seq=4096)
    result = search(p, top_k=3, constraints=parse_constraints({"--pp": "16", "--vpp": "2"}, {}))
    layouts = [e.to_dict(p.train.global_batch_size)["strategy"] for e in result.layouts]
    assert layouts and all(s["pipeline_layout"] for s in layouts)
    for s, e in zip(layouts, result.layouts):
        split = s["layers_per_stage"]
        assert len(split) == 16 and sum(split) == 61  # every decoder layer, per rank
        assert split == list(layout_of(p, e.strategy).layers_per_stage)
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"layouts": [{"strategy": s} for s in layouts]}))
    back = strategy_from_result(str(path), 1, p)
    assert back.pipeline_layout == layouts[0]["pipeline_layout"] and back.layers_per_stage is None


def test_an_even_split_and_one_stage_are_unchanged():
    p = make_problem("llama3-70b", nodes=4, gbs=64, seq=8192)
    assert estimate(p, Strategy(dp=1, tp=8, sp=True, pp=4)).to_dict(64)["strategy"]["layers_per_stage"] == [20] * 4
    assert estimate(p, Strategy(dp=4, tp=8, sp=True, zero=1)).to_dict(64)["strategy"]["layers_per_stage"] == [80]
