"""The command line: exit codes, one-line errors, JSON schema, the main job end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from conftest import MODELS

runner = CliRunner()
MAIN_JOB = ["search", "--model", str(MODELS / "llama3-70b.json"), "--device", "h100-80gb",
            "--nodes", "8", "--devices-per-node", "8", "--gbs", "1024", "--seq-len", "8192", "--top", "10"]
LAYOUT_KEYS = {"strategy", "step_time_s", "tokens_per_s_per_device", "mfu", "peak_memory_bytes",
               "device_memory_bytes", "fits", "marginal", "memory_per_stage", "time_breakdown_s"}
STRATEGY_KEYS = {"dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "gbs", "num_microbatches", "zero", "sp",
                 "recompute", "recompute_layers", "schedule", "layers_per_stage"}
STAGE_KEYS = {"stage", "layers", "params", "weights_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
              "other_bytes", "total_bytes"}
TIME_KEYS = {"compute", "tp_comm", "cp_comm", "ep_comm", "pp_bubble", "pp_comm", "dp_comm", "optimizer"}


def test_main_job_table_and_megatron_args():
    result = runner.invoke(app, MAIN_JOB)
    assert result.exit_code == 0, result.output
    assert "Best layouts" in result.output and "--tensor-model-parallel-size" in result.output
    assert result.output.count("\n│ ") >= 10  # ten ranked rows


def test_search_json_schema():
    result = runner.invoke(app, MAIN_JOB + ["--json"])
    doc = json.loads(result.stdout)
    assert {"layouts", "enumerated", "rejected", "out_of_memory", "search_time_s", "megatron_args"} <= set(doc)
    assert len(doc["layouts"]) == 10
    for layout in doc["layouts"]:
        assert LAYOUT_KEYS <= set(layout) and STRATEGY_KEYS <= set(layout["strategy"])
        assert set(layout["time_breakdown_s"]) == TIME_KEYS
        assert all(STAGE_KEYS <= set(stage) for stage in layout["memory_per_stage"])
        assert layout["fits"]
    steps = [x["step_time_s"] for x in doc["layouts"] if not x["marginal"]]
    assert steps == sorted(steps)
    assert sum(doc["rejected"].values()) + doc["out_of_memory"] <= doc["enumerated"]


def test_estimate_json_matches_search_row():
    doc = json.loads(runner.invoke(app, MAIN_JOB[:-2] + ["--json", "--top", "1"]).stdout)
    best = doc["layouts"][0]["strategy"]
    args = ["estimate", *MAIN_JOB[1:-2], "--json", "--tp", str(best["tp"]), "--pp", str(best["pp"]),
            "--cp", str(best["cp"]), "--vpp", str(best["vpp"]), "--mbs", str(best["mbs"]),
            "--zero", str(best["zero"]), "--recompute", best["recompute"],
            "--sp" if best["sp"] else "--no-sp", "--cp-comm-type", best["cp_comm_type"],
            "--tp-comm-overlap" if best["tp_comm_overlap"] else "--no-tp-comm-overlap"]
    if best["recompute_layers"]:
        args += ["--recompute-layers", str(best["recompute_layers"])]
    est = json.loads(runner.invoke(app, args).stdout)
    assert est["step_time_s"] == pytest.approx(doc["layouts"][0]["step_time_s"])
    assert est["peak_memory_bytes"] == pytest.approx(doc["layouts"][0]["peak_memory_bytes"])


def test_estimate_tables():
    result = runner.invoke(app, ["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--tp", "2", "--pp", "2",
                                 "--sp", "--recompute", "selective", "--gbs", "64"])
    assert result.exit_code == 0, result.output
    assert "Memory per device by pipeline stage" in result.output and "Step time breakdown" in result.output


def test_devices_lists_every_preset():
    result = runner.invoke(app, ["devices"])
    for name in ["a100-40gb", "a100-80gb", "h100-80gb", "h200", "b200", "gb200", "ascend-910b"]:
        assert name in result.output


@pytest.mark.parametrize("args, needle", [
    (["search", "-m", "nope.json", "--device", "h100-80gb"], "does not exist"),
    (["search", "-m", "llama3-8b", "--device", "v100"], "unknown device"),
    (["search", "-m", "llama3-8b", "--device", "h100-80gb", "--nodes", "0"], "--nodes=0"),
    (["search", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "-4"], "--gbs=-4"),
    (["search", "-m", "llama3-8b", "--device", "a100-80gb", "--precision", "fp8"], "no fp8 peak"),
    (["search", "-m", "llama3.1-405b", "--device", "a100-40gb", "--devices-per-node", "1"], "no layout fits"),
    (["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--tp", "16"],
     "num_key_value_heads=8"),
    (["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--tp", "3"], "does not divide the world size"),
    (["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--recompute", "some"], "--recompute='some'"),
    (["estimate", "-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "12", "--mbs", "4"], "gbs_divisible"),
])
def test_bad_input_is_one_line_and_exit_code_2(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_malformed_and_unsatisfiable_configs(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    result = runner.invoke(app, ["search", "-m", str(broken), "--device", "h100-80gb"])
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 1,
                                "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 100}))
    result = runner.invoke(app, ["search", "-m", str(tiny), "--device", "h100-80gb", "--devices-per-node", "4",
                                 "--gbs", "3", "--seq-len", "7"])
    assert result.exit_code == 2 and "no valid layout" in result.stderr and "gbs_divisible" in result.stderr


@pytest.mark.parametrize("args, needle", [
    (["search", "--model", "llama3-8b", "--gbs", "1.5"], "--gbs='1.5': expected a whole number in the ASCII digits"),
    (["search", "--model", "llama3-8b", "--gbs", "abc"], "--gbs='abc': expected a whole number"),
    (["search", "--modle", "llama3-8b"], "No such option: --modle"),
    (["estimate", "--model", "llama3-8b", "--tp"], "Option '--tp' requires an argument"),
])
def test_usage_errors_are_one_line_through_the_entry_point(monkeypatch, capsys, args, needle):
    """The console script (``autopar.cli:main``) turns typer's boxed usage errors into one line."""
    from autopar.cli import main

    monkeypatch.setattr("sys.argv", ["autopar", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert err.startswith("error: ") and needle in err and "\n" not in err and "╭" not in err


@pytest.mark.parametrize("module, usage", [("autopar", "Usage: python -m autopar "),
                                           ("autopar.profile", "Usage: autopar profile ")])
def test_python_dash_m_runs_the_cli_with_one_line_errors(module, usage):
    """``python -m autopar`` and ``python -m autopar.profile`` are the CLI: help prints the
    usage, a missing required option is one ``error:`` line with exit code 2."""
    run = [sys.executable, "-m", module]
    shown = subprocess.run([*run, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and usage in shown.stdout
    bad = subprocess.run([*run, *(["search"] if module == "autopar" else ["ops"])], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1


def test_vocab_size_replaces_the_models_vocabulary():
    """--vocab-size with --model changes the parameter count by (V' - V) x hidden x 2 (untied
    Llama-3-8B: embedding and output layer), not silently ignored."""
    base = ["estimate", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--json"]
    params = [json.loads(runner.invoke(app, base + extra).stdout)["memory_per_stage"][0]["params"]
              for extra in ([], ["--vocab-size", "32000"])]
    assert params[0] - params[1] == (128256 - 32000) * 4096 * 2


QWEN_EP8 = ["--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096", "--ep", "8"]
LLAMA_FP8 = ["--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096", "--dp", "8",
             "--precision", "fp8"]


def _api_estimate(model: str, strategy, **train):
    from autopar.estimate import estimate
    from conftest import make_problem

    return estimate(make_problem(model, gbs=64, seq=4096, **train), strategy)


def test_moe_token_imbalance_flag_reaches_the_cost_model():
    from autopar.strategy import Strategy

    out = runner.invoke(app, ["estimate", *QWEN_EP8, "--moe-token-imbalance", "1.5", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    api = _api_estimate("qwen3-30b-a3b", Strategy(dp=8, ep=8), moe_token_imbalance=1.5)
    balanced = _api_estimate("qwen3-30b-a3b", Strategy(dp=8, ep=8))
    assert doc["step_time_s"] == pytest.approx(api.step_time_s)
    assert doc["peak_memory_bytes"] == pytest.approx(api.peak_memory_bytes)
    assert api.peak_memory_bytes > balanced.peak_memory_bytes


@pytest.mark.parametrize("value", ["0.5", "nan", "inf"])
def test_bad_moe_token_imbalance_is_one_line(value):
    out = runner.invoke(app, ["search", *QWEN_EP8[:-2], "--moe-token-imbalance", value])
    assert out.exit_code == 2
    assert out.output.strip().splitlines() == [
        f"error: --moe-token-imbalance={float(value)}: must be a number in 1..1000 (1 = balanced routing; "
        "the capacity factor with token dropping/padding)"]


def test_fp8_param_storage_flag_drops_the_weight_copy_and_exports_fp8_param_gather():
    from autopar.strategy import Strategy

    out = runner.invoke(app, ["estimate", *LLAMA_FP8, "--fp8-param-storage", "--json"])
    assert out.exit_code == 0, out.output
    api = _api_estimate("llama3-8b", Strategy(dp=8), precision="fp8", fp8_param_storage=True)
    copy = _api_estimate("llama3-8b", Strategy(dp=8), precision="fp8")
    assert json.loads(out.stdout)["peak_memory_bytes"] == pytest.approx(api.peak_memory_bytes)
    # Without the copy: 2 B per linear weight less (llama3-8b: 6.98e9 linear parameters, dp 8, tp 1).
    assert copy.peak_memory_bytes - api.peak_memory_bytes == pytest.approx(2 * 32 * (
        4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336))
    script = runner.invoke(app, ["export", "--format", "megatron", *LLAMA_FP8, "--fp8-param-storage"])
    assert script.exit_code == 0 and "--fp8-format hybrid --fp8-recipe delayed \\\n    --fp8-param-gather \\\n" in script.stdout
    plain = runner.invoke(app, ["export", "--format", "megatron", *LLAMA_FP8])
    assert plain.exit_code == 0 and "--fp8-param-gather" not in plain.stdout


@pytest.mark.parametrize("extra, message", [
    (["--precision", "bf16"], "error: --fp8-param-storage with --precision=bf16: fp8 parameter storage needs "
                              "--precision fp8"),
    (["--zero", "0"], "error: invalid layout: fp8_param_gather_needs_sharding: fp8 parameter storage "
                      "(--fp8-param-gather) with zero=0: Megatron-LM asserts"),
])
def test_fp8_param_storage_refusals_are_one_line(extra, message):
    base = LLAMA_FP8[:-2] if extra[0] == "--precision" else LLAMA_FP8  # an option is given once
    out = runner.invoke(app, ["export", "--format", "megatron", *base, "--fp8-param-storage", *extra])
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)


def test_tp_not_dividing_the_world_names_the_options_and_the_allowed_tp():
    result = runner.invoke(app, ["estimate", "--model", "llama3-70b", "--device", "h100-80gb", "--tp", "3"])
    assert result.exit_code == 2
    assert "--tp=3 --pp=1 --cp=1: tp*pp*cp = 3 does not divide the world size 8" in result.output
    assert "--tp may be 1, 2, 4, 8" in result.output
