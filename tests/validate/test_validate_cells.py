"""The free-text and optional cells of a measurements row (``autopar.validate.cells``): the usual
spellings are read, anything else is refused with the column, never replaced by a default."""

import pytest

from autopar.validate.cells import (Unscorable, expert_tp_of, flag_of, precision_of, recompute_of, zero_of)
from autopar.validate.measurements import Row, row_label


def _prec(note: str, assumed: list | None = None) -> str:
    return precision_of(Row({"notes": note}), assumed)


def test_precision_from_the_note_takes_the_first_named_16_bit_type():
    # BLOOM 02-25: fp16 (the bf16 optimizer is only mentioned); 02-28: BF16_Optimizer runs bf16.
    assert _prec("prec=mixed (fp16 assumed: BF16 optimizer only introduced 02-28); 48 nodes") == "fp16"
    assert _prec("prec=BF16 (BF16_Optimizer, fp32 grad accumulation); 48 nodes") == "bf16"
    assert _prec("prec=fp16 mixed") == "fp16"
    assert _prec("prec=FP16 weights, FP32 Adam state sharded") == "fp16"  # OPT: fp32 only for the optimizer
    for fp8 in ("prec=BF16 + Float8 linears", "prec=FP8-CS", "prec=FP8-MX", "prec=FP8 (hybrid)"):
        assert _prec(fp8) == "fp8", fp8


def test_precision_not_named_is_bf16_marked_assumed():
    for note in ("prec=mixed", "prec=mixed fp16/bf16 (not specified)", "", "GA=8; no precision here"):
        assumed: list[str] = []
        assert _prec(note, assumed) == "bf16"
        assert assumed == ["precision=bf16 (notes do not name it)"], note
    assumed = []
    _prec("prec=BF16", assumed)
    assert assumed == []


@pytest.mark.parametrize("note, fmt", [("prec=fp4", "fp4"), ("prec=NVFP4 (Blackwell)", "nvfp4"),
                                       ("prec=MXFP4", "mxfp4"), ("prec=int8 weights", "int8"),
                                       ("GA=4; prec=FP6", "fp6")])
def test_formats_below_fp8_are_refused_not_costed_as_bf16(note, fmt):
    with pytest.raises(Unscorable, match=f"{fmt} training is not modelled"):
        _prec(note)


def test_pure_fp32_training_is_refused():
    with pytest.raises(Unscorable, match="fp32/tf32 training is not modelled"):
        _prec("prec=FP32")
    assert _prec("prec=mixed, fp32 master weights") == "bf16"  # mixed precision keeps an fp32 copy


@pytest.mark.parametrize("text, value", [("yes", True), ("True", True), ("on", True), ("1", True), ("y", True),
                                         ("no", False), ("false", False), ("OFF", False), ("0", False), ("", None)])
def test_flag_spellings(text, value):
    assert flag_of(Row({"sp": text}), "sp") is value


def test_flag_refuses_other_text():
    with pytest.raises(Unscorable, match=r"sp='2': expected 1/0, true/false, yes/no or on/off"):
        flag_of(Row({"sp": "2"}), "sp")


@pytest.mark.parametrize("text, stage", [("ZeRO-1", 1), ("ZeRO-3 (DeepSpeed)", 3), ("zero-0", 0),
                                         ("FSDP2 (shard degree 8)", 3), ("FSDP (Megatron-FSDP)", 3),
                                         ("distributed optimizer", 1), ("DDP", 0), ("", None)])
def test_zero_stage_spellings(text, stage):
    assert zero_of(Row({"zero_or_distopt": text})) == stage


@pytest.mark.parametrize("text, needle", [("ZeRO-4", "ZeRO stages are 0-3"), ("ZeRO-12", "ZeRO stages are 0-3"),
                                          ("sharded", "expected ZeRO-0 .. ZeRO-3")])
def test_zero_refuses_what_it_cannot_read(text, needle):
    with pytest.raises(Unscorable, match=f"zero_or_distopt='{text}': {needle}"):
        zero_of(Row({"zero_or_distopt": text}))


def test_recompute_cell():
    assumed: list[str] = []
    assert recompute_of(Row({"recompute": "full (assumed, as production)"}), assumed) == "full"
    assert assumed == ["recompute=full (source note)"]
    assert recompute_of(Row({"recompute": "selective (per-op SAC)"}), []) == "selective"
    assert recompute_of(Row({"recompute": ""}), []) is None
    with pytest.raises(Unscorable, match="recompute='partial': expected none, selective or full"):
        recompute_of(Row({"recompute": "partial"}), [])


def test_etp_from_the_row_notes():
    assert expert_tp_of(Row({"notes": "prec=BF16; EP=64 ETP=1; GA=128"})) == 1
    assert expert_tp_of(Row({"notes": "prec=BF16; EP=8 ETP=4; GA=8"})) == 4
    assert expert_tp_of(Row({"notes": "prec=BF16; GA=8"})) is None  # Megatron default: etp = tp
    for bad in ("ETP=0", "ETP=x", "ETP=-1"):
        with pytest.raises(Unscorable, match="notes: ETP="):
            expert_tp_of(Row({"notes": f"prec=BF16; {bad}; GA=8"}))


def test_row_label_quotes_only_what_would_blur_the_line():
    assert row_label("NAR21-T1-02") == "NAR21-T1-02"
    assert row_label("a\nb") == "'a\\nb'"
    assert row_label(" x") == "' x'"
    assert row_label("") == "''"
