"""``autopar balance --json``: one document (schema_version 1, autopar/data/schemas/balance.schema.json) with the split, the SAPP arrays,
the Megatron layout, per-stage memory and times, and how it was solved."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.pipeline.layout import PipelineLayout
from autopar.schemas import schema_version
from json_schema_support import assert_valid

runner = CliRunner()
LAYER = {"forward_s": 0.01, "backward_s": 0.02, "static_bytes": 1e9, "activation_bytes": {"none": 2e9, "full": 1e8}}


def _balance_json(tmp_path, pp=4, vpp=1, layers=10, m=8, limit=2e10, extra=()) -> dict:
    path = tmp_path / "layers.json"
    path.write_text(json.dumps({"pp": pp, "vpp": vpp, "num_microbatches": m, "memory_limit_bytes": limit,
                                "layers": [LAYER] * layers}))
    out = runner.invoke(app, ["balance", "--layers", str(path), "--json", *extra])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)  # nothing but the document on stdout


def test_document_fields_and_types(tmp_path):
    doc = _balance_json(tmp_path)
    assert doc["schema_version"] == schema_version("balance") == 1 and doc["document"] == "balance"
    assert_valid("balance", doc)
    assert (doc["pp"], doc["vpp"], doc["schedule"], doc["num_microbatches"]) == (4, 1, "1f1b", 8)
    assert doc["memory_limit_bytes"] == 2e10
    solver = doc["solver"]
    assert set(solver) == {"name", "optimal", "mip_gap", "bound_s", "time_limit_hit", "time_limit_s",
                           "solve_time_s"}
    assert solver["name"] in ("highs", "scipy") and isinstance(solver["optimal"], bool)
    assert isinstance(solver["time_limit_hit"], bool) and solver["time_limit_s"] == 0.3
    assert solver["bound_s"] <= doc["balanced"]["objective_s"] * (1 + 1e-9)
    for part in ("balanced", "even"):
        cost = doc[part]
        assert set(cost) == {"layers_per_stage", "layers_per_chunk", "recompute", "recompute_counts",
                             "stage_memory_bytes", "stage_time_s", "step_time_s", "objective_s",
                             "bubble_fraction", "fits"}
        assert sum(cost["layers_per_stage"]) == 10 and len(cost["stage_memory_bytes"]) == 4
        assert set(cost["recompute_counts"]) == {"none", "full"}
        assert [sum(row) for row in cost["layers_per_chunk"]] == cost["layers_per_stage"]
    assert set(doc["sapp"]) == {"pipeline_stage", "pp_interleave_num", "offset", "recompute", "select_recompute"}
    assert sum(doc["sapp"]["offset"]) == 10 - 4 * (10 // 4)
    layout = PipelineLayout.parse(doc["megatron"]["pipeline_layout"], 4)
    assert list(layout.layers_per_stage) == doc["balanced"]["layers_per_stage"]


def test_memory_limit_forces_recompute_counts_in_the_document(tmp_path):
    """10 layers on pp 4 at 1 GB of states and 2 GB of activations each (0.1 GB with full
    recompute); 1F1B holds 4, 3, 2, 1 micro-batches. With a 12 GB limit rank 0 cannot hold a
    layer without recompute beside another (1 + 8 = 9 GB each), so it recomputes some, and the
    counts say how many; every stage fits."""
    doc = _balance_json(tmp_path, limit=12e9)
    balanced = doc["balanced"]
    assert balanced["fits"] and max(balanced["stage_memory_bytes"]) <= 12e9
    full = balanced["recompute_counts"]["full"]
    assert doc["sapp"]["recompute"] == [row[0] for row in full] and sum(doc["sapp"]["recompute"]) > 0
    assert doc["even"]["fits"] is False and doc["gain"] is None


def test_time_limit_option_is_reported_and_checked(tmp_path):
    doc = _balance_json(tmp_path, extra=["--time-limit", "5"])
    assert doc["solver"]["time_limit_s"] == 5.0
    path = tmp_path / "layers.json"
    out = runner.invoke(app, ["balance", "--layers", str(path), "--time-limit", "0"])
    assert out.exit_code == 2
    assert out.output.strip().splitlines() == [
        "error: --time-limit=0.0: must be a number of seconds in (0, 3600]"]


@pytest.mark.parametrize("vpp", [2])
def test_interleaved_document_has_chunk_shaped_arrays(tmp_path, vpp):
    doc = _balance_json(tmp_path, pp=2, vpp=vpp, layers=7, m=4)
    for key in ("offset", "recompute", "select_recompute"):
        assert len(doc["sapp"][key]) == vpp and all(len(row) == 2 for row in doc["sapp"][key])
    assert sum(map(sum, doc["sapp"]["offset"])) == 7 - 4 * (7 // 4)
