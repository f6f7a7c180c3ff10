"""Hostile inputs for recompute modules, ``--cp-comm-type`` and ``--noop-layers``: each is one
error line (or is read the way Megatron-LM reads it), never a traceback or a silent no-op."""

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export.result import strategy_from_result
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem

MIXTRAL_SH = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()  # 32 layers, tp2 pp4 ep4 + SP


def _script(tmp_path, extra: str, name: str = "s.sh"):
    """The shared Mixtral launch script with ``extra`` flags after ``--sequence-parallel``."""
    path = tmp_path / name
    path.write_text(MIXTRAL_SH.replace("    --sequence-parallel\n", f"    --sequence-parallel\n    {extra}\n"))
    return path


def _cli(args):
    return CliRunner().invoke(app, args)


def test_script_comma_separated_modules_are_refused_space_separated_read(tmp_path):
    # Megatron-LM: --recompute-modules is nargs='*'; "moe_act,layernorm" is one word that
    # TransformerConfig's allowed-modules assertion rejects (was read as moe_act + layernorm).
    bad = _script(tmp_path, "--recompute-granularity selective --recompute-modules=moe_act,layernorm")
    with pytest.raises(AutoparError, match=r"s.sh: --recompute-modules='moe_act,layernorm': Megatron-LM takes the "
                                           r"names separated by spaces \(--recompute-modules moe_act layernorm\)"):
        read_script(bad)
    res = _cli(["estimate", "--script", str(bad), "--device", "h100-80gb"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    ok = _script(tmp_path, "--recompute-granularity selective --recompute-modules moe_act layernorm", "ok.sh")
    assert read_script(ok).layout["recompute_modules"] == ("moe_act", "layernorm")


def test_script_modules_without_a_value_are_refused(tmp_path):
    # Megatron-LM accepts an empty list (and then recomputes nothing under selective).
    bad = _script(tmp_path, "--recompute-granularity selective --recompute-modules")
    with pytest.raises(AutoparError, match="--recompute-modules with no value: Megatron-LM then recomputes nothing"):
        read_script(bad)


def test_script_modules_are_ignored_outside_selective_granularity(tmp_path):
    # Megatron-LM validates the names only under selective granularity; under full it ignores
    # them, so a script that runs there is read (was refused as an unknown name).
    full = _script(tmp_path, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
                             "--recompute-modules experts")
    lay = read_script(full).layout
    assert (lay["recompute"], lay["recompute_modules"]) == ("full", ("core_attn",))


def test_cp_comm_type_list_must_have_one_entry_or_one_per_layer(tmp_path):
    # Megatron-Core TransformerConfig (cp > 1): len(cp_comm_type) == num_layers (32 here).
    bad = _script(tmp_path, "--context-parallel-size 2 --cp-comm-type p2p p2p")
    with pytest.raises(AutoparError, match=r"--cp-comm-type='p2p p2p': 2 values; Megatron-LM takes one value or "
                                           r"one per layer \(32 for --num-layers=32\)"):
        read_script(bad)
    assert read_script(_script(tmp_path, "--context-parallel-size 2 --cp-comm-type " + "p2p " * 32)).layout["cp"] == 2
    assert read_script(_script(tmp_path, "--cp-comm-type p2p p2p")).layout["cp"] == 1  # not checked without CP


def test_noop_layers_with_a_non_ascii_digit_is_one_error(tmp_path):
    # '³'.isdigit() is True but int('³') raised ValueError (a traceback).
    with pytest.raises(AutoparError, match="--noop-layers='³': expected layer indices like 61,62,63"):
        read_script(_script(tmp_path, "--noop-layers ³"))


@pytest.mark.parametrize("modules", ["moe_act", None, ["foo"], [], [1], [["moe_act"]], ["moe_act,moe"]])
def test_hand_edited_result_modules_are_one_error_line(tmp_path, modules):
    # was pydantic's per-item error plus "Tuple should have at least 1 item after validation, not 0"
    p = make_problem("mixtral-8x7b", nodes=2, gbs=64)
    strategy = dict(dp=8, tp=2, pp=1, ep=4, sp=True, recompute="selective", recompute_modules=modules)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"layouts": [{"strategy": strategy}]}))
    with pytest.raises(AutoparError) as err:
        strategy_from_result(str(path), 1, p)
    assert str(err.value) == (f"--from={str(path)!r}: layout 1 recompute_modules={modules!r}: expected a list of one "
                              "or more of core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts "
                              '(e.g. ["core_attn"])')
    strategy["recompute_modules"] = ["moe_act", "moe_act"]
    path.write_text(json.dumps({"layouts": [{"strategy": strategy}]}))
    assert strategy_from_result(str(path), 1, p).recompute_modules == ("moe_act",)


