"""``search --explain`` output a new user misread (issue 15): a label is exact (its missing marks
fix TP overlap off and the ring), which the output now says; where the layout ranks is said near
the top; #1 gets the runner-up's gap; the table's ``ep8/etp1:deepep+a2a`` marks read back."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.search.explain import label_note, parse_layout

runner = CliRunner()
TOY = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "8", "--seq-len", "4096",
       "--top", "3"]


def test_label_note_names_the_fields_fixed_by_missing_marks():
    """``tp4+sp pp4x5 cp2 dp2``: sp on and vpp 5 are written; TP overlap off and the p2p ring
    are fixed by the marks left out (codes 0)."""
    text = "tp4+sp pp4x5 cp2 dp2"
    assert label_note(text, parse_layout(text)) == (
        "label form is exact: tp_comm_overlap=off, cp_comm_type=p2p (a mark the label leaves out is fixed, not "
        "free); write key=value to leave a field free, e.g. --explain 'tp=4,pp=4,vpp=5,cp=2,dp=2'")
    assert label_note("tp=4,pp=4", parse_layout("tp=4,pp=4")) is None  # key=value leaves them free


def test_the_tables_moe_marks_read_back():
    """Dispatcher codes in autopar.strategy.MOE_DISPATCHERS order (alltoall 0, allgather 1, deepep 2)."""
    assert parse_layout("ep8/etp1:deepep+a2a") == {"ep": 8, "etp": 1, "moe_dispatcher": 2, "moe_ep_overlap": 1}
    assert parse_layout("ep8/etp1") == {"ep": 8, "etp": 1, "moe_dispatcher": 0, "moe_ep_overlap": 0}
    assert parse_layout("moe_dispatcher=allgather") == {"moe_dispatcher": 1}


def test_where_it_ranks_comes_before_the_table_and_names_the_runner_up():
    doc = json.loads(runner.invoke(app, [*TOY, "--json"]).stdout)
    first, second = doc["layouts"][0]["strategy"], doc["layouts"][1]
    layout = f"tp={first['tp']},pp={first['pp']},cp={first['cp']},mbs={first['mbs']},zero={first['zero']}"
    out = runner.invoke(app, [*TOY, "--explain", layout])
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("--explain ") and "ranks #1 of" in line)
    table = next(i for i, line in enumerate(lines) if "Best layouts" in line)
    assert top < table
    gap = second["step_time_s"] / doc["layouts"][0]["step_time_s"] - 1
    s = second["strategy"]
    label = f"tp{s['tp']}"  # the runner-up's label (autopar.report.table.layout_label) starts so
    assert f"; the next, {label}" in lines[top] and lines[top].endswith(f", {gap:+.1%} (details below the table)")
    assert any(line.strip().startswith(f"the next layout, {label}") and f"is {gap:+.1%} against it" in line
               for line in lines[table:])


@pytest.mark.parametrize("label, message", [
    ("mbs0", r"'mbs0': mbs=0; allowed a whole number in 1\.\."),  # was a pydantic traceback
    ("pp4x0", r"'pp4x0': vpp=0; allowed"),
    ("ep8/etp0", r"'ep8/etp0': etp=0; allowed"),
    ("tp2 tp4", r"'tp4' gives tp again; give each label part once"),  # the later part had won silently
])
def test_label_values_are_checked_like_key_value_pairs(label, message):
    with pytest.raises(AutoparError, match=message):
        parse_layout(label)
