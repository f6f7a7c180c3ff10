"""``autopar validate`` on user CSVs with odd rows: exit 0 with the row scored (its assumptions
listed) or exit 2 with one ``error:`` line naming the CSV column and the row id; a bad row among
good ones is listed as not scored and the report is written for the rest (issue 13, T1-T13)."""

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.validate import run_validation
from autopar.validate.measurements import Row
from autopar.validate.score import score_row

runner = CliRunner()
HEADER = ("id,model,layers,hidden,heads,ffn,seq_len,gpu,num_gpus,gbs,tp,pp,dp,zero_or_distopt,notes,"
          "measured_metric,measured_value")
LLAMA = "NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,,,step_time,1"


def _row(text: str) -> Row:
    import csv
    import io

    return Row(next(csv.DictReader(io.StringIO(f"{HEADER}\n{text}\n"))))


def _validate(tmp_path, *rows: str, extra: tuple[str, ...] = ()):
    path = tmp_path / "b.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return runner.invoke(app, ["validate", "--csv", str(path), "--out", str(tmp_path / "o"), *extra])


def _one_line_error(result) -> str:
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output, repr(result.exception))
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("row, needle", [
    # T2: Table-1 row without layers (was KeyError: None)
    ("NAR21-T1-X,GPT-4B,,3072,32,12288,2048,A100-SXM4-80GB,64,512,2,1,,,,step_time,1",
     "(first: NAR21-T1-X: layers is empty"),
    # T3/T4/T5: hidden, heads, num_gpus, seq_len empty (TypeError / ValidationError tracebacks)
    ("NEMO-X,Llama-3-8B,32,,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,,,step_time,1", "NEMO-X: hidden is empty"),
    ("NEMO-X,Llama-3-8B,32,4096,,14336,8192,H100-SXM5-80GB,8,64,1,1,,,,step_time,1", "NEMO-X: heads is empty"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,,64,1,1,,,,step_time,1", "NEMO-X: num_gpus is empty"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,,H100-SXM5-80GB,8,64,1,1,,,,step_time,1", "NEMO-X: seq_len is empty"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,,8,64,1,1,,,,step_time,1", "NEMO-X: gpu is empty"),
    # T6: torchtitan row without layers (TypeError)
    ("TT2412-X,Llama-3-8B,,4096,32,14336,8192,H100-96GB-HBM2e,8,64,1,1,,,,step_time,1", "TT2412-X: layers is empty"),
    # T7, T8: ValidationError of the layout
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,ZeRO-4,,step_time,1",
     "zero_or_distopt='ZeRO-4': ZeRO stages are 0-3"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,,ETP=0,step_time,1",
     "notes: ETP='0': expected a whole number in 1.."),
    # T9: dp derived as 2 // 4 = 0 (ZeroDivisionError in the torchtitan local batch)
    ("TT2412-X,Llama-3-8B,32,4096,32,14336,8192,H100-96GB-HBM2e,2,64,1,4,,,,step_time,1",
     "num_gpus=2 is not a multiple of tp*pp*cp = 1*4*1"),
    # T11: dp derived as 8 // 16 = 0 (ValidationError)
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,4,4,,,,step_time,1",
     "num_gpus=8 is not a multiple of tp*pp*cp = 4*4*1"),
    # T13: megatron-2020 runs one micro-batch of gbs / dp = 16 // 32 = 0 (ValidationError)
    ("MLM2020-X,GPT-4B,60,3072,32,12288,2048,A100-SXM4-80GB,64,16,2,1,,,,step_time,1",
     "gbs=16 is not a multiple of dp=32"),
    # torchtitan with pp: local batch gbs / dp = 4 // 2 = 2 micro-batches of 2 / 4 (ZeroDivisionError before)
    ("TT2412-X,Llama-3-8B,32,4096,32,14336,8192,H100-96GB-HBM2e,8,5,1,4,,,,step_time,1",
     "gbs=5 is not a multiple of dp=2"),
    # hidden not a multiple of heads: head_dim was floored to 136 (``--model`` refuses the same shape)
    ("NEMO-X,Llama-3-8B,32,4096,30,14336,8192,H100-SXM5-80GB,8,64,1,1,,,,step_time,1",
     "hidden=4096 is not a multiple of heads=30"),
    # prec=fp4 was costed as bf16
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,,prec=NVFP4,step_time,1",
     "notes: 'prec=NVFP4': nvfp4 training is not modelled"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,,prec=fp4,step_time,1",
     "fp4 training is not modelled"),
    # a free-text knob autopar cannot read is refused, not replaced by the source default
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,1,,sharded somehow,,step_time,1",
     "zero_or_distopt='sharded somehow': expected ZeRO-0 .. ZeRO-3"),
    # more GPUs than a cluster may have nodes: named by the CSV column, not --nodes
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,2147483648,1073741824,1,1,,,,step_time,1",
     "num_gpus=2147483648: 268435456 nodes of 8; at most 100000 nodes"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,TPU v5p,8,64,1,1,,,,step_time,1", "gpu='TPU v5p': unknown device"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,A100,8,64,1,1,,,,step_time,1", "gpu='A100': ambiguous device name"),
])
def test_unscorable_row_is_one_line_naming_the_column(tmp_path, row, needle):
    err = _one_line_error(_validate(tmp_path, row))
    assert "none of the 1 rows can be scored" in err and needle in err, err


