"""``autopar balance`` takes and writes the recompute modules."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app

MEMORY_SET = ("core_attn", "moe_act", "layernorm", "mla_up_proj")  # the search's #1 for DeepSeek-V3


def test_balance_takes_and_writes_the_recompute_modules():
    """`autopar balance` had no --recompute-modules, so the search's #1 (selective with the
    memory-saving set) could not be balanced as costed, and its Megatron line lacked the set."""
    args = ["balance", "--model", "deepseek-v3", "--device", "h100-80gb", "--nodes", "256", "--gbs", "4096",
            "--tp", "2", "--sp", "--pp", "16", "--cp", "2", "--ep", "8", "--etp", "1", "--recompute", "selective",
            "--form", "megatron", "--options", "selective"]
    out = CliRunner().invoke(app, args + ["--recompute-modules", ",".join(MEMORY_SET)], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "--recompute-granularity selective --recompute-modules core_attn moe_act layernorm mla_up_proj" in out.output
    assert "not --recompute-modules core_attn,moe_act,layernorm,mla_up_proj" in out.output  # the SAPP line says so
    plain = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert plain.exit_code == 0 and "--recompute-modules" not in plain.output
