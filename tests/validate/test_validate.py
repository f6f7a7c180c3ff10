"""``autopar validate``: the report's arithmetic (not the accuracy level)."""

import csv

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.validate import run_validation
from autopar.validate.report import groups, mape, rank, spearman
from autopar.validate.score import error_pct
from conftest import MEASUREMENTS

SOURCE = MEASUREMENTS
IDS = ("KOR22-T5-1a", "KOR22-T5-1b", "BLOOMPQ-0225-15-oom", "MLM2020-V100-1", "OPT-175B")


def test_error_and_mape_by_hand():
    assert error_pct(110.0, 100.0) == pytest.approx(10.0)
    assert error_pct(0.9, 1.2) == pytest.approx(-25.0)
    assert mape([10.0, -20.0]) == pytest.approx(15.0)


def test_spearman_by_hand():
    # ranks of y: 1 2 4 3, d = 0 0 -1 1, rho = 1 - 6*2/(4*(16-1)) = 0.8
    assert spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert list(rank([5.0, 1.0, 5.0])) == [2.5, 1.0, 2.5]  # ties share their mean rank


@pytest.fixture
def few_rows(tmp_path):
    with SOURCE.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = [r for r in reader if r["id"] in IDS]
        fields = reader.fieldnames
    path = tmp_path / "few.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_validate_few_rows(few_rows, tmp_path):
    results, paths = run_validation(few_rows, tmp_path / "out")
    by_id = {r.row.id: r for r in results}
    assert set(by_id) == set(IDS)  # nothing silently dropped
    assert by_id["MLM2020-V100-1"].predicted is None and "V100" in by_id["MLM2020-V100-1"].reason
    assert by_id["OPT-175B"].predicted is None and "tflops_per_gpu" in by_id["OPT-175B"].reason
    a, b = by_id["KOR22-T5-1a"], by_id["KOR22-T5-1b"]
    assert a.error_pct == pytest.approx(100 * (a.predicted - 1.42) / 1.42)
    assert b.case.strategy.recompute == "selective" and b.case.strategy.sp
    assert by_id["BLOOMPQ-0225-15-oom"].error_pct is None  # boolean row: no error %
    (step,) = [g for g in groups(results, lambda r: "all") if g.metric == "step_time"]
    assert step.count == 2
    assert step.mape == pytest.approx((abs(a.error_pct) + abs(b.error_pct)) / 2)
    assert step.max_abs == pytest.approx(max(abs(a.error_pct), abs(b.error_pct)))
    text = paths["rows"].read_text()
    assert "| MLM2020-V100-1 |" in text and paths["errors"].stat().st_size > 0


