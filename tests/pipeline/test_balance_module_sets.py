"""Selective recompute module sets (Megatron-LM's --recompute-modules) as balancer options:
``balance --options none,full,selective:core_attn+mlp`` adds a layer-table column per set."""

from __future__ import annotations

import json

import numpy as np
from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.pipeline.layers import layer_table
from autopar.strategy import Strategy


def test_a_module_set_column_is_the_cost_model_of_that_set():
    """The set core_attn (Megatron's default) is the 'selective' column itself; adding mlp keeps
    fewer activation bytes and re-runs more (a larger recompute time)."""
    p = make_problem("llama3-8b", gbs=64, seq=8192)
    table = layer_table(p, Strategy(dp=2, pp=4, zero=1), module_sets=(("core_attn",), ("core_attn", "mlp")))
    assert table.options == ("none", "selective", "full", "selective:core_attn", "selective:core_attn+mlp")
    for name in ("forward_s", "backward_s", "recompute_s", "activation_bytes", "stage_bytes"):
        column = getattr(table, name)
        assert np.array_equal(column[:, 1], column[:, 3]), name
    assert np.all(table.activation_bytes[:, 4] < table.activation_bytes[:, 3])
    assert np.all(table.recompute_s[:, 4] > table.recompute_s[:, 3])


def test_balance_reports_counts_per_module_set():
    out = CliRunner().invoke(app, ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1",
                                   "--pp", "4", "--gbs", "64", "--seq-len", "8192", "--memory-limit-gib", "30",
                                   "--options", "none,full,selective:core_attn+mlp", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    counts = doc["balanced"]["recompute_counts"]
    assert set(counts) == {"none", "selective", "full", "selective:core_attn+mlp"}
    assert sum(map(sum, counts["selective"])) == 0  # not among --options
    chosen = counts["selective:core_attn+mlp"]
    assert doc["sapp"]["select_recompute"] == [row[0] for row in chosen] and sum(map(sum, chosen)) > 0
