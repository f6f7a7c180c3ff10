"""``--recompute-modules`` read from a launch script as Megatron-LM reads it (space-separated, selective only)."""

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script
from conftest import mixtral_script


def _cli(args):
    return CliRunner().invoke(app, args)


def test_script_comma_separated_modules_are_refused_space_separated_read(tmp_path):
    # Megatron-LM: --recompute-modules is nargs='*'; "moe_act,layernorm" is one word that
    # TransformerConfig's allowed-modules assertion rejects (was read as moe_act + layernorm).
    bad = mixtral_script(tmp_path, "--recompute-granularity selective --recompute-modules=moe_act,layernorm")
    with pytest.raises(AutoparError, match=r"s.sh: --recompute-modules='moe_act,layernorm': Megatron-LM takes the "
                                           r"names separated by spaces \(--recompute-modules moe_act layernorm\)"):
        read_script(bad)
    res = _cli(["estimate", "--script", str(bad), "--device", "h100-80gb"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    ok = mixtral_script(tmp_path, "--recompute-granularity selective --recompute-modules moe_act layernorm", "ok.sh")
    assert read_script(ok).layout["recompute_modules"] == ("moe_act", "layernorm")


def test_script_modules_without_a_value_are_refused(tmp_path):
    # Megatron-LM accepts an empty list (and then recomputes nothing under selective).
    bad = mixtral_script(tmp_path, "--recompute-granularity selective --recompute-modules")
    with pytest.raises(AutoparError, match="--recompute-modules with no value: Megatron-LM then recomputes nothing"):
        read_script(bad)


def test_script_modules_are_ignored_outside_selective_granularity(tmp_path):
    # Megatron-LM validates the names only under selective granularity; under full it ignores
    # them, so a script that runs there is read (was refused as an unknown name).
    full = mixtral_script(tmp_path, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                             "--recompute-modules experts")
    lay = read_script(full).layout
    assert (lay["recompute"], lay["recompute_modules"]) == ("full", ("core_attn",))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_explicit_recompute_drops_the_scripts_selective_modules(tmp_path, recompute):
    # The script recomputes selective moe_act; --recompute none/full on the command line wins,
    # and the script's modules (which Megatron reads under selective only) go with it. Was:
    # "recompute_modules=moe_act applies to selective recompute; this layout recomputes none".
    script = mixtral_script(tmp_path, "--recompute-granularity selective --recompute-modules moe_act")
    res = _cli(["estimate", "--script", str(script), "--device", "h100-80gb", "--recompute", recompute, "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["strategy"]
    assert (s["recompute"], s["recompute_modules"]) == (recompute, ["core_attn"])
    kept = _cli(["estimate", "--script", str(script), "--device", "h100-80gb", "--json"])
    assert json.loads(kept.stdout)["strategy"]["recompute_modules"] == ["moe_act"]


def test_script_modules_megatron_refuses_are_one_error_unless_overridden(tmp_path):
    # Megatron-Core TransformerConfig: "moe_act in recompute_modules is only supported with
    # moe_grouped_gemm" (ValueError); the estimate costed grouped-GEMM moe_act silently (rc 0).
    path = mixtral_script(tmp_path, "--recompute-granularity selective --recompute-modules moe_act", "nogg.sh")
    path.write_text(path.read_text().replace("    --moe-grouped-gemm\n", ""))
    res = _cli(["estimate", "--script", str(path), "--device", "h100-80gb"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "--recompute-modules moe_act without --moe-grouped-gemm: Megatron-LM refuses this combination" in res.stderr
    # An explicit set (or recompute option) replaces the script's; the export adds the flag.
    out = _cli(["export", "--format", "megatron", "--script", str(path), "--device", "h100-80gb",
                "--recompute-modules", "moe_act"])
    assert out.exit_code == 0 and "--moe-grouped-gemm" in out.stdout, out.output
    assert _cli(["estimate", "--script", str(path), "--device", "h100-80gb", "--recompute", "none"]).exit_code == 0
