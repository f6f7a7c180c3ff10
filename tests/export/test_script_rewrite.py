"""Rewriting a launch script: only parallel/recompute lines change, variables are followed,
and the result reads back as the requested layout."""

from __future__ import annotations

import difflib

from typer.testing import CliRunner

from autopar.cli import app
from autopar.export.rewrite import rewrite_script, script_paths
from autopar.problem import Problem
from autopar.specs import load_device, make_cluster
from autopar.specs.script import read_script, train_spec
from autopar.strategy import Strategy
from conftest import SCRIPTS

LLAMA = SCRIPTS / "pretrain_llama2_7b.sh"
MIXTRAL = SCRIPTS / "pretrain_mixtral_8x7b.sh"


def _changed(old: str, new: str) -> tuple[list[str], list[str]]:
    diff = list(difflib.ndiff(old.splitlines(), new.splitlines()))
    return [d[2:] for d in diff if d.startswith("- ")], [d[2:] for d in diff if d.startswith("+ ")]


def _problem(plan, nodes, vocab=None):
    return Problem(plan.model_spec(vocab), make_cluster(load_device("h100-80gb"), nodes, 8), train_spec(plan))


def test_llama2_rewrite_follows_variables():
    plan = read_script(LLAMA)
    p = _problem(plan, 4, 32000)
    s = Strategy(dp=4, tp=4, pp=2, vpp=2, schedule="interleaved", zero=0, recompute="selective", mbs=2)
    new = rewrite_script(plan, p, s)
    removed, added = _changed(plan.text, new)
    assert sorted(removed) == sorted(["NNODES=2", "TP=2", "PP=4", "    --sequence-parallel \\",
                                      "    --use-distributed-optimizer \\", "    --micro-batch-size 1 \\",
                                      "    --recompute-granularity full \\", "    --recompute-method uniform \\",
                                      "    --recompute-num-layers 1 \\"])
    assert sorted(added) == sorted(["NNODES=4", "TP=4", "PP=2", "    --num-virtual-stages-per-pipeline-rank 2 \\",
                                    "    --micro-batch-size 2 \\", "    --recompute-granularity selective \\"])
    back = read_script(LLAMA, new)
    assert back.layout["vpp"] == 2 and back.num_nodes == 4
    for keep in ("DATA_PATH=", "--tokenizer-model ${TOKENIZER_MODEL}", "--save $CKPT_SAVE_DIR", "tee logs/"):
        assert keep in new


def test_mixtral_rewrite_array_and_env():
    plan = read_script(MIXTRAL)
    p = _problem(plan, 4)
    s = Strategy(dp=8, tp=1, pp=4, ep=8, etp=1, zero=1, recompute="full", recompute_layers=2,
                 layers_per_stage=(7, 9, 9, 7))
    new = rewrite_script(plan, p, s)
    removed, added = _changed(plan.text, new)
    assert set(removed) == {"    --tensor-model-parallel-size 2", "    --expert-model-parallel-size 4",
                            "    --sequence-parallel"}
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" not in added  # tp=1, cp=1: not asserted by Megatron
    assert {"    --decoder-first-pipeline-num-layers 7", "    --decoder-last-pipeline-num-layers 7",
            "    --recompute-method block", "    --recompute-num-layers 2",
            "    --tensor-model-parallel-size 1", "    --expert-model-parallel-size 8"} <= set(added)
    assert read_script(MIXTRAL, new).layout["layers_per_stage"] == (7, 9, 9, 7)
    s2 = Strategy(dp=4, tp=2, pp=4, ep=4, sp=True, zero=1)
    new2 = rewrite_script(plan, p, s2)
    assert new2.startswith("#!/bin/bash\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n")
    assert _changed(plan.text, new2)[0] == []


def test_write_script_top_n(tmp_path):
    out = tmp_path / "plan.sh"
    assert [x.name for x in script_paths(out, 3)] == ["plan.sh", "plan.2.sh", "plan.3.sh"]
    res = CliRunner().invoke(app, ["search", "--script", str(MIXTRAL), "--device", "h100-80gb", "--top", "3",
                                   "--write-script", str(out), "--min-gain-pct", "0"])
    assert res.exit_code == 0, res.output
    for path in script_paths(out, 3):
        plan = read_script(path)
        assert plan.num_nodes == 4 and plan.args.text("--data-path") == "./data/my_text_document"
    bad = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--write-script", "x.sh"])
    assert bad.exit_code == 2 and "--write-script needs --script" in bad.output
    assert [x.name for x in script_paths(tmp_path / "plan", 2)] == ["plan", "plan.2"]  # no suffix invented


def test_write_script_without_top_writes_the_best_only_and_says_what_it_replaces(tmp_path):
    """Without --top, --write-script wrote ten scripts (search's default rows) over whatever was at
    OUT.2.sh ... OUT.10.sh; now it writes OUT only. With --top N the N named files are written,
    replacing what is there as export --out does, and each such ``wrote`` line says so."""
    out = tmp_path / "plan.sh"
    (tmp_path / "plan.2.sh").write_text("mine\n")
    args = ["search", "--script", str(MIXTRAL), "--device", "h100-80gb", "--write-script", str(out),
            "--min-gain-pct", "0"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.2.sh", "plan.sh"]
    assert (tmp_path / "plan.2.sh").read_text() == "mine\n"
    assert f"wrote {out} (#1, " in res.stderr
    res = CliRunner().invoke(app, [*args, "--top", "2"])
    assert res.exit_code == 0, res.output
    assert f"wrote {out} over the file there (#1, " in res.stderr
    assert f"wrote {tmp_path / 'plan.2.sh'} over the file there (#2, " in res.stderr
    assert read_script(tmp_path / "plan.2.sh").num_nodes == 4


def test_write_script_never_overwrites_its_input(tmp_path):
    """``--write-script`` naming the ``--script`` itself (or ``--top 2`` landing on it) is refused
    before anything is written: the user's launch script stays as it was."""
    script = tmp_path / "run.sh"
    script.write_text(MIXTRAL.read_text())
    for out, top in ((script, "1"), (tmp_path / "run.1.sh", "1"), (tmp_path / "x" / ".." / "run.sh", "2")):
        res = CliRunner().invoke(app, ["search", "--script", str(script), "--device", "h100-80gb", "--top", top,
                                       "--write-script", str(out), "--min-gain-pct", "0"])
        if out.name == "run.1.sh":
            assert res.exit_code == 0 and script.read_text() == MIXTRAL.read_text()
            continue
        assert res.exit_code == 2 and "would overwrite the --script" in res.output
        assert script.read_text() == MIXTRAL.read_text()
