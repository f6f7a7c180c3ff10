"""The ranking table's caption says what the layout label's suffixes mean, only those that appear
(new-user report: 'ep256/etp1:deepep+a2a', '+sp+ov', 'x16*' were unexplained)."""

from __future__ import annotations

from types import SimpleNamespace

from autopar.report.table import label_legend, layout_label, table_notes
from autopar.strategy import Strategy


def _rows(*strategies):
    return [SimpleNamespace(strategy=s) for s in strategies]


def test_dense_suffixes_explained():
    s = Strategy(dp=2, tp=4, sp=True, tp_comm_overlap=True, pp=4, vpp=5, schedule="interleaved", cp=2,
                 cp_comm_type="allgather")
    assert layout_label(_rows(s)[0]) == "tp4+sp+ov pp4x5 cp2:allgather dp2"
    assert label_legend(_rows(s)) == (
        "layout: +sp sequence parallelism; +ov TP communication overlapped with the GEMMs (--tp-comm-overlap); "
        "ppPxV V virtual stages (model chunks) per pipeline rank, interleaved; cpN:allgather K/V all-gather "
        "(the p2p ring is unmarked)")


def test_moe_suffixes_explained():
    s = Strategy(dp=256, ep=256, etp=1, moe_dispatcher="deepep", moe_ep_overlap=True, pp=2, vpp=2,
                 schedule="interleaved")
    assert layout_label(_rows(s)[0]) == "tp1 pp2x2 cp1 dp256 ep256/etp1:deepep+a2a"
    assert label_legend(_rows(s)) == (
        "layout: ppPxV V virtual stages (model chunks) per pipeline rank, interleaved; epE/etpT expert-parallel and "
        "expert tensor-parallel sizes; :deepep MoE token dispatcher (alltoall is unmarked); +a2a EP all-to-all "
        "overlapped with another micro-batch's compute (--overlap-moe-expert-parallel-comm)")


def test_galvatron_marks_explained():
    s = Strategy(dp=2, tp=2, vocab_tp=4, tp_consecutive=False)
    assert layout_label(_rows(s)[0]) == "tp2 pp1 cp1 dp2 vtp4 tp-nc"
    assert label_legend(_rows(s)) == ("layout: vtpN vocabulary layers at tp N; tp-nc TP groups strided over the "
                                      "data-parallel ranks")


def test_plain_labels_need_no_legend():
    plain = _rows(Strategy(dp=8), Strategy(dp=4, tp=2))
    assert label_legend(plain) is None and table_notes(plain) is None


def test_legend_leads_the_table_notes():
    notes = table_notes(_rows(Strategy(dp=4, tp=2, sp=True))).splitlines()
    assert notes == ["layout: +sp sequence parallelism"]