@pytest.mark.parametrize("model, nodes, module, layout, needle", [
    ("mixtral-8x7b", 2, "mlp", dict(dp=4, tp=2, pp=2, ep=4, sp=True), "mlp needs dense (non-MoE) layers"),
    ("llama3-8b", 1, "layernorm", dict(dp=2, tp=2, pp=2), "layernorm needs MLA or MoE layers"),
])
def test_modules_that_change_nothing_are_refused(model, nodes, module, layout, needle):
    # Every Mixtral layer is MoE (Megatron's mlp recomputes a dense MLP only); a dense GQA layer's
    # norms are fused into LayerNormLinear. The estimates show the set is a no-op ...
    p = make_problem(model, nodes=nodes)
    base = estimate(p, Strategy(recompute="selective", **layout))
    same = estimate(p, Strategy(recompute="selective", recompute_modules=("core_attn", module), **layout))
    assert (same.peak_memory_bytes, same.step_time_s) == (base.peak_memory_bytes, base.step_time_s)
    # ... so the option is one error line rather than a silently unchanged number.
    res = _cli(["estimate", "--model", model, "--device", "h100-80gb", "--recompute", "selective",
                "--recompute-modules", f"core_attn,{module}"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr, res.stderr


def test_modules_without_a_selective_stage_say_what_to_change():
    with pytest.raises(ValueError, match=r"this layout recomputes full \(make recompute, or a recompute_per_stage "
                                         r"entry, selective, or leave the default core_attn\)"):
        Strategy(dp=8, recompute="full", recompute_modules=("moe_act",))


def test_balance_per_stage_mix_with_modules_names_no_per_stage_writer():
    # SAPP and Galvatron refuse a module set, so the balancer must not send a selective/none mix
    # with moe_act,layernorm to them (it did: "write it with autopar export --format sapp").
    res = _cli(["balance", "--model", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "4", "--gbs", "64",
                "--tp", "2", "--sp", "--pp", "4", "--ep", "4", "--etp", "1", "--recompute", "selective",
                "--recompute-modules", "moe_act,layernorm", "--memory-limit-gib", "50", "--options", "none,selective"])
    assert res.exit_code == 0, res.output
    line = " ".join(res.stdout.split())
    assert "Megatron has one setting, and no per-stage writer takes --recompute-modules moe_act layernorm" in line
    assert "write it with autopar export --format sapp" not in line


def test_noop_layers_with_a_full_block_of_every_position(tmp_path):
    # 32 positions, pp 4: 8 per stage; noop 28..31 leaves 8,8,8,4 real layers. A block of 8
    # (Megatron allows up to the 8 positions per stage) recomputes every real layer; it was
    # refused as more than num_layers/pp = 28/4 = 7.
    script = _script(tmp_path, "--noop-layers 28,29,30,31 --recompute-granularity full --recompute-method block "
                               "--recompute-num-layers 8")
    lay = read_script(script).layout
    assert (lay["recompute"], lay["recompute_layers"], lay["layers_per_stage"]) == ("full", None, (8, 8, 8, 4))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_explicit_recompute_drops_the_scripts_selective_modules(tmp_path, recompute):
    # The script recomputes selective moe_act; --recompute none/full on the command line wins,
    # and the script's modules (which Megatron reads under selective only) go with it. Was:
    # "recompute_modules=moe_act applies to selective recompute; this layout recomputes none".
    script = _script(tmp_path, "--recompute-granularity selective --recompute-modules moe_act")
    res = _cli(["estimate", "--script", str(script), "--device", "h100-80gb", "--recompute", recompute, "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["strategy"]
    assert (s["recompute"], s["recompute_modules"]) == (recompute, ["core_attn"])
    kept = _cli(["estimate", "--script", str(script), "--device", "h100-80gb", "--json"])
    assert json.loads(kept.stdout)["strategy"]["recompute_modules"] == ["moe_act"]


def test_script_modules_megatron_refuses_are_one_error_unless_overridden(tmp_path):
    # Megatron-Core TransformerConfig: "moe_act in recompute_modules is only supported with
    # moe_grouped_gemm" (ValueError); the estimate costed grouped-GEMM moe_act silently (rc 0).
    text = MIXTRAL_SH.replace("    --moe-grouped-gemm\n", "")
    path = tmp_path / "nogg.sh"
    path.write_text(text.replace("    --sequence-parallel\n", "    --sequence-parallel\n    --recompute-granularity "
                                 "selective --recompute-modules moe_act\n"))
    res = _cli(["estimate", "--script", str(path), "--device", "h100-80gb"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert "--recompute-modules moe_act without --moe-grouped-gemm: Megatron-LM refuses this combination" in res.stderr
    # An explicit set (or recompute option) replaces the script's; the export adds the flag.
    out = _cli(["export", "--format", "megatron", "--script", str(path), "--device", "h100-80gb",
                "--recompute-modules", "moe_act"])
    assert out.exit_code == 0 and "--moe-grouped-gemm" in out.stdout, out.output
    assert _cli(["estimate", "--script", str(path), "--device", "h100-80gb", "--recompute", "none"]).exit_code == 0
