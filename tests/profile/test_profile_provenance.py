"""Profile provenance: a database is used only for the device it was measured on (or the one
``--profile-stands-for`` names) and only in the precision of its rows. No torch: the databases
are written with OpDB's own helpers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost.compute import embedding_forward_time_s
from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.profile.opdb import OpDB
from autopar.profile.provenance import MeasuredOn, accept, device_preset, parse_versions, preset_for
from autopar.profile.shapes import strategy_ops
from autopar.strategy import Strategy
from conftest import make_problem

runner = CliRunner()
CPU = "cpu:x86_64:2t"
H100 = "NVIDIA H100 80GB HBM3"
PLAN = ["--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "64", "--seq-len", "4096"]
# dp 4, 16 micro-batches of 1; sequence parallel (the default with tp > 1); without TP overlap, whose
# userbuffers kernels would add their SMs' share to the measured GEMMs (autopar.cost.userbuffers_sm).
LAYOUT = ["--tp", "2", "--mbs", "1", "--no-tp-comm-overlap"]


def record(device: str, preset: str | None, versions: str = "torch=2.13.0") -> MeasuredOn:
    return MeasuredOn(device, versions, device, preset, None, "2.13.0", None, None, "0.1.0")


def make_db(path, device: str, preset: str | None, dtype: str = "bf16", fwd_s: float = 1e-3) -> str:
    """Every operator of llama3-8b tp 2 (LAYOUT) at ``fwd_s`` forward, 2x backward."""
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    db = OpDB(path)
    db.put_measured_on(record(device, preset))
    for op, dims in strategy_ops(p, Strategy(dp=4, tp=2, sp=True)):
        db.put(device, op, dims, dtype, "torch=2.13.0", (fwd_s, 0.0), (2 * fwd_s, 0.0), 1.0, 3)
    db.close()
    return str(path)


def run_json(args: list[str]) -> dict:
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def one_line_error(args: list[str]) -> str:
    res = runner.invoke(app, args)
    err = res.stderr.strip()
    assert res.exit_code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (res.exit_code, err)
    return err


def measured_compute_s() -> float:
    """Hand count of test_profile's provider test: per layer (1 + 2) ms x 11 operators = 33 ms;
    16 micro-batches x (32 layers + output GEMM and loss (2 x 3 ms) + analytic embedding)."""
    p = make_problem("llama3-8b", gbs=64, seq=4096)
    embedding = 3 * float(embedding_forward_time_s(p, LayoutBatch.from_strategy(Strategy(dp=4, tp=2, sp=True), 64))[0])
    return 16 * (32 * 33e-3 + 6e-3 + embedding)


def test_torch_names_map_to_the_presets_they_identify():
    assert preset_for("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert preset_for("NVIDIA  A100-SXM4-80GB ") == "a100-80gb"  # whitespace as nvidia-smi pads it
    assert preset_for("NVIDIA H200") == "h200"
    for other in ("NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe", "NVIDIA H200 NVL", CPU, "AMD Instinct MI300X"):
        assert preset_for(other) is None
    assert parse_versions("torch=2.5.1 cuda=12.4 cudnn=90100") == {"torch": "2.5.1", "cuda": "12.4", "rocm": None}
    assert parse_versions("torch=2.5.1 cuda=None cudnn=3") == {"torch": "2.5.1", "cuda": None, "rocm": None}


def test_another_devices_database_is_refused_in_one_line(tmp_path):
    db = make_db(tmp_path / "cpu.db", CPU, None)
    err = one_line_error(["search", *PLAN, "--top", "1", "--profile-db", db])
    assert f"measured on '{CPU}' (no autopar preset), not on the planned 'h100-80gb'" in err
    assert "pass --profile-stands-for h100-80gb" in err
    a100 = make_db(tmp_path / "a100.db", "NVIDIA A100-SXM4-80GB", "a100-80gb")
    err = one_line_error(["estimate", *PLAN, *LAYOUT, "--profile-db", a100])
    assert "measured on 'NVIDIA A100-SXM4-80GB' (preset a100-80gb), not on the planned 'h100-80gb'" in err


def test_override_is_used_and_recorded_in_the_json(tmp_path):
    db = make_db(tmp_path / "cpu.db", CPU, None)
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", db, "--profile-stands-for", "h100-80gb"])
    prof = doc["profile"]
    assert doc["time_breakdown_s"]["compute"] == pytest.approx(measured_compute_s(), rel=1e-9)
    assert prof["device"] == CPU and prof["planned_device"] == "h100-80gb"
    assert prof["accepted"] == "--profile-stands-for h100-80gb"
    assert prof["measured_on"] == [record(CPU, None).to_dict()] and prof["unrecorded_versions"] == []
    assert prof["sources"] == [{"dense layer": "operators (9 of 9 measured)", "output": "operators"}]
    search = run_json(["search", *PLAN, "--top", "3", "--profile-db", db, "--profile-stands-for", "h100-80gb"])
    assert search["profile"]["device"] == CPU and search["profile"]["accepted"] == "--profile-stands-for h100-80gb"
    assert len(search["profile"]["sources"]) == 3  # one per shown layout
    err = one_line_error(["search", *PLAN, "--top", "1", "--profile-db", db, "--profile-stands-for", "a100-80gb"])
    assert "--profile-stands-for='a100-80gb': the plan's device is 'h100-80gb'" in err


def test_same_device_is_used_without_an_override(tmp_path):
    db = make_db(tmp_path / "h100.db", H100, "h100-80gb")
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", db])
    assert doc["profile"]["accepted"] == "same device"
    assert doc["time_breakdown_s"]["compute"] == pytest.approx(measured_compute_s(), rel=1e-9)
    out = runner.invoke(app, ["estimate", *PLAN, *LAYOUT, "--profile-db", db])
    assert out.exit_code == 0 and f"({H100}):" in out.stdout and "standing for" not in out.stdout
    out = runner.invoke(app, ["estimate", *PLAN, *LAYOUT, "--profile-db", make_db(tmp_path / "c.db", CPU, None),
                              "--profile-stands-for", "h100-80gb"])
    assert f"({CPU}, standing for h100-80gb by --profile-stands-for)" in out.stdout


def test_rows_of_another_precision_are_not_used(tmp_path):
    analytic = run_json(["estimate", *PLAN, *LAYOUT])["time_breakdown_s"]["compute"]
    db = make_db(tmp_path / "fp32.db", H100, "h100-80gb", dtype="fp32")
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", db])
    assert doc["time_breakdown_s"]["compute"] == analytic  # all 11 rows are fp32: none used for bf16
    assert doc["profile"]["unused_rows"] == {"fp32": 11} and doc["profile"]["coverage"] == [0.0]
    out = runner.invoke(app, ["estimate", *PLAN, *LAYOUT, "--profile-db", db])
    assert "not used: rows measured in another precision than this bf16 plan (11 in fp32)" in out.stdout
    # the same rows in fp16 serve an fp16 plan
    fp16 = make_db(tmp_path / "fp16.db", H100, "h100-80gb", dtype="fp16")
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--precision", "fp16", "--profile-db", fp16])
    assert doc["profile"]["unused_rows"] == {} and doc["time_breakdown_s"]["compute"] == pytest.approx(
        measured_compute_s(), rel=1e-9)


def test_several_devices_default_to_the_planned_one(tmp_path):
    path = tmp_path / "two.db"
    make_db(path, CPU, None, fwd_s=5e-3)
    make_db(path, H100, "h100-80gb")
    doc = run_json(["estimate", *PLAN, *LAYOUT, "--profile-db", str(path)])
    assert doc["profile"]["device"] == H100
    assert doc["time_breakdown_s"]["compute"] == pytest.approx(measured_compute_s(), rel=1e-9)
    err = one_line_error(["estimate", *PLAN, *LAYOUT, "--profile-db", str(path), "--profile-device", CPU])
    assert "not on the planned 'h100-80gb'" in err  # choosing the CPU rows still needs the override
    err = one_line_error(["estimate", "--model", "llama3-8b", "--device", "h200", *LAYOUT, "--profile-db", str(path)])
    assert f"--profile-device: the database holds ['{H100}', '{CPU}']; name one" in err


def test_rows_without_a_record_stand_for_no_device(tmp_path):
    db = OpDB(tmp_path / "bare.db")
    db.put(H100, "gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "torch=x", (1e-3, 0.0), (2e-3, 0.0), 0.0, 1)
    db.close()
    err = one_line_error(["estimate", *PLAN, *LAYOUT, "--profile-db", str(tmp_path / "bare.db")])
    assert f"measured on '{H100}' (no autopar preset)" in err
    assert "--profile-stands-for='h100-80gb' needs --profile-db" in one_line_error(
        ["search", *PLAN, "--profile-stands-for", "h100-80gb"])


NAMES = st.sampled_from(["h100-80gb", "a100-80gb", "h200", "my-gpu"])


@given(preset=st.none() | NAMES, planned=NAMES, stands_for=st.none() | NAMES)
def test_a_database_costs_a_plan_only_for_its_device_or_the_one_named(preset, planned, stands_for):
    """Used iff measured on the planned device or ``--profile-stands-for`` names the planned
    device; a ``--profile-stands-for`` naming another device is always refused."""
    allowed = stands_for in (None, planned) and (preset == planned or stands_for == planned)
    try:
        how = accept("--profile-db", "x.db", "dev", preset, planned, stands_for)
    except AutoparError:
        assert not allowed
    else:
        assert allowed and how == ("same device" if preset == planned else f"--profile-stands-for {planned}")


def test_device_preset_needs_every_row_recorded_on_one_preset():
    h100 = record(H100, "h100-80gb")
    assert device_preset([h100, record(H100, "h100-80gb", "torch=2.14")], []) == "h100-80gb"
    assert device_preset([h100], ["torch=2.14"]) is None  # rows of another torch have no record
    assert device_preset([h100, record(H100, None, "torch=2.14")], []) is None
