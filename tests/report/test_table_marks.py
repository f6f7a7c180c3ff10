"""The search table's layout label: split marks for the embedding/loss-aware and balanced splits."""

from __future__ import annotations

from types import SimpleNamespace

from autopar.strategy import Strategy


def test_layout_label_marks_the_embedding_loss_and_balanced_splits():
    """The table showed 'pp32x2' for a layout that only runs with Megatron's
    --account-for-embedding/loss-in-pipeline-split, and 'pp4' for a split Megatron cannot express."""
    from autopar.report.table import SPLIT_MARKS, layout_label, split_mark

    el = Strategy(dp=32, tp=8, pp=8, vpp=8, schedule="interleaved", layers_per_stage=(15, 16, 16, 16, 16, 16, 16, 15),
                  account_for_embedding=True, account_for_loss=True)
    assert layout_label(SimpleNamespace(strategy=el)) == "tp8 pp8x8+el cp1 dp32"
    assert split_mark(SimpleNamespace(strategy=Strategy(dp=2, pp=4, layers_per_stage=(7, 8, 9, 8)))) == "~"
    # Megatron's own splits are unmarked: even, and first/last lighter for 30 layers on pp 4 (7, 8, 8, 7).
    for split in ((8, 8, 8, 8), (7, 8, 8, 7)):
        assert split_mark(SimpleNamespace(strategy=Strategy(dp=2, pp=4, layers_per_stage=split))) == ""
    assert set(SPLIT_MARKS) == {"+", "~", "*"}


def test_html_table_explains_the_marks_it_uses():
    """The HTML report showed '+el' / '~' without saying what they mean; the legend is the
    terminal table's caption (split_legend), and absent when no row is marked."""
    import html

    from autopar.report.html import _table
    from autopar.report.table import BUBBLE_NOTE, SPLIT_MARKS, split_legend

    def result(*strategies):
        return SimpleNamespace(layouts=[SimpleNamespace(strategy=s, mbs=s.mbs, marginal=False, peak_memory_bytes=1.0,
                                                        step_time_s=1.0, tokens_per_s_per_device=1.0, mfu=0.5,
                                                        time_breakdown_s={"pp_bubble": 0.0}) for s in strategies])

    balanced = Strategy(dp=2, pp=4, layers_per_stage=(7, 8, 9, 8))
    assert split_legend(result(balanced).layouts) == SPLIT_MARKS["~"]
    assert html.escape(SPLIT_MARKS["~"]) in _table(result(balanced))
    plain = Strategy(dp=2, pp=4, layers_per_stage=(8, 8, 8, 8))
    assert split_legend(result(plain).layouts) is None  # only the bubble column's note, a pipeline being shown
    assert f"<p class=note>{html.escape(BUBBLE_NOTE)}</p>" in _table(result(plain))
    assert "class=note" not in _table(result(Strategy(dp=8)))  # no mark, no pipeline: no note
