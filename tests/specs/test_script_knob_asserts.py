"""Combinations of modelled knobs Megatron-LM main refuses are refused by the script reader and the
layout rules with Megatron's message (autopar.specs.script_knob_asserts, autopar.rules,
autopar.rules_moe); autopar accepted and costed each (issue 15, the tester's /tmp/breakit3 scripts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS, mixtral_script
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.errors import AutoparError, LayoutError
from autopar.estimate import estimate
from autopar.problem import Problem
from autopar.specs import load_device, make_cluster
from autopar.specs.script import read_script, train_spec


def _llama(tmp_path: Path, extra: str) -> Path:
    """The shipped llama2-7b script (full recompute, uniform, 1 layer) with ``extra`` after --bf16."""
    path = tmp_path / "job.sh"
    path.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("--bf16\n", f"--bf16 {extra}\n"))
    return path


def _selective(path: Path) -> Path:
    path.write_text(path.read_text().replace("--recompute-granularity full", "--recompute-granularity selective")
                    .replace("--recompute-method uniform", "").replace("--recompute-num-layers 1", ""))
    return path


@pytest.mark.parametrize("graphs", ["--cuda-graph-impl local", "--cuda-graph-impl transformer_engine",
                                    "--enable-cuda-graph", "--external-cuda-graph"])
def test_cuda_graphs_with_full_recompute_are_refused(tmp_path, graphs):
    """transformer_config.py: 'full recompute is only supported with full iteration CUDA graph.'"""
    with pytest.raises(AutoparError, match="with --recompute-granularity full: Megatron-LM main asserts 'full "
                       "recompute is only supported with full iteration CUDA graph.'"):
        read_script(_llama(tmp_path, graphs))
    assert read_script(_selective(_llama(tmp_path, graphs))).train_fields["cuda_graph_impl"] != "none"


def test_full_iteration_graph_with_full_recompute_is_read(tmp_path):
    plan = read_script(_llama(tmp_path, "--cuda-graph-impl local --cuda-graph-scope full_iteration"))
    assert plan.layout["recompute"] == "full" and plan.train_fields["cuda_graph_scope"] == ("full_iteration",)


def test_estimate_refuses_cuda_graphs_with_full_recompute():
    args = ["estimate", "--model", "llama2-7b", "--device", "h100-80gb", "--nodes", "1", "--tp", "2", "--pp", "2",
            "--recompute", "full"]
    out = CliRunner().invoke(app, [*args, "--cuda-graph-impl", "transformer_engine"])
    assert out.exit_code == 2 and "cuda_graph_no_full_recompute" in out.output
    assert CliRunner().invoke(app, [*args, "--cuda-graph-impl", "local", "--cuda-graph-scope",
                                    "full_iteration"]).exit_code == 0


def _shared_mixtral(tmp_path: Path, extra: str) -> Path:
    """The Mixtral script with a shared expert, no --moe-token-dispatcher-type (Megatron's default
    allgather), and ``extra``."""
    path = mixtral_script(tmp_path, "--moe-shared-expert-intermediate-size 14336 EXTRA")
    path.write_text(path.read_text().replace("--moe-token-dispatcher-type alltoall", "").replace("EXTRA", extra))
    return path


def test_shared_expert_overlap_with_allgather_is_refused(tmp_path):
    """transformer_config.py raises 'moe_shared_expert_overlap only works with alltoall or flex token
    dispatcher.'; autopar read the script and hid ep_comm under the shared expert."""
    with pytest.raises(AutoparError, match=r"--moe-shared-expert-overlap with the allgather token dispatcher "
                       r"\(Megatron-LM's default dispatcher\): Megatron-LM main raises"):
        read_script(_shared_mixtral(tmp_path, "--moe-shared-expert-overlap"))
    with pytest.raises(AutoparError, match="--moe-shared-expert-overlap with the allgather token dispatcher:"):
        read_script(_shared_mixtral(tmp_path, "--moe-shared-expert-overlap --moe-token-dispatcher-type allgather"))
    for kind in ("alltoall", "flex"):
        plan = read_script(_shared_mixtral(tmp_path, f"--moe-shared-expert-overlap --moe-token-dispatcher-type {kind}"))
        assert plan.train_fields["moe"]["shared_expert_overlap"]


def test_shared_expert_overlap_rule_refuses_an_allgather_layout(tmp_path):
    plan = read_script(_shared_mixtral(tmp_path, "--moe-shared-expert-overlap --moe-token-dispatcher-type alltoall"))
    p = Problem(plan.model_spec(), make_cluster(load_device("h100-80gb"), 4, 8), train_spec(plan))
    s = plan.strategy(32, 32)
    assert estimate(p, s).step_time_s > 0
    with pytest.raises(LayoutError, match="shared_overlap_dispatcher"):
        estimate(p, s.model_copy(update={"moe_dispatcher": "allgather"}))


def test_delay_wgrad_on_a_dense_model_is_refused(tmp_path):
    """transformer_config.py asserts 'overlap_moe_expert_parallel_comm must be enabled when enabling
    delay_wgrad_compute'; a dense script's estimate was byte-identical with and without it."""
    with pytest.raises(AutoparError, match="--delay-wgrad-compute without --overlap-moe-expert-parallel-comm: "
                       "Megatron-LM main asserts"):
        read_script(_llama(tmp_path, "--delay-wgrad-compute"))
    with pytest.raises(AutoparError, match="--overlap-moe-expert-parallel-comm on a model without experts"):
        read_script(_llama(tmp_path, "--delay-wgrad-compute --overlap-moe-expert-parallel-comm"))


def test_delay_wgrad_without_ep_overlap_is_refused_for_moe(tmp_path):
    with pytest.raises(AutoparError, match="--delay-wgrad-compute without --overlap-moe-expert-parallel-comm"):
        read_script(mixtral_script(tmp_path, "--delay-wgrad-compute"))


def test_local_attention_backend_is_refused(tmp_path):
    """arguments.py asserts '--attention-backend local is only supported with --spec local'; it was
    costed as unfused attention."""
    with pytest.raises(AutoparError, match="--attention-backend local: Megatron-LM main asserts '--attention-backend "
                       "local is only supported with --spec local'"):
        read_script(_llama(tmp_path, "--attention-backend local"))
    assert not read_script(_llama(tmp_path, "--attention-backend unfused")).train_fields["flash_attention"]
