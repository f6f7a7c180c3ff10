"""The recipe-knob options ``--cuda-graph-impl``, ``--cuda-graph-scope``, ``--activation-offload-layers``
and ``--fp8-bf16-layers`` (:mod:`autopar.cli.knob_options`): the same names and stated defaults in
``estimate``, ``search`` and ``export``, each changing the estimate as its cost module says, written
by the export, refused by the targets without it, one error line for a bad value."""

from __future__ import annotations

import json

import pytest
from test_bad_input import one_line_error
from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()
JOB = ["-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "8192"]
OPTIONS = ("--cuda-graph-impl", "--cuda-graph-scope", "--activation-offload-layers", "--fp8-bf16-layers")
GIB = 2**30


@pytest.mark.parametrize("command", ["estimate", "search", "export"])
def test_same_options_with_their_defaults(command):
    text = " ".join(runner.invoke(app, [command, "--help"], terminal_width=400).stdout.split())
    for option in OPTIONS:
        assert option in text, option
    assert "[default: the script's, else none]" in text and "[default: 0, none]" in text


def _estimate(*extra: str) -> dict:
    res = runner.invoke(app, ["estimate", *JOB, "--tp", "1", "--pp", "1", *extra, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_cuda_graphs_add_their_static_buffers_by_hand():
    """Whole-layer graphs, one micro-batch in flight: 2 hidden states x 8192 x 4096 x 2 B x 32 layers = 4 GiB
    (autopar.cost.cuda_graph); a GPU-bound step keeps its time."""
    plain, graphs = _estimate(), _estimate("--cuda-graph-impl", "transformer_engine")
    assert graphs["peak_memory_bytes"] - plain["peak_memory_bytes"] == 2 * 8192 * 4096 * 2 * 32 == 4 * GIB
    assert graphs["step_time_s"] == plain["step_time_s"]
    attn = _estimate("--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn")
    assert attn["peak_memory_bytes"] == graphs["peak_memory_bytes"]  # one graph per layer either way


def test_activation_offload_moves_layers_to_the_host():
    """8 offloaded layers free 7 layers' activations (the double buffer keeps one), and their copies over
    PCIe cost time (autopar.cost.activation_offload)."""
    from autopar.cost.memory import stored_layer_bytes
    from autopar.cost.stage import all_stages
    from autopar.strategy import Strategy
    from conftest import make_problem

    plain, off = _estimate(), _estimate("--activation-offload-layers", "8")
    batch, stages = all_stages(make_problem("llama3-8b", seq=8192), Strategy(dp=8))
    layer = float(stored_layer_bytes(make_problem("llama3-8b", seq=8192), batch, stages)[0]) / 32
    assert plain["peak_memory_bytes"] - off["peak_memory_bytes"] == pytest.approx(7 * layer)
    assert off["step_time_s"] > plain["step_time_s"]


def test_export_writes_them_and_other_targets_refuse():
    layout = [*JOB, "--tp", "2", "--pp", "1"]
    base = ["export", "--format", "megatron", *layout]
    text = runner.invoke(app, [*base, "--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration"]).stdout
    assert "--cuda-graph-impl local --cuda-graph-scope full_iteration --no-check-for-nan-in-loss-and-grad" in text
    text = runner.invoke(app, [*base, "--activation-offload-layers", "4"]).stdout
    assert "--cpu-offloading-num-layers 4" in text
    bridge = runner.invoke(app, ["export", "--format", "megatron-bridge", *layout, "--cuda-graph-impl", "local",
                                 "--cuda-graph-scope", "full_iteration"]).stdout  # ConfigContainer.validate asserts it
    assert "model.cuda_graph_scope=[full_iteration]" in bridge and "rerun_state_machine.check_for_nan_in_loss=false" in bridge
    err = one_line_error(["export", "--format", "torchtitan", *JOB, "--tp", "2", "--cuda-graph-impl",
                          "transformer_engine"])
    assert "export --format torchtitan: CUDA graph capture" in err
    err = one_line_error(["search", *JOB, "--target", "torchtitan", "--activation-offload-layers", "4"])
    assert "--activation-offload-layers 4 with --target torchtitan: only Megatron-LM and Megatron-Bridge" in err


def test_export_from_a_result_must_agree(tmp_path):
    res = runner.invoke(app, ["search", *JOB, "--top", "1", "--json", "-q", "--cuda-graph-impl", "transformer_engine"])
    assert res.exit_code == 0, res.output
    path = tmp_path / "r.json"
    path.write_text(res.stdout)
    ok = runner.invoke(app, ["export", "--format", "megatron", "--from", str(path)])
    assert ok.exit_code == 0 and "--cuda-graph-impl transformer_engine" in ok.stdout
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), "--cuda-graph-impl", "none"])
    assert "--cuda-graph-impl='none'" in err and "searched with --cuda-graph-impl='transformer_engine'" in err


