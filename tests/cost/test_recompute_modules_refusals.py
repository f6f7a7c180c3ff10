"""Recompute modules that change nothing, or that a writer cannot express, are one error line naming what to change."""

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export.result import strategy_from_result
from autopar.strategy import Strategy
from conftest import make_problem


def _cli(args):
    return CliRunner().invoke(app, args)


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
