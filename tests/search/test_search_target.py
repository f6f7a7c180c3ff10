"""``search --target``: the layouts listed run on the target, the warning when #1 cannot, the target's costing."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import make_problem
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cli.search import target_warning
from autopar.strategy import Strategy


def _ranked(*strategies: Strategy) -> list:
    return [SimpleNamespace(strategy=s) for s in strategies]


# Wide enough that no help line wraps (rich reads COLUMNS; typer caps help at TERMINAL_WIDTH).
runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


TOY = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096"]


def test_target_warning_names_reason_and_best_writable_rank():
    """DeepSpeed has no ring context parallelism: a cp=2 #1 is refused, the cp=1 #2 is written."""
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    with_cp = Strategy(dp=4, cp=2, zero=1)
    plain = Strategy(dp=8, zero=1)
    both = target_warning(p, _ranked(with_cp, plain), "deepspeed")
    assert both.startswith("--target deepspeed cannot run #1 unchanged (") and "cp=2" in both
    assert both.endswith("the best layout it can write is #2")
    assert target_warning(p, _ranked(with_cp), "deepspeed").endswith("none of the top 1 can be written")
    assert target_warning(p, _ranked(plain, with_cp), "deepspeed") is None
    # torchtitan has no ZeRO-1 (FSDP2 shards parameters too); megatron writes both.
    assert "zero=1" in target_warning(p, _ranked(plain), "torchtitan")
    assert target_warning(p, _ranked(with_cp, plain), "megatron") is None


def test_search_prints_target_warning_on_stderr(monkeypatch):
    """The warning goes to stderr (the --json document on stdout stays parseable)."""
    seen = []

    def fake(p, layouts, target):
        seen.append((target, len(layouts)))
        return "--target deepspeed cannot run #1 unchanged (why); none of the top 2 can be written"

    monkeypatch.setattr("autopar.cli.search.target_warning", fake)
    out = runner.invoke(app, ["search", *TOY, "--top", "2", "--target", "deepspeed", "--json"])
    assert out.exit_code == 0 and seen == [("deepspeed", 2)]
    assert "warning: --target deepspeed cannot run #1 unchanged (why)" in out.stderr
    assert out.stdout.lstrip().startswith("{") and "warning" not in out.stdout


def test_search_names_why_megatron_cannot_run_a_free_split(monkeypatch):
    """--target sapp/galvatron may choose a split with unequal middle stages and one recompute
    option (e.g. llama3-70b on 32 A100-80GB: 20,20,21,19). The table used to end with "#1 sets
    recompute per stage", which was false; Megatron-LM runs it with its layout string."""
    from autopar.estimate import estimate
    from autopar.search.grid import SearchResult

    free = Strategy(dp=2, pp=4, zero=1, layers_per_stage=(7, 8, 9, 8))
    assert free.recompute_per_stage is None

    def fake(p, top_k, memory_margin, options, target, constraints=None):
        return SearchResult([estimate(p, free)], 1, {}, 0, 0, 0.0, p.train.global_batch_size, target)

    monkeypatch.setattr("autopar.search.search", fake)
    ascend = [a if a != "h100-80gb" else "ascend-910b" for a in TOY]  # MindFormers (sapp) runs on Ascend only
    out = runner.invoke(app, ["search", *ascend, "--top", "1", "--target", "sapp"])
    assert out.exit_code == 0, out.output
    tail = " ".join(out.stdout.split())
    assert "sets recompute per stage" not in tail
    # Unequal middle stages are a Megatron --pipeline-model-parallel-layout (first/last flags cannot say it).
    assert "Megatron-LM cannot run #1" not in tail
    doc = runner.invoke(app, ["search", *ascend, "--top", "1", "--target", "sapp", "--json"]).stdout
    assert "--pipeline-model-parallel-layout 'Et*7|t*8|t*9|t*8L'" in json.loads(doc)["megatron_args"]


