"""The layer-wise output's "best uniform layout" line explains its pipeline mark (a new user met
``pp4~`` there with no legend; the search table's legend, SPLIT_MARKS, says it)."""

from __future__ import annotations

from autopar.cli.layerwise import uniform_line
from autopar.report.table import SPLIT_MARKS


def test_a_balanced_split_mark_is_explained():
    line = uniform_line(10.5, ("tp4+sp pp4~ cp1 dp2", 10.0), 4.1)
    assert line.startswith("best uniform layout for --target galvatron: tp4+sp pp4~ cp1 dp2, step 10.000 s; the "
                           "layer-wise plan is +5.0% against it")
    assert line.endswith(f" ({SPLIT_MARKS['~']})")


def test_no_mark_no_legend_and_tp_plus_is_not_a_split_mark():
    line = uniform_line(10.0, ("tp4+sp pp4 cp1 dp2", 10.0), 4.1)
    assert line.endswith("too close to rank")


def test_a_gap_beyond_the_band_says_so():
    line = uniform_line(9.51, ("tp4+sp pp4 cp1 dp2", 10.0), 4.3)  # -4.9 % against it
    assert line.endswith("-4.9% against it, beyond autopar's ±4.3% band (its mean step-time error, MAPE, on "
                         "similar measured rows)")
    assert uniform_line(9.51, ("tp4+sp pp4 cp1 dp2", 10.0), None).endswith("-4.9% against it")