def test_id_with_a_newline_is_quoted_on_the_one_error_line(tmp_path):
    row = '"NEMO-X\nevil",Llama-3-8B,32,4096,,14336,8192,H100-SXM5-80GB,8,64,1,1,,,,step_time,1'
    err = _one_line_error(_validate(tmp_path, row))
    assert "(first: 'NEMO-X\\nevil': heads is empty" in err


def test_mfu_above_100_percent_is_refused(tmp_path):
    err = _one_line_error(_validate(tmp_path, LLAMA.replace("step_time,1", "mfu,150")))
    assert "line 2 (NEMO-X): measured_value='150': expected a percentage in (0, 100] (mfu)" in err


@pytest.mark.parametrize("option", ["--csv", "--out"])
def test_empty_option_values_are_refused(tmp_path, option):
    # --csv '' scored the shipped CSV, --out '' wrote into the working directory
    args = {"--csv": str(tmp_path / "none.csv"), "--out": str(tmp_path / "o")} | {option: ""}
    err = _one_line_error(runner.invoke(app, ["validate", *[x for kv in args.items() for x in kv]]))
    assert f"{option}='': empty; give a value or leave {option} out" in err


def test_unlisted_table1_layer_count_is_scored_with_generic_mbs_and_vpp(tmp_path):
    # T1: run_table_1.sh lists 30, 40, 60, 80, 96, 105, 128 layers; 36 was KeyError: 36.
    result = _validate(tmp_path, "NAR21-T1-X,GPT-4B,36,3072,32,12288,2048,A100-SXM4-80GB,64,512,2,1,,,,step_time,1")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in (tmp_path / "o" / "rows.md").read_text().splitlines() if x.startswith("| NAR21-T1-X |")]
    assert "mbs=1" in line and "run_table_1.sh" not in line


def test_table1_chunking_that_does_not_split_the_layers_falls_back_to_vpp_1():
    # T12: 60 layers, 5 per virtual stage, pp 16: vpp was 60 // 80 = 0 (ZeroDivisionError).
    from autopar.validate.rows import to_case
    case = to_case(_row("NAR21-T1-X,GPT-4B,60,3072,32,12288,2048,A100-SXM4-80GB,64,512,2,16,,,,step_time,1"))
    assert (case.strategy.mbs, case.strategy.vpp) == (2, 1)  # mbs 2 still from the script
    assert any("do not split 60 layers over pp=16" in a for a in case.assumed)
    listed = to_case(_row("NAR21-T1-X,GPT-4B,60,3072,32,12288,2048,A100-SXM4-80GB,64,512,2,4,,,,step_time,1"))
    assert listed.strategy.vpp == 60 // (4 * 5)  # the script's 5 layers per virtual stage


def test_one_bad_row_is_listed_and_the_rest_is_scored(tmp_path):
    bad = "TT2412-X,Llama-3-8B,32,4096,32,14336,8192,H100-96GB-HBM2e,2,64,1,4,,,,step_time,1"
    result = _validate(tmp_path, bad, LLAMA)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "o" / "rows.md").read_text()
    scored, unscored = text.split("### Not scored")
    assert "| NEMO-X | step_time |" in scored
    assert "| TT2412-X | num_gpus=2 is not a multiple of tp*pp*cp" in unscored


