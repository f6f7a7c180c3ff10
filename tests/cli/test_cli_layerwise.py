"""``autopar search --layerwise``: the plan and its Galvatron JSON, steered by search's options."""

from __future__ import annotations

import json

import pytest
from conftest import make_problem
from json_schema_support import assert_valid
from typer.testing import CliRunner

from autopar.cli import app
from autopar.export import galvatron_layerwise
from autopar.layerwise import search_layerwise
from autopar.search.grid import for_target

runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
LLAMA = ["search", "--model", "llama2-7b", "--device", "a100-40gb", "--gbs", "64", "--seq-len", "4096", "--layerwise"]


def test_json_is_the_searched_plan_and_its_galvatron_config():
    out = runner.invoke(app, [*LLAMA, "--tp", "1,2,4", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["document"] == "search-layerwise" and doc["schema_version"] == 1
    assert_valid("search-layerwise", doc)
    p = for_target(make_problem("llama2-7b", device="a100-40gb", gbs=64, seq=4096), "galvatron")  # as it runs
    want = search_layerwise(p, tp_options=[1, 2, 4], sp=None, memory_limit_bytes=0.9 * p.cluster.device.memory_bytes)
    assert doc["plan"] == want.plan.model_dump(mode="json")
    assert doc["step_time_s"] == pytest.approx(want.cost.step_time_s)
    assert doc["galvatron"] == galvatron_layerwise.config(p, want.plan)
    assert len(doc["galvatron"]["tp_sizes_enc"].split(",")) == 32


def test_options_steer_the_layerwise_search():
    doc = json.loads(runner.invoke(app, [*LLAMA, "--tp", "4", "--pp", "1", "--no-recompute", "--no-fsdp",
                                         "--json"]).stdout)
    assert set(doc["plan"]["tp"]) == {4} and doc["plan"]["pp"] == 1
    assert not any(doc["plan"]["recompute"]) and not any(doc["plan"]["zero3"])


def test_text_output_has_the_layer_runs_and_the_json():
    out = runner.invoke(app, [*LLAMA, "--pp", "2"])
    assert out.exit_code == 0, out.output
    assert "Layers (runs of equal layers)" in out.output and '"tp_sizes_enc"' in out.output
    assert "layer-wise plan, pp 2" in out.output


@pytest.mark.parametrize("extra, message", [
    (["--target", "megatron"], "error: --target megatron with --layerwise: Megatron-LM sets one "
                               "--tensor-model-parallel-size"),
    (["--target", "torchtitan"], "a layer-wise plan is written only as --format galvatron"),
    (["--cp", "2"], "error: --cp 2 with --layerwise: the layer-wise search has no such choice"),
    (["--zero", "1"], "error: --zero 1 with --layerwise: a layer-wise plan needs 0 (ddp) or 2 (zero2)"),
    (["--recompute", "selective"], "error: --recompute selective with --layerwise: Galvatron checkpoints whole"),
    (["--gbs-range", "64,128"], "error: --layerwise writes one layer-wise plan; --gbs-range: options of the ranked"),
    (["--top", "3"], "error: --layerwise writes one layer-wise plan; --top: options of the ranked"),  # was ignored
])
def test_refusals_name_the_option(extra, message):
    out = runner.invoke(app, [*LLAMA, *extra])
    assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output
    assert out.output.count("error:") == 1


def test_moe_and_no_fit_are_one_error_line():
    moe = runner.invoke(app, ["search", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--gbs", "64",
                              "--layerwise"])
    assert moe.exit_code == 2 and "error: Galvatron cannot run a layer-wise plan" in moe.output
    assert "MoE model" in moe.output
    on_h100 = [*LLAMA[:LLAMA.index("--device") + 1], "h100-80gb", *LLAMA[LLAMA.index("--device") + 2:]]
    fp8 = runner.invoke(app, [*on_h100, "--precision", "fp8"])
    assert fp8.exit_code == 2 and "precision fp8: Galvatron trains in fp32, fp16 or bf16" in fp8.output
    tight = runner.invoke(app, ["search", "--model", "llama2-70b", "--device", "a100-40gb", "--gbs", "64",
                                "--layerwise", "--pp", "1"])
    assert tight.exit_code == 2 and "error: no layer-wise plan of llama2-70b fits 90% of a100-40gb memory" in tight.output


def test_text_says_what_sequence_parallelism_runs_the_tp_marks_and_the_best_uniform_layout():
    """Llama-2-7B on 8 A100-40GB at 4K, tp 1 or 2: the plan runs tp 2 everywhere, some layers as
    Megatron TP and the rest as Ulysses ('2 u'). The heading said "Megatron sp" and the JSON hint
    "add --sequence-parallel" although most layers run Ulysses; it now counts each, the table's
    'u' has a legend, and the best uniform layout of search --target galvatron with the same
    constraints is printed beside the plan (its step time as that search gives it)."""
    args = ["--pp", "1", "--tp", "1,2", "--zero", "2,3"]
    doc = json.loads(runner.invoke(app, [*LLAMA, *args, "--json"]).stdout)
    plan = doc["plan"]
    ulysses = sum(plan["ulysses"])
    megatron = sum(1 for t, u in zip(plan["tp"], plan["ulysses"]) if t > 1 and not u)
    assert ulysses > 0 and megatron > 0 and plan["sp"]
    uniform = json.loads(runner.invoke(app, [*LLAMA[:-1], *args, "--target", "galvatron", "--top", "1",
                                             "--json"]).stdout)["layouts"][0]
    assert doc["uniform_best"]["step_time_s"] == pytest.approx(uniform["step_time_s"], rel=1e-9)
    assert_valid("search-layerwise", doc)
    out = runner.invoke(app, [*LLAMA, *args])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert f"sequence parallel (Megatron sp on {megatron} tp layers, Ulysses on {ulysses} layers)" in text
    assert ", Megatron sp\n" not in out.stdout
    assert "'u': a Ulysses layer (DeepSpeed-Ulysses, Galvatron's use_sp)" in text
    slower = doc["step_time_s"] / uniform["step_time_s"] - 1
    assert "best uniform layout for --target galvatron: " in text
    assert f"step {uniform['step_time_s']:.3f} s; the layer-wise plan is {slower:+.1%} against it" in text
