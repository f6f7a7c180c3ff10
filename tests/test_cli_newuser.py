"""What a new user meets first: option defaults in --help, error lines naming the option they typed,
the --target warning when the chosen writer cannot run #1, and a one-line search summary."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import typer.main
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cli.search import target_warning
from autopar.strategy import Strategy
from conftest import make_problem

# Wide enough that no help line wraps (rich reads COLUMNS; typer caps help at TERMINAL_WIDTH).
runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
TOY = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096"]


def test_help_shows_every_documented_default():
    """Help texts say "[default: X]" for options whose real default is None (script value or
    fallback); rich used to eat the bracket as a markup tag, so --help showed no default at all."""
    group = typer.main.get_command(app)
    checked = 0
    for name, command in group.commands.items():
        if not hasattr(command, "params") or name == "profile":
            continue
        rendered = " ".join(runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"}).output.split())
        for param in command.params:
            for default in re.findall(r"\[default: [^\]]*\]", param.help or ""):
                assert " ".join(default.split()) in rendered, f"{name} --help lost {default!r} of {param.opts}"
                checked += 1
    assert checked >= 19  # 17 in cli/options.py's shared options (search/estimate/export) + 2 of balance


def test_help_at_80_columns_shows_every_option_name_whole():
    """``--help`` on an 80-column terminal names every option in full (rich's option table cut
    68 of them, e.g. ``--make-vocab-size…``, so a user could not tell what to type)."""
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        if not hasattr(command, "params"):
            continue
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0 and "…" not in result.output
        assert max(map(len, result.output.splitlines())) <= 80, name
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt in result.output, f"{name} --help lacks {opt}"


def test_estimate_help_defaults_by_hand():
    out = " ".join(runner.invoke(app, ["estimate", "--help"]).output.split())
    for text in ("sequence length (tokens) [default: 4096]", "global batch size (sequences per step) [default: 1024]",
                 "none | selective | full [default: none]", "Megatron distributed optimizer [default: 1]"):
        assert text in out


def test_layout_field_error_names_the_cli_option():
    zero = runner.invoke(app, ["estimate", *TOY, "--zero", "5"])
    assert zero.exit_code == 2 and "error: --zero=5: " in zero.output and "layout.zero" not in zero.output
    recompute = runner.invoke(app, ["estimate", *TOY, "--recompute", "foo"])
    assert recompute.exit_code == 2 and "error: --recompute='foo': " in recompute.output
    layers = runner.invoke(app, ["estimate", *TOY, "--recompute", "full", "--recompute-layers", "-1"])
    assert layers.exit_code == 2 and "error: --recompute-layers=-1: " in layers.output
    assert "Traceback" not in zero.output + recompute.output + layers.output


def test_zero_with_pp_message_is_accurate():
    """Megatron-LM runs ZeRO-2 with pp as --use-megatron-fsdp (no refusal); the DeepSpeed target
    refuses it with DeepSpeed's own PipelineEngine message."""
    assert "zero_with_pp" not in runner.invoke(app, ["estimate", *TOY, "--pp", "2", "--zero", "2"]).output
    out = runner.invoke(app, ["export", "--format", "deepspeed", *TOY, "--pp", "2", "--zero", "2"]).output
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in out and "deepspeed/runtime/pipe" in out


def _ranked(*strategies: Strategy) -> list:
    return [SimpleNamespace(strategy=s) for s in strategies]


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


def test_search_summary_is_one_line():
    out = runner.invoke(app, ["search", *TOY, "--top", "2"]).output
    line = next(x for x in out.splitlines() if "layouts enumerated" in x)
    assert "out of memory:" in line and "marginal (near the memory limit):" in line


def test_megatron_fsdp_export_has_the_required_flags():
    """Megatron-LM's Megatron-FSDP user guide, "Required Configurations": --use-megatron-fsdp,
    --data-parallel-sharding-strategy, --no-gradient-accumulation-fusion, --use-distributed-optimizer,
    --ckpt-format fsdp_dtensor. ZeRO-1 stays the plain distributed optimizer."""
    from autopar.export.megatron import megatron_args

    p = make_problem("llama3-8b", gbs=64, seq=4096)
    for zero, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        words = megatron_args(p, Strategy(dp=8, zero=zero)).split()
        for flag in ("--use-megatron-fsdp", "--use-distributed-optimizer", "--no-gradient-accumulation-fusion"):
            assert flag in words
        assert words[words.index("--ckpt-format") + 1] == "fsdp_dtensor"
        assert words[words.index("--data-parallel-sharding-strategy") + 1] == strategy
    zero1 = megatron_args(p, Strategy(dp=8, zero=1)).split()
    assert "--use-distributed-optimizer" in zero1
    assert not {"--use-megatron-fsdp", "--ckpt-format", "--no-gradient-accumulation-fusion"} & set(zero1)


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


def test_search_with_another_target_points_to_its_export():
    """--target torchtitan costs the layouts as torchtitan runs them, yet the table ends with
    Megatron-LM arguments; it now also names the writer of the target's own config."""
    out = runner.invoke(app, ["search", *TOY, "--top", "1", "--target", "torchtitan"])
    assert out.exit_code == 0, out.output
    assert "autopar export --format torchtitan --from RESULT.json" in " ".join(out.stdout.split())
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