def test_unknown_source_gets_the_generic_defaults_marked_assumed():
    from autopar.validate.rows import GENERIC, to_case
    case = to_case(_row(LLAMA.replace("NEMO-X", "MYLAB-1").replace(",1,1,,,,", ",2,1,,,,")))
    assert case.family is GENERIC
    s, t = case.strategy, case.problem.train
    assert (s.mbs, s.vpp, s.zero, s.recompute, s.sp, s.tp_comm_overlap) == (1, 1, 1, "none", True, False)
    assert (t.flash_attention, t.overlap_grad_reduce, t.framework) == (True, True, "megatron")
    assert case.assumed[0].startswith("source unknown: generic defaults")
    for knob in ("mbs=1", "zero=1", "recompute=none", "sp=on", "vocab=51200", "precision=bf16"):
        assert any(a.startswith(knob) for a in case.assumed), (knob, case.assumed)


@pytest.mark.parametrize("cell, sp", [("yes", True), ("true", True), ("On", True), ("1", True),
                                      ("no", False), ("FALSE", False), ("0", False)])
def test_sp_cell_reads_the_usual_booleans(cell, sp):
    from autopar.validate.rows import to_case
    row = _row(LLAMA.replace(",1,1,,,,", ",2,1,,,,"))
    assert to_case(Row({**row.cells, "sp": cell})).strategy.sp is sp  # "yes" was SP off


def test_sp_cell_that_is_no_boolean_is_not_scored():
    result = score_row(Row({**_row(LLAMA).cells, "sp": "maybe"}), {})
    assert result.predicted is None and result.reason.startswith("sp='maybe': expected 1/0, true/false")


def test_score_row_lists_a_row_whose_layout_the_rules_refuse():
    # gbs 4 over dp 8: Megatron refuses it; the reason is kept, nothing raises
    result = score_row(_row(LLAMA.replace(",64,1,1,", ",4,1,1,")), {})
    assert result.predicted is None and "global batch size 4 must be divisible by mbs*dp = 1*8" in result.reason


def test_run_validation_keeps_every_row(tmp_path):
    path = tmp_path / "b.csv"
    rows = [LLAMA, LLAMA.replace("NEMO-X", "NEMO-Y").replace(",32,4096,32,", ",,4096,32,")]
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    results, _ = run_validation(path, tmp_path / "o")
    assert [r.row.id for r in results] == ["NEMO-X", "NEMO-Y"]
    assert results[0].predicted > 0 and results[1].reason == "layers is empty: the model needs it"


def test_ids_with_table_characters_keep_rows_md_one_line_per_row(tmp_path):
    rows = [LLAMA.replace("NEMO-X", '"NEMO|A\nB"'), LLAMA.replace("NEMO-X", '"NEMO-Z"').replace(",32,4096,32,", ",,4096,32,")]
    result = _validate(tmp_path, *rows)
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "o" / "rows.md").read_text().splitlines()
    assert "| NEMO\\|A\\nB | step_time |" in "\n".join(lines)
    assert "| NEMO-Z | layers is empty: the model needs it |" in lines
    assert all(line.startswith(("|", "### ")) for line in lines if line)  # no table row split in two


@pytest.mark.parametrize("row, needle", [
    # 2^31 layers / chunks / sequences: per-layer and per-micro-batch arrays were allocated (MemoryError)
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,64,1,2147483648,1,,,step_time,1",
     "pp=2147483648 x vpp=1 model chunks: more than the 32 layers"),
    ("NEMO-X,Llama-3-8B,32,4096,32,14336,8192,H100-SXM5-80GB,8,2147483648,1,8,,,,step_time,1",
     "gbs=2147483648: expected at most 1073741824"),
])
def test_sizes_that_would_exhaust_memory_are_not_scored(row, needle):
    result = score_row(_row(row), {})
    assert result.predicted is None and needle in result.reason, result.reason


def test_only_oom_rows_still_write_the_report(tmp_path):
    # the former scatter plot had no point to scale its axes by (ValueError: min() arg is an empty
    # sequence); the error plot says it has no row with a numeric error
    result = _validate(tmp_path, LLAMA.replace("step_time,1", "oom_observed,1"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "o" / "errors.png").stat().st_size > 0
    assert "| NEMO-X | went OOM |" in (tmp_path / "o" / "accuracy.md").read_text()
