"""Data-parallel gradient reduction of the measured runs (autopar.validate.data_parallel)."""

from autopar.estimate import estimate
from autopar.problem import Problem
from autopar.validate.measurements import read_rows
from autopar.validate.rows import to_case
from conftest import MEASUREMENTS

ROWS = {r.id: r for r in read_rows(MEASUREMENTS)}


def test_sc21_table1_torch_ddp_rows_overlap_16bit_gradients():
    # run_table_1.sh: 3.6B (30 layers) and 18B (40 layers) run DDP=torch, 76B (60 layers) DDP=local.
    for row_id in ("NAR21-T1-02", "NAR21-T1-04"):
        case = to_case(ROWS[row_id])
        assert case.problem.train.overlap_grad_reduce and case.problem.train.grad_bytes == 2
        assert any(a.startswith("DDP=torch") for a in case.assumed)
    local = to_case(ROWS["NAR21-T1-06"])
    assert not local.problem.train.overlap_grad_reduce and local.problem.train.grad_bytes == 4


def test_torch_ddp_hides_the_18b_all_reduce_under_the_last_backward():
    # 18B, tp 8, dp 32: 2.3e9 parameters per rank, 4.6 GB of 16-bit gradients: far less than the
    # last micro-batch's backward with recompute (about 1.4 s), so nothing is left exposed.
    case = to_case(ROWS["NAR21-T1-04"])
    assert estimate(case.problem, case.strategy).time_breakdown_s["dp_comm"] == 0.0
    local = case.problem.train.model_copy(update={"overlap_grad_reduce": False, "grad_dtype": "fp32"})
    after = estimate(Problem(case.problem.model, case.problem.cluster, local), case.strategy)
    assert after.time_breakdown_s["dp_comm"] > 0.5  # fp32 all-reduce after the backward: exposed


def test_dgxc_and_megatron_bridge_rows_reduce_bf16_gradients():
    # NeMo 6f2c6fd performance recipes and Megatron-Bridge v0.2.0 performance configs set
    # grad_reduce_in_fp32=False, bf16 and fp8 runs alike: 2 B per gradient.
    for row_id in ("DGXC2505-N340B-H100-BF16-256", "DGXC2505-N340B-H100-FP8-256", "DGXC2505-DSV3-H100-BF16-512",
                   "MBR-2511-H100-3"):
        case = to_case(ROWS[row_id])
        assert case.problem.train.grad_bytes == 2 and case.problem.train.overlap_grad_reduce
        assert any(a.startswith("grad_dtype=bf16") for a in case.assumed), row_id
    # dgxc 24.11.1 YAMLs: distributed_fused_adam with grad_sync_dtype bf16 (GPT-3, Llama 3.1, Nemotron-4).
    for row_id in ("DGXC2411-G175B-FP8-128", "DGXC2411-L70B-BF16-256", "DGXC2411-N15B-BF16-16"):
        case = to_case(ROWS[row_id])
        assert case.problem.train.grad_bytes == 2 and any("grad_sync_dtype bf16" in a for a in case.assumed)
    # NeMo 24.07's launcher-era rows keep fp32 main gradients (Megatron's default).
    assert to_case(ROWS["NEMO2407-10"]).problem.train.grad_bytes == 4


def test_bf16_gradients_more_than_halve_the_exposed_reduce_scatter_of_nemotron_340b():
    # tp 8, pp 8, dp 4 on H100: ~5.3e9 parameters per rank. Exposed = reduce-scatter minus the last
    # backward it hides under (the bf16 weight all-gather hides under the first forward): halving the
    # reduce-scatter removes half of it from the exposed part, i.e. more than half of what was exposed.
    case = to_case(ROWS["DGXC2505-N340B-H100-BF16-256"])
    bf16 = estimate(case.problem, case.strategy).time_breakdown_s["dp_comm"]
    fp32_train = case.problem.train.model_copy(update={"grad_dtype": "fp32"})
    fp32_problem = Problem(case.problem.model, case.problem.cluster, fp32_train)
    fp32 = estimate(fp32_problem, case.strategy).time_breakdown_s["dp_comm"]
    assert 0.0 < bf16 < fp32 / 2


def test_fp8_rows_gather_fp8_weights_where_their_recipe_stores_them():
    # dgxc 24.11.1 fp8_params: true (gpt3_175b_hydra.yaml, llama3.1/nemotron configure.sh), NeMo 6f2c6fd
    # bf16_with_fp8_mixed(), Megatron-Bridge v0.2.0 fp8_cs/fp8_mx and Megatron-LM's llama FP8 script set it.
    for row_id in ("DGXC2411-G175B-FP8-128", "DGXC2411-L8B-FP8-16", "DGXC2505-N340B-H100-FP8-256",
                   "MBR-2511-H100-1", "MBR-2511-B200-2", "MLM-LLAMA-FP8-2"):
        case = to_case(ROWS[row_id])
        assert case.problem.train.fp8_param_storage, row_id
        assert any(a.startswith("fp8 param gather") for a in case.assumed), row_id
    # the same recipes' bf16 runs, and fp8 sources that do not say so, gather bf16 weights
    for row_id in ("DGXC2411-G175B-BF16-128", "NEMO2407-03", "TT2412-T1-3-tps"):
        assert not to_case(ROWS[row_id]).problem.train.fp8_param_storage, row_id