def test_cli_missing_csv_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["validate", "--csv", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2


def _fake_result(metric: str, measured: float, predicted: float, precision: str, moe: bool):
    from types import SimpleNamespace

    from autopar.validate.rows import Row
    from autopar.validate.score import Result

    case = SimpleNamespace(precision=precision, problem=SimpleNamespace(model=SimpleNamespace(is_moe=moe)))
    return Result(Row({"measured_metric": metric, "measured_value": str(measured)}), case, predicted)


def test_moe_and_fp8_target_sets_are_reported_apart_from_dense_bf16():
    from autopar.validate.report import target_lines

    results = [
        _fake_result("step_time", 10.0, 11.0, "bf16", False),  # dense bf16: +10 %
        _fake_result("step_time", 10.0, 7.0, "bf16", True),  # MoE bf16: -30 %
        _fake_result("tokens_per_s_per_gpu", 100.0, 110.0, "fp8", True),  # MoE fp8: +10 %
        _fake_result("step_time", 10.0, 9.5, "fp8", False),  # fp8 dense: -5 %
        _fake_result("peak_mem_per_gpu", 50.0, 40.0, "fp8", False),  # fp8 dense memory: -20 %
    ]
    lines = target_lines(results)
    assert "| bf16/fp16 dense: step time / throughput | 1 | 10.00 | 10.00 | <= 4.5, max 20 | no |" in lines
    assert "| bf16/fp16 dense: peak memory | 0 | - | - | <= 10 | - |" in lines
    assert "| MoE (any precision): step time / throughput | 2 | 20.00 | 30.00 | <= 15, max 30 | no |" in lines
    assert "| fp8 dense: step time / throughput | 1 | 5.00 | 5.00 | <= 5.5, max 20 | yes |" in lines
    assert "| fp8 dense: peak memory | 1 | 20.00 | 20.00 | <= 10 | no |" in lines


def test_a_target_needs_both_its_mape_and_its_max():
    from autopar.validate.report import Target
    dense = Target(4.5, 20.0)
    assert dense.met([4.5, -4.5])  # MAPE exactly at the target
    assert not dense.met([4.6, -4.6])
    assert not dense.met([-20.6, 0.0, 0.0, 0.0, 0.0, 0.0])  # MAPE 3.4 %, one row beyond 20 %
    assert Target(10.0).met([-19.0, 0.0])  # memory: no max
    assert (dense.text(), Target(10.0).text()) == ("<= 4.5, max 20", "<= 10")


def test_memory_families_set_their_framework():
    from autopar.validate.rows import FAMILIES, Row, framework_of
    assert framework_of(Row({"zero_or_distopt": "FSDP2 (shard degree 8)"}), FAMILIES["torchtitan"]) == "torchtitan"
    assert framework_of(Row({"zero_or_distopt": "ZeRO-1"}), FAMILIES["megatron-deepspeed"]) == "deepspeed"
    assert framework_of(Row({"zero_or_distopt": ""}), FAMILIES["nemo"]) == "megatron"


def test_jean_zay_rows_get_the_omni_path_network():
    # 4 x 100 Gb/s Omni-Path per 8 GPUs = 6.25 GB/s per GPU; NCCL over OPA verbs moves ~30% of it.
    from autopar.validate.rows import Row, device_of
    dev = device_of(Row({"gpu": "A100-SXM4-80GB (Jean Zay)"}))
    assert dev.inter_node_bandwidth_bytes_per_s == 6.25e9 and dev.inter_node_comm_efficiency == 0.30
    assert device_of(Row({"gpu": "A100-SXM4-80GB (Selene)"})).inter_node_comm_efficiency > 0.8


def test_asynctp_rows_overlap_tp_collectives():
    from autopar.validate.rows import FAMILIES, Row, tp_overlap_of
    titan = FAMILIES["torchtitan"]
    assert tp_overlap_of(Row({"notes": "prec=BF16; 2D FSDP+TP + AsyncTP; torch.compile"}), titan)
    assert not tp_overlap_of(Row({"notes": "prec=BF16; FSDP + torch.compile"}), titan)
    assert tp_overlap_of(Row({"notes": "prec=BF16"}), FAMILIES["nemo"])  # TE userbuffers by default


def test_bloom_rows_run_with_synchronous_launches():
    # tr11-176B-ml.slurm exports CUDA_LAUNCH_BLOCKING=1 (the hang workaround); no other source does.
    from autopar.validate.measurements import read_rows
    from autopar.validate.rows import FAMILIES, to_case
    assert [f.name for f in FAMILIES.values() if f.launch_blocking] == ["megatron-deepspeed"]
    rows = {r.id: r for r in read_rows(SOURCE)}
    assert to_case(rows["BLOOMPQ-0225-13-time"]).problem.train.launch_blocking
    assert not to_case(rows["NAR21-T2-07"]).problem.train.launch_blocking


def test_bloom_prequel_mbs_sweep_is_ranked_with_the_host_time():
    # chronicles-prequel.md, "48 node contenders" (02-21, not in the CSV): tp8 pp12 dp4 of the
    # 181B prequel model took 143.31 s at mbs 1 and 123.69 s at mbs 4 despite the smaller bubble;
    # only the per-layer-pass host time of synchronous launches orders them so.
    import dataclasses

    from autopar.estimate import estimate
    from autopar.validate.measurements import read_rows
    from autopar.validate.rows import Row, to_case
    cells = {r.id: r for r in read_rows(SOURCE)}["BLOOMPQ-0225-10-time"].cells

    def step(mbs: int, blocking: bool) -> float:
        case = to_case(Row({**cells, "dp": "4", "tp": "8", "pp": "12", "mbs": str(mbs), "gbs": "2048"}))
        train = case.problem.train.model_copy(update={"launch_blocking": blocking})
        p = dataclasses.replace(case.problem, train=train)
        return float(estimate(p, case.strategy).step_time_s)

    assert step(1, True) > step(4, True)
    assert step(1, False) < step(4, False)
    assert step(1, True) == pytest.approx(143.31, rel=0.05)


def test_nemotron_rows_without_a_vocabulary_take_the_family_tokenizer():
    # NEMO2407-08 leaves vocab blank; Nemotron-3 8B is 256000 with untied embeddings (HF config).
    # NeMo's 653 model TFLOP/s at 12701 tokens/s is 51.41 GFLOP/token = 3 x (32 x 24 h^2 + 32 x
    # 4 s h + 2 h V) at h = 4096, s = 4096: V = 256000 gives 51.38 (51200 would give 40.1).
    from autopar.validate.measurements import read_rows
    from autopar.validate.rows import to_case
    rows = {r.id: r for r in read_rows(SOURCE)}
    model = to_case(rows["NEMO2407-08"]).problem.model
    assert (model.vocab_size, model.tie_word_embeddings, model.gated_mlp) == (256000, False, False)
    h, s = 4096, 4096
    assert 3 * (32 * 24 * h * h + 32 * 4 * s * h + 2 * h * model.vocab_size) / 1e9 == pytest.approx(653e12 / 12701 / 1e9, rel=0.002)
    assert to_case(rows["NAR21-T2-07"]).problem.model.vocab_size == 51200  # GPT rows keep the default
