"""MindSpeed's TP overlap is MC2 (a new user's MindSpeed-LLM script): the table's ``+ov`` legend
names ``--use-ascend-mc2``, not Megatron's ``--tp-comm-overlap`` (MindSpeed switches that off), and
``--write-script`` keeps a script's working ``--use-mc2`` (older MindSpeed-LLM's spelling) where the
layout keeps MC2 on, instead of replacing it with ``--use-ascend-mc2``."""

from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app
from autopar.report.table import label_legend

runner = CliRunner()


def _mindspeed_script(tmp_path, mc2_flag: str) -> str:
    path = tmp_path / "ms.sh"
    path.write_text("torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                    "--ffn-hidden-size 11008 --num-attention-heads 32 --swiglu --normalization RMSNorm "
                    "--seq-length 4096 --vocab-size 32000 --bf16 --use-flash-attn --micro-batch-size 1 "
                    "--global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 "
                    f"--sequence-parallel {mc2_flag}\n")
    return str(path)


def _rewrite(tmp_path, mc2_flag: str) -> tuple[str, str]:
    out = tmp_path / "new.sh"
    res = runner.invoke(app, ["search", "--script", _mindspeed_script(tmp_path, mc2_flag), "--device", "ascend-910b",
                              "--top", "1", "--tp", "4", "--tp-comm-overlap", "--write-script", str(out),
                              "--min-gain-pct", "0"])
    assert res.exit_code == 0, res.output
    return res.stdout, out.read_text()


def test_the_rewrite_keeps_the_scripts_use_mc2(tmp_path):
    stdout, text = _rewrite(tmp_path, "--use-mc2")
    assert "--use-mc2" in text and "--use-ascend-mc2" not in text
    assert "+ov TP communication overlapped with the GEMMs (--use-ascend-mc2)" in " ".join(stdout.split())


def test_the_current_spelling_stays_too(tmp_path):
    _, text = _rewrite(tmp_path, "--use-ascend-mc2")
    assert "--use-ascend-mc2" in text and "--use-mc2" not in text


def test_the_legend_names_each_targets_overlap_setting():
    from types import SimpleNamespace

    ov = SimpleNamespace(strategy=SimpleNamespace(sp=True, tp_comm_overlap=True, vpp=1, cp=1, ep=1, schedule="1f1b",
                                                  cp_comm_type="p2p", moe_dispatcher="alltoall", moe_ep_overlap=False,
                                                  vocab_tp_size=None, vocab_sp=False, tp_consecutive=True, tp=4))
    assert "(--use-ascend-mc2)" in label_legend([ov], "mindspeed")
    assert "(--tp-comm-overlap)" in label_legend([ov], "megatron")
