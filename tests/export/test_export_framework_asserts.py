"""What each writer emits against the framework assertions it must pass (the real-client runs
of tests/test_realclients.py check the same on the frameworks' own code where installed).

* Megatron-LM ``validate_args``: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` is required for tp/cp > 1
  without FSDP and refused with ``--use-megatron-fsdp`` ("FSDP requires
  CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.");
* Megatron-DeepSpeed: block recompute runs without the DeepSpeed pipeline (pp = 1);
* torchtitan: the sections override what the model's own train config turns on.
"""

from __future__ import annotations

import json

import pytest

from autopar.export import WRITERS, megatron_deepspeed
from autopar.export.rewrite import FSDP_MAX_CONNECTIONS, rewrite_script
from autopar.problem import Problem
from autopar.specs import load_device, make_cluster
from autopar.specs.script import read_script, train_spec
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem

ENV_LINE = "export CUDA_DEVICE_MAX_CONNECTIONS=1"


@pytest.mark.parametrize("layout, env", [
    (dict(dp=4, tp=2, sp=True, zero=1), True),    # tp > 1, distributed optimizer: asserted
    (dict(dp=4, cp=2, zero=0), True),             # cp > 1: asserted
    (dict(dp=4, tp=2, sp=True, zero=3), False),   # Megatron-FSDP: refused
    (dict(dp=4, cp=2, zero=2), False),
    (dict(dp=8, zero=1), False),                  # tp = cp = 1: nothing asserted
])
def test_megatron_max_connections_follows_fsdp(layout, env):
    text = WRITERS["megatron"](make_problem("llama3-8b", gbs=64), Strategy(**layout))
    assert (ENV_LINE in text) == env
    assert ("--use-megatron-fsdp" in text) == (layout["zero"] >= 2)


def test_rewrite_to_fsdp_lifts_the_scripts_max_connections_of_one():
    """The Llama-2 script exports CUDA_DEVICE_MAX_CONNECTIONS=1 with tp 2; rewritten to ZeRO-3
    (Megatron-FSDP) the value becomes CUDA's default 8, and nothing else about the variable."""
    path = SCRIPTS / "pretrain_llama2_7b.sh"
    plan = read_script(path)
    p = Problem(plan.model_spec(32000), make_cluster(load_device("h100-80gb"), 1, 8), train_spec(plan))
    new = rewrite_script(plan, p, Strategy(dp=4, tp=2, sp=True, zero=3))
    assert ENV_LINE in plan.text and ENV_LINE not in new
    assert f"export CUDA_DEVICE_MAX_CONNECTIONS={FSDP_MAX_CONNECTIONS}" in new
    assert ENV_LINE in rewrite_script(plan, p, Strategy(dp=4, tp=2, sp=True, zero=1))


def test_deepspeed_block_recompute_without_pipeline():
    """pp = 1: Megatron-DeepSpeed's ParallelTransformer runs --recompute-method block N itself
    (no DeepSpeed activation checkpointing); with pp > 1 the DeepSpeed pipeline cannot."""
    p = make_problem("llama3-8b", gbs=64)
    s = Strategy(dp=8, zero=1, recompute="full", recompute_layers=8)
    args = " ".join(megatron_deepspeed.layout_args(p, s))
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 8" in args
    assert "--checkpoint-activations" not in args and "--deepspeed-activation-checkpointing" not in args
    assert "activation_checkpointing" not in json.loads(megatron_deepspeed.config_json(p, s))
    with pytest.raises(Exception, match="block recompute.*pp=2"):
        WRITERS["deepspeed"](p, Strategy(dp=4, pp=2, zero=1, recompute="full", recompute_layers=2))


@pytest.mark.parametrize("precision, converters", [("bf16", []), ("fp8", ["quantize.linear.float8"])])
def test_torchtitan_writes_what_the_plan_needs(precision, converters):
    """Merged into torchtitan's llama3_405b.toml (converters = ["float8"], async TP, compile on),
    a bf16 plan must switch all three off; pp = 1 is written too."""
    from autopar.export import torchtitan
    doc = torchtitan.config(make_problem("llama3-8b", gbs=64, precision=precision), Strategy(dp=4, tp=2, sp=True,
                                                                                             zero=3))
    assert doc["model"] == {"converters": converters} and doc["compile"] == {"enable": False}
    assert doc["parallelism"]["enable_async_tensor_parallel"] is False
    assert doc["parallelism"]["pipeline_parallel_degree"] == 1
