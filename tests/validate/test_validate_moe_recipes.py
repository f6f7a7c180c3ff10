"""MoE rows of the validation CSV take their source recipe's MoE knobs (autopar.validate.moe_recipes),
each recorded as assumed; Megatron-Bridge rows score on that source's family, not generic defaults."""

from __future__ import annotations

from autopar.validate.measurements import Row, read_rows
from autopar.validate.moe_recipes import MBR_KNOBS, gpu_family
from autopar.validate.rows import family_of, to_case
from autopar.validate.score import score_rows
from conftest import MEASUREMENTS

ROWS = {r.id: r for r in read_rows(MEASUREMENTS)}


def test_megatron_bridge_rows_have_their_family():
    assert family_of(ROWS["MBR-2511-H100-5"]).name == "megatron-bridge"
    assert family_of(ROWS["MBR-2511-H100-1"]).name == "megatron-bridge"  # dense rows too


def test_qwen3_235b_h100_scores_with_expert_tensor_parallel_1():
    """tp 2 x ep 32 x pp 8 only fits 256 GPUs with etp 1, as the recipe sets (before: refused)."""
    case = to_case(ROWS["MBR-2511-H100-6"])
    s, train = case.strategy, case.problem.train
    assert s.expert_tp == 1 and s.moe_dispatcher == "alltoall" and s.moe_ep_overlap and not s.tp_comm_overlap
    assert train.grad_dtype == "bf16" and train.moe.router_fusion and train.moe.force_balance
    assert any(a.startswith("MoE recipe (Megatron-Bridge") for a in case.assumed)
    result = next(r for r in score_rows([ROWS["MBR-2511-H100-6"]]))
    assert result.predicted is not None


def test_each_megatron_bridge_moe_row_has_a_recipe_entry():
    for row in ROWS.values():
        if row.id.startswith("MBR") and (row.int("num_experts") or 0) > 1:
            assert (row["model"].lower(), gpu_family(row)) in MBR_KNOBS, row.id


def test_recipe_knobs_per_gpu():
    """Megatron-Bridge v0.2.0 (25.11): QWEN3_30B_A3B_H100_FP8_CS sets no flex backend (the provider's
    alltoall) and moe_a2a_overlap=True; GPT-OSS H100 recomputes layernorm and moe_act."""
    assert to_case(ROWS["MBR-2511-GB200-3"]).strategy.moe_dispatcher == "hybridep"
    qwen = to_case(ROWS["MBR-2511-H100-5"]).strategy
    assert qwen.moe_dispatcher == "alltoall" and qwen.moe_ep_overlap
    gpt = to_case(ROWS["MBR-2511-H100-4"]).strategy
    assert gpt.recompute == "selective" and gpt.recompute_modules == ("layernorm", "moe_act")


def test_gpt_oss_gb200_runs_without_a2a_overlap():
    """The a2a overlap entered the GPT-OSS configs after the 25.11 release (module docstring)."""
    assert not to_case(ROWS["MBR-2511-GB200-2"]).strategy.moe_ep_overlap


def test_cuda_graph_scopes_of_the_release_configs():
    """DEEPSEEK_V3_GB300: cuda_graph_impl transformer_engine, scope attn + moe_router + moe_preprocess;
    DEEPSEEK_V3_GB200: moe_router + moe_preprocess; GPT-OSS on H100: no graphs."""
    gb300 = to_case(ROWS["MBR-2511-GB300-1"])
    train = gb300.problem.train
    assert train.cuda_graph_impl == "transformer_engine"
    assert train.cuda_graph_scope == ("attn", "moe_router", "moe_preprocess")
    assert any("cuda_graph_scope=('attn', 'moe_router', 'moe_preprocess')" in a for a in gb300.assumed)
    assert to_case(ROWS["MBR-2511-GB200-1"]).problem.train.cuda_graph_scope == ("moe_router", "moe_preprocess")
    assert to_case(ROWS["MBR-2511-H100-4"]).problem.train.cuda_graph_impl == "none"


def test_other_sources():
    dgxc = to_case(ROWS["DGXC2505-DSV3-H100-BF16-512"])
    assert dgxc.problem.train.moe.permute_fusion and dgxc.strategy.moe_dispatcher == "alltoall"
    # NeMo 6f2c6fd deepseek_v3.py: MegatronCommOverlapCallback(tp_comm_overlap=False); Grok-1's sets True.
    assert dgxc.strategy.tp == 2 and not dgxc.strategy.tp_comm_overlap
    assert any("tp_comm_overlap=False" in a for a in dgxc.assumed)
    assert to_case(ROWS["DGXC2505-GROK1-H100-BF16-512"]).strategy.tp_comm_overlap
    auto = to_case(ROWS["AUTOMODEL-DSV3-256"])
    assert auto.strategy.moe_dispatcher == "deepep" and auto.problem.train.moe.force_balance


def test_dense_rows_are_untouched():
    case = to_case(ROWS["MBR-2511-H100-1"])
    assert not any(a.startswith("MoE recipe") for a in case.assumed)
    assert case.problem.train.moe == type(case.problem.train.moe)()


def test_gpt_oss_b200_takes_the_release_configs_expert_parallel_size():
    """25.11 table: GPT-OSS B200 EP 8 with MBS 4; every config with MBS 4 sets EP 64 (MBR_LAYOUT_FIXES).
    With 128 experts over ep 64 each rank holds 2 experts, and its dispatch crosses the 8 DGX-B200 nodes."""
    case = to_case(ROWS["MBR-2511-B200-1"])
    assert ROWS["MBR-2511-B200-1"].int("ep") == 8
    assert case.strategy.ep == 64 and case.strategy.mbs == 4 and case.strategy.dp == 64
    assert any(a.startswith("layout from the release config") and "ep': 64" in a for a in case.assumed)


def test_layout_fixes_leave_other_rows_alone():
    """Only the GPT-OSS B200 25.11 row: the H100 GPT-OSS row keeps its table EP 8, and so does any
    other release's row of the same model and GPU."""
    assert to_case(ROWS["MBR-2511-H100-4"]).strategy.ep == 8
    cells = dict(ROWS["MBR-2511-B200-1"].cells, id="MBR-2509-B200-X")
    assert to_case(Row(cells)).strategy.ep == 8
