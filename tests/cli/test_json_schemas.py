"""Every ``--json`` document: the command's real output validates against its schema file, carries
its ``schema_version``, and is the only thing on stdout."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from json_schema_support import assert_valid
from typer.testing import CliRunner

from autopar.cli import app
from autopar.schemas import DOCUMENTS, schema, schema_version, versioned
from conftest import ROOT

runner = CliRunner()
TOY = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "16", "--seq-len", "2048"]


def _doc(args: list[str], name: str) -> dict:
    """Run ``autopar ARGS``, parse stdout alone as JSON and check it against schema ``name``."""
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema_version"] == schema_version(name) and doc["document"] == name
    assert_valid(name, doc)
    return doc


def test_every_schema_is_a_valid_draft_2020_12_schema_with_a_version():
    for name in ("common", *DOCUMENTS):
        jsonschema.Draft202012Validator.check_schema(schema(name))
    for name in DOCUMENTS:
        assert schema_version(name) == 1
        assert schema(name)["$id"] == f"{name}.schema.json"


def test_search_json_validates_and_gives_the_band():
    doc = _doc(["search", *TOY, "--top", "3", "--json"], "search")
    assert len(doc["layouts"]) == 3 and doc["layouts"][0]["rank_mark"] == "1"
    band = doc["certainty"]["step_time_band_pct"]
    first = doc["layouts"][0]
    low, high = first["step_time_range_s"]
    assert low == pytest.approx(first["step_time_s"] * (1 - band / 100))
    assert high == pytest.approx(first["step_time_s"] * (1 + band / 100))


def test_report_result_json_is_a_search_document(tmp_path):
    res = runner.invoke(app, ["search", *TOY, "--top", "2", "--report", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r" / "result.json").read_text())
    assert_valid("search", doc)
    assert doc["document"] == "search" and "certainty" in doc


def test_a_schema_rejects_what_it_does_not_describe():
    doc = _doc(["search", *TOY, "--top", "1", "--json"], "search")
    del doc["layouts"][0]["step_time_s"]
    with pytest.raises(AssertionError, match="step_time_s"):
        assert_valid("search", doc)
    with pytest.raises(AssertionError, match="schema_version"):
        assert_valid("search", {**doc, "schema_version": 99})


def test_search_sweep_estimate_devices_json_validate():
    sweep = _doc(["search", *TOY[:6], *TOY[8:], "--gbs-range", "8,16", "--json"], "search-sweep")
    assert [p["gbs"] for p in sweep["points"]] == [8, 16]
    est = _doc(["estimate", *TOY, "--tp", "2", "--json"], "estimate")
    assert est["strategy"]["tp"] == 2
    band = est["certainty"]["memory_band_pct"]
    assert est["peak_memory_range_bytes"][1] == pytest.approx(est["peak_memory_bytes"] * (1 + band / 100))
    devices = _doc(["devices", "--json"], "devices")
    assert "h100-80gb" in [d["name"] for d in devices["devices"]]


def test_layerwise_and_plan_json_validate(tmp_path):
    layerwise = _doc(["search", "--model", "llama2-7b", "--device", "a100-40gb", "--gbs", "64", "--seq-len", "4096",
                      "--layerwise", "--tp", "1", "--json"], "search-layerwise")
    assert set(layerwise["plan"]["tp"]) == {1} and sum(layerwise["plan"]["layers_per_stage"]) == 32
    plan = _doc(["plan", *TOY, "--out", str(tmp_path / "p"), "--profile", "off", "--json"], "plan")
    assert plan["profile_skipped"] == "--profile off" and not plan["profiled"]
    assert plan["written"][0] == str(tmp_path / "p" / "result.json")
    assert_valid("search", json.loads((tmp_path / "p" / "result.json").read_text()))


def test_export_json_holds_the_text_and_the_files(tmp_path):
    doc = _doc(["export", "--format", "megatron", *TOY, "--tp", "2", "--json"], "export")
    assert "--tensor-model-parallel-size 2" in doc["text"] and doc["files"] == []
    assert doc["layout"]["strategy"]["tp"] == 2
    out = tmp_path / "ds"
    doc = _doc(["export", "--format", "deepspeed", *TOY, "--tp", "2", "--out", str(out), "--json"], "export")
    assert len(doc["files"]) == 2  # the DeepSpeed JSON and the script that reads it
    for f in doc["files"]:
        assert open(f["path"]).read() == f["text"]


def test_export_from_refuses_another_document_or_version(tmp_path):
    doc = _doc(["search", *TOY, "--top", "1", "--json"], "search")
    args = ["export", "--format", "megatron", "--from"]
    for change, needle in (({"document": "verify"}, "document='verify'; expected a search result"),
                           ({"schema_version": 2}, "schema_version=2; this autopar reads search documents of version 1")):
        path = tmp_path / "r.json"
        path.write_text(json.dumps({**doc, **change}))
        res = runner.invoke(app, [*args, str(path)])
        assert res.exit_code == 2 and f"error: --from={str(path)!r}: {needle}" in res.output, res.output
    path.write_text(json.dumps(doc))
    assert runner.invoke(app, [*args, str(path)]).exit_code == 0


def test_validate_json(tmp_path):
    doc = _doc(["validate", "--out", str(tmp_path / "v"), "--json"], "validate")
    assert doc["rows"] == len(doc["results"]) and 0 < doc["scored"] <= doc["rows"]
    dense = next(s for s in doc["target_sets"] if s["set"] == "bf16/fp16 dense" and s["kind"] == "step_time")
    errors = [abs(r["error_pct"]) for r in doc["results"] if r["error_pct"] is not None]
    assert dense["rows"] <= len(errors)


def test_profile_ops_json(tmp_path):
    pytest.importorskip("torch")
    from test_profile import TINY

    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(TINY))
    common = ["--model", str(model), "--device", "h100-80gb", "--devices-per-node", "2", "--gbs", "4", "--seq-len", "64"]
    ops = _doc(["profile", "ops", "--db", str(tmp_path / "ops.db"), *common, "--tp", "2", "--repeats", "1", "--json"],
               "profile-ops")
    assert ops["shapes"] == 9 and len(ops["measured"]) == 9 and ops["already_measured"] == 0  # as test_profile


def test_profile_layer_json(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_profile_layer import CONFIGS

    model = tmp_path / "layer.json"
    model.write_text(json.dumps(CONFIGS["llama"]))
    layer = _doc(["profile", "layer", "--db", str(tmp_path / "l.db"), "--model", str(model), "--tp", "2",
                  "--mbs", "2", "--seq-len", "64", "--recompute", "none", "--hf", "--repeats", "1", "--json"],
                 "profile-layer")
    assert [r["recompute"] for r in layer["layers"]] == ["none"] and layer["shard"]["tp"] == 2


@pytest.mark.torchrun
def test_profile_comm_json_from_rank_0_only(tmp_path):
    pytest.importorskip("torch")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                          "autopar.profile", "comm", "--db", str(tmp_path / "c.db"), "--sizes", "65536,4194304,16777216",
                          "--repeats", "2", "--json"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)  # one document: the other rank prints nothing
    assert_valid("profile-comm", doc)
    assert {f["collective"] for f in doc["fits"]} >= {"all_reduce", "all_gather", "send_recv"}


def test_balance_json_validates():
    """The hook for ``balance --json`` (branch h/balancer): once the command has the option, its
    document must carry ``document`` and the schema's version (print it with
    ``autopar.cli.json_output.print_json("balance", plan_document(...))``)."""
    import typer.main

    balance = typer.main.get_command(app).commands["balance"]
    if not any("--json" in p.opts for p in balance.params):
        pytest.skip("balance --json is not on this branch yet (h/balancer adds it)")
    _doc(["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--pp", "2", "--json"], "balance")


def test_json_to_a_pipe_is_the_document_alone(tmp_path):
    """A real process with stdout a pipe: warnings and 'wrote ...' lines go to stderr."""
    run = subprocess.run([sys.executable, "-m", "autopar", "export", "--format", "deepspeed", *TOY, "--tp", "2",
                          "--out", str(tmp_path / "ds"), "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["document"] == "export" and "wrote" in run.stderr


def test_versioned_puts_the_version_first_and_refuses_unknown_documents():
    assert list(versioned("devices", {"devices": []})) == ["schema_version", "document", "devices"]
    with pytest.raises(KeyError):
        versioned("nope", {})


def test_docs_page_lists_every_document_and_field():
    """docs/reference/json.md is filled from the schema files by the docs hook."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "docs_generated", ROOT / "docs" / "hooks" / "generated.py")
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    text = generated.on_page_markdown("<!-- autopar-json-schemas -->")
    for name, command in DOCUMENTS.items():
        assert f"## {name}\n\n`{command}`, `schema_version` 1" in text
        for field in schema(name)["properties"]:
            assert f"| `{field}` |" in text, (name, field)
    assert "| `layouts` | array of [ranked_layout](#shared-ranked_layout) |" in text
    assert "### shared: ranked_layout" in text and "| `rank_mark` | string |" in text
