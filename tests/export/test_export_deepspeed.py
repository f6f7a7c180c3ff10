"""``autopar export --format deepspeed``: the DeepSpeed JSON plus the Megatron-DeepSpeed launch.

Expected values by hand: llama3-8b on 2 nodes x 8 GPUs, gbs 256. tp2 pp2 -> dp = 16 / 4 = 4;
mbs 2 -> gradient_accumulation_steps = 256 / (2 * 4) = 32 (DeepSpeed's batch assertion,
ecosystem.md 4.1). Flag spellings: Megatron-DeepSpeed (see autopar.export.megatron_deepspeed).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import WRITERS, megatron_deepspeed
from autopar.strategy import Strategy
from conftest import make_problem

P = make_problem("llama3-8b", nodes=2, gbs=256, seq=4096)
TP2_PP2 = Strategy(dp=4, tp=2, pp=2, zero=1, mbs=2, recompute="full")
BASE = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "256", "--seq-len", "4096"]


def _embedded_json(script: str) -> dict:
    """The here-document the stdout script writes to ds_config.json."""
    return json.loads(script.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])


def _args(script: str) -> list[str]:
    """The words after ``pretrain_gpt.py`` (continuations joined, shell quoting kept verbatim)."""
    launch = script.split("torchrun ", 1)[1].replace("\\\n", " ")
    return launch.split("pretrain_gpt.py", 1)[1].split()


def _value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, flag
    return args[args.index(flag) + 1]


def test_tp2_pp2_zero1_full_recompute_flags_and_batch_agree():
    script = WRITERS["deepspeed"](P, TP2_PP2)
    args, doc = _args(script), _embedded_json(script)
    assert _value(args, "--tensor-model-parallel-size") == "2" and _value(args, "--pipeline-model-parallel-size") == "2"
    assert "--no-pipeline-parallel" not in args and _value(args, "--zero-stage") == "1"
    assert {"--checkpoint-activations", "--deepspeed-activation-checkpointing", "--deepspeed", "--bf16"} <= set(args)
    assert _value(args, "--checkpoint-num-layers") == "1" and "--recompute-granularity" not in args
    assert _value(args, "--num-key-value-heads") == "8" and _value(args, "--normalization") == "rmsnorm"
    # The JSON's batch numbers are the arguments' and DeepSpeed's assertion holds with dp = 4.
    assert doc["train_batch_size"] == int(_value(args, "--global-batch-size")) == 256
    assert doc["train_micro_batch_size_per_gpu"] == int(_value(args, "--micro-batch-size")) == 2
    assert doc["gradient_accumulation_steps"] == 256 // (2 * 4) == 32
    assert doc["zero_optimization"]["stage"] == 1 and "activation_checkpointing" in doc
    assert script.startswith("#!/bin/bash\n") and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script


def test_pp1_adds_no_pipeline_parallel_and_selective_recompute():
    args = _args(WRITERS["deepspeed"](P, Strategy(dp=8, tp=2, sp=True, zero=2, recompute="selective")))
    assert "--no-pipeline-parallel" in args and _value(args, "--pipeline-model-parallel-size") == "1"
    assert "--sequence-parallel" in args and _value(args, "--zero-stage") == "2"
    assert _value(args, "--recompute-granularity") == "selective" and "--checkpoint-activations" not in args


@pytest.mark.parametrize(("model", "layout", "reason"), [
    ("llama3-8b", dict(dp=4, pp=4, layers_per_stage=(7, 9, 8, 8)), "split 7,9,8,8"),
    ("llama3-8b", dict(dp=8, pp=2, recompute="full", recompute_layers=4), "block recompute"),
    ("mixtral-8x7b", dict(dp=16, zero=1), "MoE"),
    ("llama3-8b", dict(dp=8, pp=2, zero=2), "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    # Megatron-DeepSpeed's parallel_state.initialize_model_parallel: Ulysses only with tp = pp = 1
    ("llama3-8b", dict(dp=4, tp=2, cp=2, cp_comm_type="a2a", zero=2),
     "cp=2 with tp=2, pp=1: .*does not work with tensor parallel or pipeline parallel"),
    ("llama3-8b", dict(dp=2, tp=2, pp=2, cp=2, cp_comm_type="a2a", zero=1),
     "cp=2 with tp=2, pp=2: .*does not work with tensor parallel or pipeline parallel"),
])
def test_refuses_what_megatron_deepspeed_cannot_say(model, layout, reason):
    with pytest.raises(AutoparError, match=reason):
        WRITERS["deepspeed"](make_problem(model, nodes=2, gbs=256), Strategy(**layout))


def _run_with_stub_torchrun(tmp_path, script_path):
    """Run the script with a ``torchrun`` stub that records its arguments; returns them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "torchrun"
    stub.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$TORCHRUN_ARGS"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / "torchrun_args.txt"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TORCHRUN_ARGS=str(record))
    subprocess.run(["bash", str(script_path)], cwd="/", env=env, check=True, timeout=30)
    return record.read_text().split("\n")


def test_stdout_script_runs_unchanged_and_writes_its_config(tmp_path):
    """The stdout form, saved and run from another directory, writes ds_config.json next to
    itself and hands torchrun that file's path."""
    res = CliRunner().invoke(app, ["export", "--format", "deepspeed", *BASE, "--tp", "2", "--pp", "2", "--zero", "1",
                                   "--mbs", "2", "--recompute", "full"])
    assert res.exit_code == 0, res.output
    (tmp_path / "run").mkdir()
    script = tmp_path / "run" / "launch.sh"
    script.write_text(res.stdout)
    words = _run_with_stub_torchrun(tmp_path, script)
    config = words[words.index("--deepspeed_config") + 1]
    assert config == str(tmp_path / "run" / "ds_config.json")
    assert json.loads((tmp_path / "run" / "ds_config.json").read_text())["gradient_accumulation_steps"] == 32


@pytest.mark.parametrize("out", ["dir", "cfg/my_ds.json"])
def test_out_writes_config_and_script_that_references_it(tmp_path, out):
    target = tmp_path / out
    res = CliRunner().invoke(app, ["export", "--format", "deepspeed", *BASE, "--tp", "2", "--pp", "1", "--zero", "1",
                                   "--out", str(target)])
    assert res.exit_code == 0, res.output
    json_path = target if out.endswith(".json") else target / megatron_deepspeed.CONFIG_NAME
    script = json_path.parent / megatron_deepspeed.SCRIPT_NAME
    assert json_path.is_file() and script.is_file() and os.access(script, os.X_OK)
    doc = json.loads(json_path.read_text())
    assert doc["gradient_accumulation_steps"] == 256 // (1 * 8)  # dp = 16 / 2
    text = script.read_text()
    assert f'"$(dirname "$0")"/{shlex.quote(json_path.name)}' in text and "<<'EOF'" not in text
    words = _run_with_stub_torchrun(tmp_path, script)
    assert words[words.index("--deepspeed_config") + 1] == str(json_path) and "--no-pipeline-parallel" in words


def test_out_of_another_kind_is_one_error_line(tmp_path):
    res = CliRunner().invoke(app, ["export", "--format", "deepspeed", *BASE, "--out", str(tmp_path / "x.txt")])
    assert res.exit_code == 2 and "give a directory or a .json path" in res.output and "Traceback" not in res.output
