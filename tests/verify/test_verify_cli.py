"""autopar verify end to end on CPU: write, launch with a real torchrun, parse, re-rank; and small runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.estimate import estimate
from autopar.profile.opdb import OpDB
from autopar.strategy import Strategy
from autopar.verify.shrink import shrink
from conftest import make_problem
from json_schema_support import assert_valid

# A stand-in for Megatron-LM's pretrain_gpt.py: it checks the short-run flags it is given and
# prints Megatron's iteration and memory lines (formats of megatron/training/training.py and
# utils.py) from its own timing; a real framework does not run on this CPU-only machine.
PRETRAIN = '''import os, sys, time
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1]
assert "--mock-data" in args and "--save" not in args and "--load" not in args, "AssertionError: short-run flags"
iters, gbs, mbs = int(value("--train-iters")), int(value("--global-batch-size")), int(value("--micro-batch-size"))
if int(os.environ["RANK"]) == 0:
    for i in range(1, iters + 1):
        t = time.monotonic()
        time.sleep(0.02 * mbs)
        ms = (time.monotonic() - t) * 1e3
        print(f" iteration {i:8d}/{iters:8d} | consumed samples: {i * gbs:12d} | elapsed time per iteration (ms): "
              f"{ms:.1f} | global batch size: {gbs:5d} | lm loss: 1.0E+01 |", flush=True)
        if i == 1:
            print("[Rank 0] (after 1 iterations) memory (MB) | allocated: 10.0 | max allocated: 20.0 | "
                  "reserved: 30.0 | max reserved: 40.0", flush=True)
'''
SCRIPT = """#!/bin/bash
CKPT=./ckpt
python -m torch.distributed.run --nnodes 1 --nproc_per_node 2 pretrain_gpt.py \\
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 \\
    --vocab-size 1000 --micro-batch-size 1 --global-batch-size 8 --bf16 \\
    --train-iters 100000 --data-path ./data/text_document --save $CKPT --load $CKPT
"""


@pytest.mark.torchrun
def test_verify_runs_the_top_layouts_and_reranks(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("CPU torch not installed (pip install torch==2.13.0)")
    work = tmp_path / "megatron"
    work.mkdir()
    (work / "pretrain_gpt.py").write_text(PRETRAIN)
    script = work / "train.sh"
    script.write_text(SCRIPT)
    before = {p: p.read_bytes() for p in work.iterdir()}
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "verify"
    res = CliRunner().invoke(app, ["verify", "--script", str(script), "--device", "h100-80gb", "--top", "2",
                                   "--iters", "5", "--out", str(out), "--workdir", str(work), "--time-limit-s", "120",
                                   "--record", str(tmp_path / "runs.db"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # the document alone: progress and 'wrote' lines are on stderr
    assert_valid("verify", doc)
    assert doc["runs"] == 2 and doc["failed"] == 0, doc
    rows = doc["layouts"]
    assert [r["measured_rank"] for r in rows] == [1, 2]
    assert rows[0]["measured"]["tokens_per_s"] >= rows[1]["measured"]["tokens_per_s"] > 0
    assert all(r["measured"]["peak_allocated_bytes"] == 20.0 * 2**20 for r in rows)
    assert all(r["predicted"]["step_time_s"] > 0 and r["step_time_error"] is not None for r in rows)
    assert {p: p.read_bytes() for p in work.iterdir()} == before  # nothing written into the user's folder
    runs = OpDB(tmp_path / "runs.db", write=False).runs("h100-80gb")
    assert [r["step_time_s"] for r in runs] == [r["measured"]["step_time_s"] for r in sorted(rows, key=lambda r: r["search_rank"])]
    again = CliRunner().invoke(app, ["verify", "--report-only", "--out", str(out), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["layouts"] == rows  # re-read from the job folders' logs
    missing = CliRunner().invoke(app, ["verify", "--report-only", "--out", str(work)])
    assert missing.exit_code == 2 and "holds no jobs autopar verify wrote" in missing.output


def test_small_run_keeps_the_per_device_shapes():
    p = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192)
    s = Strategy(dp=8, tp=4, pp=2, mbs=1, sp=True, zero=1)  # 64 devices
    small = shrink(p, s, 16)
    t = small.strategy
    assert (t.tp, t.cp, t.mbs, t.pp, t.dp) == (4, 1, 1, 2, 2)  # 16 devices, both stages kept
    assert small.problem.model.num_layers == 80  # 40 layers per stage, as in the full plan
    assert small.problem.train.global_batch_size == 2 * 64  # 64 micro-batches per step, as in the full plan
    assert small.problem.cluster.num_nodes == 2 and small.problem.train.seq_len == 8192
    tiny = shrink(p, s, 8)
    assert (tiny.strategy.pp, tiny.strategy.dp, tiny.problem.model.num_layers) == (2, 1, 80)
    note = tiny.stands_for(p, estimate(p, s))
    assert "tp4 pp2 dp8" in note["layout"] and "data-parallel gradient traffic over 8 ranks on 8 nodes" in note["note"]
    with pytest.raises(Exception, match="--max-devices=2"):
        shrink(p, s, 2)
