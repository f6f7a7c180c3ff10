"""Search results carry their problem (``"problem"`` in the search JSON) and ``export --from``
refuses a command line that describes another one (issue 14 item 5)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.problem_record import device_sha256, model_sha256, problem_from_record, problem_record
from autopar.search.grid import for_target
from autopar.specs import load_device, load_model
from conftest import SCRIPTS, make_problem

runner = CliRunner()
BASE = ["-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "128", "--seq-len", "8192"]


@pytest.fixture(scope="module")
def result_path(tmp_path_factory):
    out = runner.invoke(app, ["search", *BASE, "--top", "2", "--json"])
    assert out.exit_code == 0, out.output
    path = tmp_path_factory.mktemp("r") / "r.json"
    path.write_text(out.stdout)
    return path


def _error(args: list[str]) -> str:
    out = runner.invoke(app, args)
    err = out.stderr.strip()
    assert out.exit_code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (out.output, err)
    return err


def test_search_json_records_the_problem(result_path):
    rec = json.loads(result_path.read_text())["problem"]
    assert rec["model"]["name"] == "llama3-8b" and rec["model"]["config"]["num_layers"] == 32
    assert rec["model"]["sha256"] == model_sha256(load_model("llama3-8b"))
    assert rec["device"]["name"] == "h100-80gb" and rec["device"]["sha256"] == device_sha256(load_device("h100-80gb"))
    assert rec["cluster"] == {"nodes": 1, "devices_per_node": 8}
    train = rec["train"]
    assert (train["global_batch_size"], train["seq_len"], train["precision"]) == (128, 8192, "bf16")
    assert train["flash_attention"] is True and train["make_vocab_size_divisible_by"] == 128


def test_hashes_ignore_names_and_see_every_number():
    m = load_model("llama3-8b")
    assert model_sha256(m.model_copy(update={"name": "my-llama"})) == model_sha256(m)
    assert model_sha256(m.model_copy(update={"vocab_size": 128000})) != model_sha256(m)
    d = load_device("h100-80gb")
    assert device_sha256(d.model_copy(update={"name": "x", "description": "y"})) == device_sha256(d)
    assert device_sha256(load_device("h100-80gb", overrides=["memory_bytes=96e9"])) != device_sha256(d)


@settings(max_examples=25, deadline=None)
@given(seq=st.integers(1, 2**17), gbs=st.integers(1, 2**20), precision=st.sampled_from(["bf16", "fp16", "fp8"]),
       target=st.sampled_from(["megatron", "torchtitan", "deepspeed"]))
def test_record_round_trips_through_json(seq, gbs, precision, target):
    """What export reads back is the problem searched, less what the target format sets."""
    p = make_problem("mixtral-8x7b", nodes=2, gbs=gbs, seq=seq, precision=precision, moe_token_imbalance=1.25)
    back = problem_from_record(json.loads(json.dumps(problem_record(for_target(p, target)))), "r.json")
    assert back == p


def test_export_without_problem_options_uses_the_results(result_path):
    bare = runner.invoke(app, ["export", "--format", "megatron", "--from", str(result_path)])
    full = runner.invoke(app, ["export", "--format", "megatron", "--from", str(result_path), *BASE, "--nodes", "1"])
    assert bare.exit_code == 0 and full.exit_code == 0, (bare.output, full.output)
    assert bare.stdout == full.stdout and "--seq-length 8192" in bare.stdout


@pytest.mark.parametrize("extra, needle", [
    (["--seq-len", "4096"], "--seq-len=4096: the result at '{p}' was searched with --seq-len=8192"),
    (["--precision", "fp8"], "--precision='fp8': the result at '{p}' was searched with --precision='bf16'"),
    (["--gbs", "256"], "--gbs=256: the result at '{p}' was searched with --gbs=128"),
    (["--nodes", "2"], "--nodes=2: the result at '{p}' was searched with --nodes=1"),
    (["--no-flash-attention"], "--flash-attention=False: the result at '{p}' was searched with --flash-attention=True"),
    (["-m", "llama3-70b"], "--model='llama3-70b': model llama3-70b (config sha256 "),
    (["--vocab-size", "32000"], "--vocab-size=32000: model llama3-8b (config sha256 "),
    (["--device", "h100-80gb", "--device-set", "memory_bytes=96e9"],
     "--device='h100-80gb' --device-set memory_bytes=96e9: device h100-80gb (sha256 "),
    (["--device", "a100-80gb"], "--device='a100-80gb': device a100-80gb (sha256 "),
])
def test_export_refuses_a_mismatch_naming_the_option(result_path, extra, needle):
    err = _error(["export", "--format", "megatron", "--from", str(result_path), *extra])
    assert needle.format(p=result_path) in err


def test_a_scripts_values_count_as_given(tmp_path):
    """The llama2-7b script sets --seq-length 4096; a result searched at 2048 is another problem."""
    script = str(SCRIPTS / "pretrain_llama2_7b.sh")
    out = runner.invoke(app, ["search", "--script", script, "--device", "a100-80gb", "--vocab-size", "32000", "--seq-len", "2048",
                              "--top", "1",
                              "--json"])
    assert out.exit_code == 0, out.output
    path = tmp_path / "r.json"
    path.write_text(out.stdout)
    err = _error(["export", "--format", "megatron", "--from", str(path), "--script", script, "--vocab-size", "32000"])
    assert f"--seq-len=4096 (from --script {script!r}): the result at '{path}' was searched with --seq-len=2048" in err
    ok = runner.invoke(app, ["export", "--format", "megatron", "--from", str(path), "--script", script,
                             "--vocab-size", "32000", "--seq-len", "2048"])
    assert ok.exit_code == 0, ok.output


def test_old_and_edited_results_are_refused(result_path, tmp_path):
    doc = json.loads(result_path.read_text())
    old = {k: v for k, v in doc.items() if k != "problem"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert "the result has no 'problem' record" in _error(["export", "--format", "megatron", "--from", str(path), *BASE])
    edited = copy.deepcopy(doc)
    edited["problem"]["model"]["config"]["num_layers"] = 16
    path.write_text(json.dumps(edited))
    assert "problem.model.sha256 does not match its fields" in _error(
        ["export", "--format", "megatron", "--from", str(path)])
    edited = copy.deepcopy(doc)
    edited["problem"]["train"]["seq_len"] = "long"
    path.write_text(json.dumps(edited))
    assert "problem.seq_len='long'" in _error(["export", "--format", "megatron", "--from", str(path)])


def test_the_export_format_sets_the_framework(tmp_path):
    """A torchtitan-target result exported for Megatron-LM is costed and checked as Megatron-LM."""
    from autopar.export.result import result_problem

    out = runner.invoke(app, ["search", *BASE, "--target", "torchtitan", "--top", "1", "--json"])
    path = tmp_path / "r.json"
    path.write_text(out.stdout)
    assert json.loads(out.stdout)["problem"]["train"]["framework"] == "torchtitan"
    p = result_problem(str(path))
    assert p.train.framework == "megatron" and p.train.tp_backward_overlap is True
    assert for_target(p, "torchtitan").train.framework == "torchtitan"


def test_a_record_written_before_a_field_was_added_still_verifies():
    """A search JSON written before ModelSpec.dropout_rates existed has no such key in its config;
    it reads back at the default, and the hash leaves a later field out at its default, so the
    record verifies (it was refused as 'edited by hand?'); stated rates do change the hash."""
    p = make_problem("llama3-8b")
    record = problem_record(p)
    del record["model"]["config"]["dropout_rates"]
    assert problem_from_record(record, "old.json").model == p.model
    with_rates = p.model.model_copy(update={"dropout": True, "dropout_rates": (0.05, 0.02)})
    assert model_sha256(with_rates) != model_sha256(with_rates.model_copy(update={"dropout_rates": None}))
