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
