"""CUDA graphs (``TrainSpec.cuda_graph_impl`` / ``cuda_graph_scope``, :mod:`autopar.cost.cuda_graph`):
host launch time removed, static buffers added; Megatron-LM's rules; read from scripts, written by
the Megatron exports, refused elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_problem
from pydantic import ValidationError
from test_script_flags import script  # a tp 2, pp 2 job on 8 devices plus the given flags

from autopar.cost import cuda_graph
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron_bridge import overrides
from autopar.problem import Problem
from autopar.specs import load_model
from autopar.specs.cluster import load_device, make_cluster
from autopar.specs.script import read_script
from autopar.specs.train import TrainSpec
from autopar.strategy import Strategy

GIB = 2**30


def test_a_graphed_part_is_one_launch_per_pass():
    # Dense layer: 8 attention ops, 12 MLP ops, 2 + 2 weight-gradient GEMMs; attention graphed.
    p = make_problem("llama2-7b", cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    ops = {"attn": np.array([8.0]), "mlp": np.array([12.0]), "router": np.zeros(1)}
    gemms = {"attn": np.array([2.0]), "mlp": np.array([2.0]), "router": np.zeros(1)}
    fwd, bwd = cuda_graph.layer_ops(p, ops, gemms, moe=False)
    assert (fwd[0], bwd[0]) == (1 + 12, 1 + 12 + 2)
    eager = cuda_graph.layer_ops(make_problem("llama2-7b"), ops, gemms, moe=False)
    assert (eager[0][0], eager[1][0]) == (20, 24)
    whole = cuda_graph.layer_ops(make_problem("llama2-7b", cuda_graph_impl="local"), ops, gemms, moe=False)
    assert (whole[0][0], whole[1][0]) == (2, 2)  # attention and MLP graphs: one launch each per pass


def test_moe_router_scope_graphs_the_router_inside_the_mlp():
    p = make_problem("qwen3-30b-a3b", cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router",))
    ops = {"attn": np.array([8.0]), "mlp": np.array([60.0]), "router": np.array([24.0])}
    gemms = {"attn": np.array([2.0]), "mlp": np.array([3.0]), "router": np.array([1.0])}
    fwd, bwd = cuda_graph.layer_ops(p, ops, gemms, moe=True)
    assert (fwd[0], bwd[0]) == (8 + 60 - 24 + 1, 8 + 2 + 60 - 24 + 1 + 3 - 1)


def _problem(host_op_s: float | None = None, **train) -> Problem:
    overrides_ = [] if host_op_s is None else [f"host_op_s={host_op_s}"]
    device = load_device("h100-80gb", overrides=overrides_)
    return Problem(load_model("llama2-7b"), make_cluster(device, 1, 8),
                   TrainSpec(global_batch_size=64, seq_len=256, **train))


def test_full_iteration_graph_removes_the_host_time():
    # Short sequences: the eager step is host-bound; one graph per step leaves the GPU time, as a
    # host that costs nothing per op would.
    s = Strategy(dp=8)
    eager = estimate(_problem(), s).step_time_s
    graphed = estimate(_problem(cuda_graph_impl="local", cuda_graph_scope=("full_iteration",)), s).step_time_s
    assert graphed < eager
    assert graphed == pytest.approx(estimate(_problem(host_op_s=0.0), s).step_time_s)


def test_graphs_leave_a_gpu_bound_step_unchanged_and_add_static_buffers():
    # Llama-3-8B, seq 8192, mbs 1, tp 1, pp 1: 2 static hidden states of 8192 x 4096 x 2 B per layer.
    s = Strategy(dp=8)
    eager = estimate(make_problem("llama3-8b", seq=8192), s)
    graphed = estimate(make_problem("llama3-8b", seq=8192, cuda_graph_impl="transformer_engine"), s)
    assert graphed.step_time_s == eager.step_time_s
    added = graphed.memory_per_stage[0].other_bytes - eager.memory_per_stage[0].other_bytes
    assert added == 2 * 8192 * 4096 * 2 * 32 == 4 * GIB
    two_parts = estimate(make_problem("llama3-8b", seq=8192, cuda_graph_impl="transformer_engine",
                                      cuda_graph_scope=("attn", "mlp")), s)
    assert two_parts.memory_per_stage[0].other_bytes - eager.memory_per_stage[0].other_bytes == 8 * GIB


@pytest.mark.parametrize("fields, message", [
    (dict(cuda_graph_scope=("attn",)), "a scope needs an implementation"),
    (dict(cuda_graph_impl="local", cuda_graph_scope=("attn",)), "local takes full_iteration or no scope"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=("full_iteration",)), "needs the local implementation"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_preprocess",)), "together with moe_router"),
    (dict(cuda_graph_impl="local", framework="torchtitan"), "CUDA graph capture of training is Megatron-LM's"),
])
def test_megatron_rules_for_graph_scopes(fields, message):
    with pytest.raises(ValidationError, match=message):
        TrainSpec(global_batch_size=8, seq_len=128, **fields)


@pytest.mark.parametrize("flags, impl, scope", [
    ("--enable-cuda-graph", "local", ()),
    ("--enable-cuda-graph --cuda-graph-scope full_iteration", "local", ("full_iteration",)),
    ("--external-cuda-graph", "transformer_engine", ()),
    ("--num-experts 8 --cuda-graph-impl transformer_engine --cuda-graph-scope attn moe_router moe_preprocess",
     "transformer_engine", ("attn", "moe_router", "moe_preprocess")),  # MoE scopes need MoE layers
])
def test_scripts_name_their_graphs(tmp_path, flags, impl, scope):
    train = read_script(script(tmp_path, flags)).train_fields
    assert (train["cuda_graph_impl"], train["cuda_graph_scope"]) == (impl, scope)


@pytest.mark.parametrize("flags, message", [
    ("--cuda-graph-impl cudnn", "--cuda-graph-impl='cudnn': allowed none, local, transformer_engine"),
    ("--external-cuda-graph --cuda-graph-impl local", "--external-cuda-graph means --cuda-graph-impl transformer_engine"),
    ("--cuda-graph-scope attn", "--cuda-graph-scope attn without --cuda-graph-impl"),
    ("--cuda-graph-impl transformer_engine --cuda-graph-scope layer", "--cuda-graph-scope='layer': allowed attn"),
])
def test_scripts_with_graphs_autopar_cannot_cost_are_refused(tmp_path, flags, message):
    with pytest.raises(AutoparError, match=message):
        read_script(script(tmp_path, flags))


def test_megatron_exports_write_the_graphs_and_the_others_refuse():
    p = make_problem("llama3-8b", cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "mlp"))
    s = Strategy(dp=8)
    assert "--cuda-graph-impl transformer_engine --cuda-graph-scope attn mlp" in WRITERS["megatron"](p, s)
    ov = overrides(p, s)
    assert (ov["model.cuda_graph_impl"], ov["model.cuda_graph_scope"]) == ("transformer_engine", ["attn", "mlp"])
    for fmt in ("torchtitan", "deepspeed", "galvatron", "sapp"):
        with pytest.raises(AutoparError, match=f"export --format {fmt}: CUDA graph capture"):
            WRITERS[fmt](p, Strategy(dp=8, zero=3) if fmt == "torchtitan" else s)
    with pytest.raises(AutoparError, match="MindSpeed-LLM: CUDA graphs are NVIDIA's"):
        WRITERS["mindspeed"](p, s)
