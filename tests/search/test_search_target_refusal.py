"""A target whose writer refuses the problem whatever the layout is refused before any costing
(autopar.search.grid._refuse_target, autopar.export.PROBLEM_CHECKS), with the writer's reason;
the writers keep refusing the same problems one layout at a time."""

from __future__ import annotations

import pytest

from autopar.errors import AutoparError
from autopar.export import PROBLEM_CHECKS, WRITERS
from autopar.search import grid
from autopar.strategy import Strategy
from conftest import make_problem


def _no_costing(*args, **kwargs):
    raise AssertionError("a refused target must not reach the costing")


def test_bridge_without_a_recipe_is_refused_before_costing(monkeypatch):
    monkeypatch.setattr(grid, "stream_costs", _no_costing)
    p = make_problem("mixtral-8x7b", gbs=64, seq=4096)
    with pytest.raises(AutoparError, match="Megatron-Bridge: no pretrain recipe builds model mixtral-8x7b"):
        grid.search(p, target="megatron-bridge")


def test_fp8_param_storage_the_bridge_recipe_does_not_set_is_refused_before_costing(monkeypatch):
    """Bridge's delayed-scaling recipe gathers fp8 parameters (fp8_param_gather=True): a plan
    that says no fp8 parameter storage cannot be written for any layout (not saying takes the recipe's)."""
    monkeypatch.setattr(grid, "stream_costs", _no_costing)
    p = make_problem("llama3-8b", gbs=64, seq=4096, precision="fp8", fp8_recipe="delayed", fp8_param_storage=False)
    with pytest.raises(AutoparError, match=r"^no layout can be written for --target megatron-bridge: .*"
                                           "fp8_param_gather=True"):
        grid.search(p, target="megatron-bridge")


@pytest.mark.parametrize("fmt", sorted(PROBLEM_CHECKS))
def test_problem_checks_refuse_what_the_writer_refuses(fmt):
    """Every format has a problem check, and a problem it refuses is refused by its writer too."""
    assert set(PROBLEM_CHECKS) == set(WRITERS)
    p = make_problem("gpt-oss-20b", gbs=64, seq=4096)  # sliding-window layers and attention sinks
    s = Strategy(dp=8, tp=1, pp=1, mbs=1)
    try:
        PROBLEM_CHECKS[fmt](p)
    except AutoparError as err:
        with pytest.raises(AutoparError, match=str(err)[:40]):
            WRITERS[fmt](p, s)
