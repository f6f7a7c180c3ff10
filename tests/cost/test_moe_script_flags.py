"""Every MoE flag of issue 17 read from a launch script changes the estimate the way it should:
a Megatron-LM launch of DeepSeek-V3 (4 layers: 1 dense + 3 MoE, 256 experts, ep 32 over four
8-GPU H100 nodes, where a pass's all-to-all outlasts a layer's forward), with one flag added at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.estimate import estimate
from autopar.problem import Problem
from autopar.specs import load_device, make_cluster
from autopar.specs.script import read_script, train_spec

BASE = ("--num-layers 4 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128 "
        "--seq-length 4096 --max-position-embeddings 4096 --vocab-size 129280 --swiglu --normalization RMSNorm "
        "--disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope "
        "--attention-dropout 0.0 --hidden-dropout 0.0 --bf16 "
        "--num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 --moe-layer-freq '([0]+[1]*3)' "
        "--moe-shared-expert-intermediate-size 2048 --moe-grouped-gemm "
        "--micro-batch-size 1 --global-batch-size 128 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 1 --expert-model-parallel-size 32 --use-distributed-optimizer")


def _estimate(tmp_path: Path, extra: str, imbalance: float = 1.0):
    """The estimate of BASE + ``extra``; the alltoall dispatcher unless ``extra`` names one (Megatron-LM's
    default is allgather, test_a_script_without_a_dispatcher_runs_allgather)."""
    if "--moe-token-dispatcher-type" not in extra:
        extra = "--moe-token-dispatcher-type alltoall " + extra
    path = tmp_path / f"job{abs(hash(extra))}.sh"
    path.write_text(f"torchrun --nnodes 4 --nproc_per_node 8 pretrain_gpt.py {BASE} {extra}\n")
    plan = read_script(path)
    p = Problem(plan.model_spec(), make_cluster(load_device("h100-80gb"), 4, 8),
                train_spec(plan, moe_token_imbalance=imbalance))
    return estimate(p, plan.strategy(32, 4)), p


def _ep_s(est) -> float:
    return est.time_breakdown_s["ep_comm"]


@pytest.fixture
def base(tmp_path):
    return _estimate(tmp_path, "")[0]


def test_dispatcher_type_allgather_costs_its_gather(tmp_path, base):
    """The all-gather moves every token of the 32 ranks once (a ring over all NICs of the nodes),
    the alltoall k = 8 copies of each, 28/32 of them through the rank's own NIC: across nodes with
    top-8 the gather is the cheaper (autopar.cost.moe_dispatch)."""
    est, p = _estimate(tmp_path, "--moe-token-dispatcher-type allgather")
    assert est.strategy.moe_dispatcher == "allgather" and 0 < _ep_s(est) < _ep_s(base)


def test_a_script_without_a_dispatcher_runs_allgather(tmp_path):
    """Megatron-LM main transformer_config.py: ``moe_token_dispatcher_type ... = "allgather"`` (the argument
    parser's default); autopar read such a script as alltoall."""
    path = tmp_path / "job.sh"
    path.write_text(f"torchrun --nnodes 4 --nproc_per_node 8 pretrain_gpt.py {BASE}\n")
    plan = read_script(path)
    assert plan.layout["moe_dispatcher"] == "allgather"
    gathered, _ = _estimate(tmp_path, "--moe-token-dispatcher-type allgather")
    p = Problem(plan.model_spec(), make_cluster(load_device("h100-80gb"), 4, 8), train_spec(plan))
    assert _ep_s(estimate(p, plan.strategy(32, 4))) == pytest.approx(_ep_s(gathered))


def test_flex_deepep_sends_less_across_nodes(tmp_path, base):
    est, _ = _estimate(tmp_path, "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep")
    assert est.strategy.moe_dispatcher == "deepep" and _ep_s(est) < _ep_s(base)
    old, _ = _estimate(tmp_path, "--moe-token-dispatcher-type flex --moe-enable-deepep")
    assert old.strategy.moe_dispatcher == "deepep" and _ep_s(old) == pytest.approx(_ep_s(est))


def test_flex_hybridep_backend_is_read(tmp_path):
    est, _ = _estimate(tmp_path, "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep")
    assert est.strategy.moe_dispatcher == "hybridep"


def test_permute_fusion_saves_time(tmp_path, base):
    fused, p = _estimate(tmp_path, "--moe-permute-fusion")
    assert p.train.moe.permute_fusion and not _estimate(tmp_path, "")[1].train.moe.permute_fusion
    assert fused.step_time_s < base.step_time_s


def test_router_fusion_saves_time(tmp_path, base):
    fused, p = _estimate(tmp_path, "--moe-router-fusion")
    assert p.train.moe.router_fusion and fused.step_time_s < base.step_time_s


def test_shared_expert_overlap_hides_all_to_all(tmp_path, base):
    est, _ = _estimate(tmp_path, "--moe-shared-expert-overlap")
    assert _ep_s(est) < _ep_s(base)


def test_ep_overlap_hides_all_to_all(tmp_path, base):
    est, _ = _estimate(tmp_path, "--overlap-moe-expert-parallel-comm")
    assert est.strategy.moe_ep_overlap and _ep_s(est) < _ep_s(base)


def test_delay_wgrad_hides_more_under_the_overlap(tmp_path):
    """With the fused permutation (``--moe-permute-fusion``) a pass's all-to-all outlasts the MoE layer's
    forward (unfused, the extra passes over the copies and the alltoall dispatcher's sort by local expert
    make the forward long enough to hide it all): the delayed weight gradients hide part of the rest."""
    overlap, _ = _estimate(tmp_path, "--overlap-moe-expert-parallel-comm --moe-permute-fusion")
    delayed, p = _estimate(tmp_path, "--overlap-moe-expert-parallel-comm --moe-permute-fusion --delay-wgrad-compute")
    assert p.train.moe.delay_wgrad and _ep_s(delayed) < _ep_s(overlap)


def test_force_load_balancing_removes_routing_skew(tmp_path):
    skewed, _ = _estimate(tmp_path, "", imbalance=1.5)
    forced, p = _estimate(tmp_path, "--moe-router-force-load-balancing", imbalance=1.5)
    balanced, _ = _estimate(tmp_path, "")
    assert p.train.moe.force_balance
    assert forced.step_time_s == pytest.approx(balanced.step_time_s)
    assert forced.step_time_s < skewed.step_time_s
    assert forced.peak_memory_bytes < skewed.peak_memory_bytes


def test_capacity_factor_drops_the_skew_above_it(tmp_path):
    skewed, _ = _estimate(tmp_path, "", imbalance=2.0)
    capped, _ = _estimate(tmp_path, "--moe-expert-capacity-factor 1.25", imbalance=2.0)
    padded, _ = _estimate(tmp_path, "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity")
    balanced, _ = _estimate(tmp_path, "")
    assert balanced.step_time_s < capped.step_time_s < skewed.step_time_s
    assert padded.step_time_s == pytest.approx(capped.step_time_s)


def test_router_padding_for_fp8_spares_the_padding_copies(tmp_path):
    """With ``--moe-router-padding-for-fp8`` the router pads each expert's count, so Transformer Engine's
    Fp8Padding copies nothing (autopar.cost.moe_fp8_padding): the fp8 step is exactly the copies faster."""
    from autopar.cost import moe_fp8_padding

    copied, p = _estimate(tmp_path, "--fp8-format hybrid")
    padded, q = _estimate(tmp_path, "--fp8-format hybrid --moe-router-padding-for-fp8")
    assert moe_fp8_padding.applies(p) and not moe_fp8_padding.applies(q)
    assert q.train.moe.router_padding_for_fp8 and padded.step_time_s < copied.step_time_s


def test_bad_values_are_one_error_line(tmp_path):
    from autopar.errors import AutoparError

    for extra, message in (("--moe-token-dispatcher-type fancy", "--moe-token-dispatcher-type='fancy'"),
                           ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend nccl",
                            "--moe-flex-dispatcher-backend='nccl'"),
                           ("--moe-flex-dispatcher-backend hybridep", "applies to the flex dispatcher only"),
                           ("--moe-token-drop-policy random", "--moe-token-drop-policy='random'"),
                           ("--moe-pad-expert-input-to-capacity", "without a --moe-expert-capacity-factor"),
                           ("--moe-router-padding-for-fp8", "without --fp8-format")):
        with pytest.raises(AutoparError, match=message):
            _estimate(tmp_path, extra)
