"""``search --explain LAYOUT`` (issue 19 item 1): the rank of a layout, or the constraint, the rule
(with its reason text from autopar.rules) or the memory limit that drops it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.rules import RULES
from autopar.search.explain import parse_layout
from autopar.strategy import Strategy
from conftest import MODELS

runner = CliRunner()
TOY = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096",
       "--top", "3", "--json"]


def _explain(layout: str, *extra: str, base: list[str] = TOY) -> dict:
    out = runner.invoke(app, [*base, *extra, "--explain", layout])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["explain"]


def test_the_best_layout_ranks_first_by_key_values_and_by_label():
    doc = json.loads(runner.invoke(app, TOY).stdout)
    s = doc["layouts"][0]["strategy"]
    keys = f"tp={s['tp']},pp={s['pp']},vpp={s['vpp']},cp={s['cp']},mbs={s['mbs']},zero={s['zero']}"
    assert _explain(keys)["rank"] == 1
    label = f"tp{s['tp']}{'+sp' if s['sp'] else ''} pp{s['pp']}{'x' + str(s['vpp']) if s['vpp'] > 1 else ''} " \
            f"cp{s['cp']} dp{s['dp']}"
    assert _explain(label)["rank"] == 1


def test_a_rule_drop_names_the_rule_and_its_reason():
    """ZeRO-3 with pp > 1 is refused by Megatron-LM (rule zero_with_pp); the layout below is fully
    given (dp = 8 / (tp 2 x pp 2) = 2, 4 micro-batches) so that rule alone drops its one row."""
    from autopar.cli_inputs import problem_from_options

    found = _explain("tp=2,sp=on,pp=2,vpp=1,cp=1,mbs=1,zero=3,recompute=none")
    p = problem_from_options("llama3-8b", "h100-80gb", 1, None, 8, 4096, *[None] * 9)
    rule = next(r for r in RULES if r.name == "zero_with_pp")
    reason = rule.reason(p, Strategy(dp=2, tp=2, pp=2, zero=3, sp=True))
    assert found["status"] == "rule" and found["rules"] == {"zero_with_pp": 1}
    assert found["text"][0] == f"rejected by rule zero_with_pp: {reason}"


def test_rule_reason_is_the_rules_text():
    """The line holds exactly the reason autopar.rules gives for the layout (tp 16 > 8 KV heads)."""
    found = _explain("tp=16", base=["search", "--model", str(MODELS / "llama3-70b.json"), "--device", "h100-80gb",
                                    "--nodes", "2", "--gbs", "64", "--seq-len", "4096", "--top", "1", "--json"])
    assert found["status"] == "rule"
    assert found["text"][0] == ("rejected by rule tp_divides_kv_heads: tp=16 must divide num_key_value_heads=8 "
                                "(autopar does not replicate KV heads across TP ranks)")


def test_a_memory_drop_shows_the_breakdown_against_the_limit():
    """llama3-70b on 32 GPUs at tp 8, pp 1 without ZeRO: 16-bit weights and grads plus fp32 Adam
    (16 bytes per parameter) of 70.6 B / 8 is ~131 GiB before activations, over 79.6 GiB."""
    found = _explain("tp=8,pp=1,cp=1,zero=0", base=["search", "--model", str(MODELS / "llama3-70b.json"), "--device",
                                                    "h100-80gb", "--nodes", "4", "--gbs", "32", "--seq-len", "4096",
                                                    "--top", "1", "--json"])
    assert found["status"] == "memory"
    assert found["peak_memory_bytes"] > found["device_memory_bytes"] and found["peak_memory_bytes"] > 131 * 2**30
    assert "against 79.6 GiB per device" in found["text"][1] and "optimizer" in found["text"][1]


def test_a_constraint_drop_names_the_constraint():
    found = _explain("cp=2", "--no-cp")
    assert found["status"] == "constraint" and "--no-cp" in found["text"][0]


def test_a_layout_outside_the_space_is_named():
    found = _explain("tp=3")
    assert found["status"] == "not_enumerated" and "no enumerated layout has tp=3" in found["text"][0]


@pytest.mark.parametrize("text", ["tp=4,foo=2", "tp=1,2", "tp=2,tp=4", "tq4 pp2", ""])
def test_bad_layouts_are_refused(text):
    with pytest.raises(AutoparError, match="--explain"):
        parse_layout(text)
    out = runner.invoke(app, [*TOY, "--explain", text])
    assert out.exit_code == 2 and out.output.startswith("error: --explain")


def test_nvidias_llama3_70b_recipe_is_found_in_one_command():
    """The issue's case: tp 4, pp 4, vpp 5, cp 2, mbs 1 on 64 H100 gbs 512 seq 8192 ranked #15
    by hand from --top 1000 --json; --explain gives that rank and the table's numbers."""
    base = ["search", "--model", str(MODELS / "llama3-70b.json"), "--device", "h100-80gb", "--nodes", "8",
            "--gbs", "512", "--seq-len", "8192", "--top", "20", "--json"]
    out = runner.invoke(app, [*base, "--explain", "tp=4,pp=4,vpp=5,cp=2,mbs=1"])
    doc = json.loads(out.stdout)
    found = doc["explain"]
    assert found["status"] == "ranked" and 1 < found["rank"] <= 20
    listed = doc["layouts"][found["rank"] - 1]["strategy"]
    assert (listed["tp"], listed["pp"], listed["vpp"], listed["cp"], listed["mbs"]) == (4, 4, 5, 2, 1)