@pytest.mark.parametrize("extra, needle", [
    (["--cuda-graph-impl", "full"], "--cuda-graph-impl='full': allowed none, local, transformer_engine"),
    (["--cuda-graph-scope", "attn,bogus"], "--cuda-graph-scope='attn,bogus': comma-separated names out of"),
    (["--cuda-graph-scope", "attn"], "a scope needs an implementation"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "attn"], "local takes full_iteration or no scope"),
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "full_iteration"], "needs the local implementation"),
    (["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "moe_preprocess"], "together with moe_router"),
    (["--activation-offload-layers", "-1"], "--activation-offload-layers=-1: must be an integer >= 0"),
    (["--activation-offload-layers", "32"], "must be below the model's 32 layers"),
    (["--activation-offload-layers", "4", "--pp", "2"], "activation_offload_pp1_no_recompute"),
])
def test_bad_values_are_one_line(extra, needle):
    assert needle in one_line_error(["estimate", *JOB, *extra])


def test_search_knobs_keeps_the_fastest_setting(tmp_path):
    """Qwen3-30B-A3B at seq 2048 on 8 H100 is host-bound: whole-layer CUDA graphs make #1 faster, so
    ``--search-knobs`` keeps them, its #1 is that search's #1, and the export of the result writes them."""
    from autopar.search import search
    from autopar.search.knob_variants import choose, variants
    from conftest import make_problem

    p = make_problem("qwen3-30b-a3b", gbs=256, seq=2048)
    labels = [c.label for c in variants(p, "megatron")]
    assert labels == ["", "--cuda-graph-impl transformer_engine", "--activation-offload-layers 24",
                      "--activation-offload-layers 47"]
    chosen, result, tried = choose(p, "megatron", lambda q: search(q, 1))
    assert chosen.label == "--cuda-graph-impl transformer_engine"
    assert chosen.best_step_s == min(c.best_step_s for c in tried) < tried[0].best_step_s
    assert result.layouts[0].step_time_s == chosen.best_step_s
    res = runner.invoke(app, ["search", "-m", "qwen3-30b-a3b", "--device", "h100-80gb", "--gbs", "256", "--seq-len",
                              "2048", "--search-knobs", "--json", "-q", "--top", "1"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["search_knobs"].startswith("--search-knobs: kept --cuda-graph-impl transformer_engine")
    path = tmp_path / "r.json"
    path.write_text(res.stdout)
    assert "--cuda-graph-impl transformer_engine" in runner.invoke(
        app, ["export", "--format", "megatron", "--from", str(path)]).stdout
    # Llama-3-8B at seq 8192 is GPU-bound: no setting makes #1 faster, the plan as given is kept
    dense = choose(make_problem("llama3-8b", seq=8192), "megatron", lambda q: search(q, 1))[0]
    assert dense.label == ""


def test_search_knobs_refusals():
    assert "--search-knobs with --target torchtitan" in one_line_error(
        ["search", *JOB, "--search-knobs", "--target", "torchtitan"])
    assert "--search-knobs may change" in one_line_error(["search", *JOB, "--search-knobs", "--gbs-range", "32:64"])


def test_script_scope_full_is_the_whole_layer(tmp_path):
    """core_v0.15's ``--cuda-graph-scope`` default ``full`` (deprecated on main) is the whole layer: no scope;
    an option given replaces the script's graphs."""
    from autopar.cli.inputs import problem_from_options
    from autopar.specs.script import read_script
    from conftest import mixtral_script

    path = mixtral_script(tmp_path, "--cuda-graph-impl transformer_engine --cuda-graph-scope full")
    fields = read_script(path).train_fields
    assert (fields["cuda_graph_impl"], fields["cuda_graph_scope"]) == ("transformer_engine", ())
    p = problem_from_options(None, "h100-80gb", None, None, None, None, None, None, None, None, None, str(path),
                             knobs={"cuda_graph_impl": "none"})
    assert (p.train.cuda_graph_impl, p.train.cuda_graph_scope) == ("none", ())
