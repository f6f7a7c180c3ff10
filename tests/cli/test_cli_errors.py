"""Layout errors name the option the user typed and say exactly what is wrong."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app

# Wide enough that no help line wraps (rich reads COLUMNS; typer caps help at TERMINAL_WIDTH).
runner = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})


TOY = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096"]


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
