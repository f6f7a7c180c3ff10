"""The tables explain the recompute short forms and spell out the recompute modules."""

from __future__ import annotations

import html
from types import SimpleNamespace

from typer.testing import CliRunner

from autopar.cli import app
from autopar.strategy import Strategy

MEMORY_SET = ("core_attn", "moe_act", "layernorm", "mla_up_proj")  # the search's #1 for DeepSeek-V3


def _row(s: Strategy) -> SimpleNamespace:
    return SimpleNamespace(strategy=s, marginal=False, peak_memory_bytes=1.0, step_time_s=1.0,
                           tokens_per_s_per_device=1.0, mfu=0.5, time_breakdown_s={"pp_bubble": 0.0})


def test_ranking_table_explains_recompute_short_forms():
    """The DeepSeek-V3 table showed 'sel attn+act+norm+mla' and 'full x1' with no legend ('full x1'
    is block recompute of one layer per chunk, not of every layer); the caption and the HTML
    report now spell out each abbreviation used, and say nothing when none is used."""
    from autopar.report.html import _table
    from autopar.report.table import recompute_label, recompute_notes, table_notes

    sel = Strategy(dp=8, recompute="selective", recompute_modules=MEMORY_SET)
    block = Strategy(dp=8, recompute="full", recompute_layers=1)
    assert (recompute_label(_row(sel)), recompute_label(_row(block))) == ("sel attn+act+norm+mla", "full x1")
    notes = recompute_notes([_row(sel), _row(block)])
    assert notes[0] == ("sel a+b: selective recompute of Megatron --recompute-modules: attn = core_attn, "
                        "act = moe_act, norm = layernorm, mla = mla_up_proj")
    assert notes[1].startswith("full xN: full recompute of the first N layers of each pipeline chunk "
                               "(--recompute-method block --recompute-num-layers N)")
    page = _table(SimpleNamespace(layouts=[_row(sel), _row(block)]))
    assert all(html.escape(n) in page for n in notes)
    plain = [_row(Strategy(dp=8, recompute=r)) for r in ("none", "selective", "full")]
    assert recompute_notes(plain) == [] and table_notes(plain) is None


def test_estimate_spells_out_the_recompute_modules():
    """``autopar estimate`` printed 'recompute sel attn+act+norm+mla' without saying which modules."""
    out = CliRunner().invoke(app, ["estimate", "--model", "qwen3-30b-a3b", "--device", "h100-80gb", "--ep", "8",
                                   "--etp", "1", "--zero", "1", "--recompute", "selective",
                                   "--recompute-modules", "core_attn,moe_act"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "act = moe_act" in out.output and "attn = core_attn" in out.output