def test_search_with_another_target_prints_the_targets_own_config(tmp_path):
    """--target torchtitan / galvatron / megatron-bridge costs the layouts as that framework runs
    them, yet the table ended with Megatron-LM's pretrain_gpt.py flags and a hint asking for "the
    same model/cluster options" that export --from does not need. It now prints the target's own
    config for #1 (what export --format T writes for it) and the --from command alone."""
    from autopar.export import WRITERS
    from autopar.search.grid import for_target

    for target, marker in (("torchtitan", "[parallelism]"), ("galvatron", '"pp_deg"'),
                           ("megatron-bridge", "run_recipe.py")):
        out = runner.invoke(app, ["search", *TOY, "--top", "1", "--target", target])
        assert out.exit_code == 0, out.output
        text = out.stdout
        assert "Megatron-LM arguments for #1" not in text and "--tensor-model-parallel-size" not in text, target
        assert f"{target} config for #1:" in text and marker in text, target
        tail = " ".join(text.split())
        assert f"autopar export --format {target} --from RESULT.json" in tail
        assert "same model/cluster options" not in tail
        # the config printed is the writer's own text for #1 of the --json result
        doc = json.loads(runner.invoke(app, ["search", *TOY, "--top", "1", "--target", target, "--json"]).stdout)
        from autopar.export.result import result_problem, strategy_from_result

        path = tmp_path / f"{target}.json"
        path.write_text(json.dumps(doc))
        p = for_target(result_problem(str(path)), target)
        written = WRITERS[target](p, strategy_from_result(str(path), 1, p))
        assert written.rstrip("\n") in text, target
    plain = runner.invoke(app, ["search", *TOY, "--top", "1"]).stdout
    assert "--target" not in plain and "Megatron-LM arguments for #1" in plain


def test_search_lists_only_layouts_the_target_can_write():
    """--target deepspeed: DeepSpeed has no context parallelism and no TP overlap, so the layouts
    with them that rank first for Llama-3-70B at 8K on 64 H100 under Megatron are skipped and counted."""
    from autopar.search import search
    from autopar.search.grid import refusal

    p = make_problem("llama3-70b", nodes=8, gbs=1024, seq=8192)
    megatron = search(p, top_k=5)
    assert any(e.strategy.cp > 1 or e.strategy.tp_comm_overlap for e in megatron.layouts)
    assert megatron.not_writable == 0
    deepspeed = search(p, top_k=5, target="deepspeed")
    assert deepspeed.not_writable > 0 and len(deepspeed.layouts) == 5
    assert all(refusal(p, "deepspeed", e.strategy) is None for e in deepspeed.layouts)
    assert deepspeed.to_dict()["not_writable"] == deepspeed.not_writable


def test_search_target_deepspeed_costs_as_deepspeed():
    """--target deepspeed ranks layouts as DeepSpeed runs them (TrainSpec.framework='deepspeed',
    no async TP all-reduce), like --target torchtitan. Llama-3-70B, 64 H100, gbs 512, seq 8192:
    Megatron-costed, tp4+sp dp16 ZeRO-3 is the best writable layout at 64.2 GiB, but DeepSpeed
    keeps 16-bit gradients and a 30% allocator reserve on top (cost.framework_memory), which puts it
    above the 79.6 GiB device, so it must not be recommended for DeepSpeed."""
    from autopar.estimate import estimate
    from autopar.search import search
    from autopar.search.grid import for_target

    p = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192)
    z3 = Strategy(tp=4, sp=True, dp=16, zero=3)
    assert estimate(p, z3).fits and not estimate(for_target(p, "deepspeed"), z3).fits
    ds = for_target(p, "deepspeed")
    assert (ds.train.framework, ds.train.tp_backward_overlap) == ("deepspeed", False)
    for e in search(p, top_k=3, target="deepspeed").layouts:
        s = e.strategy
        assert (s.tp, s.pp, s.dp, s.zero, s.mbs, s.recompute) != (4, 1, 16, 3, 1, "none")
        assert estimate(ds, e.strategy).peak_memory_bytes == e.peak_memory_bytes and e.fits


def test_unknown_search_target_names_the_option():
    from typer.testing import CliRunner

    from autopar.cli import app

    res = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--target", "megatronn"])
    assert res.exit_code == 2
    assert res.output.strip() == ("error: --target='megatronn': allowed megatron, megatron-bridge, mindspeed, torchtitan, deepspeed, "
                                  "galvatron, sapp")
