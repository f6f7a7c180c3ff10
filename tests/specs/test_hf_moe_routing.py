"""Group-limited routing read from a Hugging Face MoE config."""

from __future__ import annotations

import json

import pytest

from autopar.errors import AutoparError
from autopar.specs.hf import model_from_hf_dict
from conftest import MODELS


def _deepseek_config(**over) -> dict:
    raw = json.loads((MODELS / "deepseek-v3.json").read_text())
    raw.update(over)
    return raw


def test_group_routing_read_from_the_hf_config():
    """n_group / topk_group / routed_scaling_factor, with transformers' DeepseekV3Config defaults
    (8, 4, 2.5) when absent; greedy routing or one group is not group-limited; groups that do not
    split the experts or cannot hold top-k experts are one error line."""
    m = model_from_hf_dict(_deepseek_config(n_group=16, topk_group=2, routed_scaling_factor=1.5), "x")
    assert (m.router_num_groups, m.router_group_topk, m.router_topk_scaling_factor) == (16, 2, 1.5)
    raw = _deepseek_config()
    del raw["n_group"], raw["topk_group"]
    m = model_from_hf_dict(raw, "x")
    assert (m.router_num_groups, m.router_group_topk, m.router_topk_scaling_factor) == (8, 4, 2.5)
    assert model_from_hf_dict(_deepseek_config(topk_method="greedy"), "x").router_num_groups == 0
    assert model_from_hf_dict(_deepseek_config(n_group=1, topk_group=1), "x").router_num_groups == 0
    with pytest.raises(AutoparError, match="n_group=7 with topk_group=4"):
        model_from_hf_dict(_deepseek_config(n_group=7), "x")  # 256 experts in 7 groups
    with pytest.raises(AutoparError, match="n_group=64 with topk_group=1"):  # top 1 of 64 groups holds 4 < 8 experts
        model_from_hf_dict(_deepseek_config(n_group=64, topk_group=1), "x")
