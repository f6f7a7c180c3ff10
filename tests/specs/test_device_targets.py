"""Which export formats run on which device (issue 15 item 4): MindSpeed-LLM and MindFormers (sapp)
on Ascend only, Megatron-LM / torchtitan / Megatron-DeepSpeed on NVIDIA and ROCm, Galvatron and
Megatron-Bridge on NVIDIA; the others are refused with one line (exit 2) by ``export`` and ``search --target``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.specs import load_device
from autopar.specs.targets import TARGETS_BY_VENDOR, default_target, target_refusal

runner = CliRunner()
FORMATS = ("megatron", "megatron-bridge", "mindspeed", "torchtitan", "deepspeed", "galvatron", "sapp")
RUNS_ON = {"nvidia": {"megatron", "megatron-bridge", "torchtitan", "deepspeed", "galvatron"},
           "amd": {"megatron", "torchtitan", "deepspeed"}, "huawei": {"mindspeed", "sapp"}}


@pytest.mark.parametrize("device", ["h100-80gb", "gb300", "mi300x", "mi355x", "ascend-910b", "ascend-910c"])
def test_refusals_follow_the_vendor_table(device):
    d = load_device(device)
    assert set(TARGETS_BY_VENDOR[d.vendor]) == RUNS_ON[d.vendor]
    for fmt in FORMATS:
        why = target_refusal(d, fmt)
        assert (why is None) == (fmt in RUNS_ON[d.vendor]), (device, fmt)
        if why:
            assert f"does not run on {device}" in why and ", ".join(TARGETS_BY_VENDOR[d.vendor]) in why


def test_a_device_file_without_a_base_is_not_checked(tmp_path):
    f = tmp_path / "npu.yaml"
    f.write_text("peak_flops: {bf16: 400e12}\nmemory_bytes: 64e9\nhbm_bandwidth_bytes_per_s: 2e12\n"
                 "intra_node_bandwidth_bytes_per_s: 200e9\ninter_node_bandwidth_bytes_per_s: 25e9\n")
    d = load_device(None, str(f))
    assert d.vendor is None and all(target_refusal(d, fmt) is None for fmt in FORMATS)
    assert default_target(d) == "megatron"


ARGS = ["--model", "llama3-8b", "--nodes", "1", "--gbs", "64", "--seq-len", "4096"]


@pytest.mark.parametrize(("cmd", "device", "target", "allowed"), [
    (["export", "--format", "mindspeed", "--tp", "2"], "h100-80gb", "mindspeed",
     "megatron, megatron-bridge, torchtitan, deepspeed, galvatron"),
    (["export", "--format", "megatron", "--tp", "2"], "ascend-910c", "megatron", "mindspeed, sapp"),
    (["search", "--target", "galvatron"], "mi300x", "galvatron", "megatron, torchtitan, deepspeed"),
    (["search", "--target", "sapp"], "MI355X", "sapp", "megatron, torchtitan, deepspeed"),
])
def test_cli_refuses_a_format_the_device_cannot_run(cmd, device, target, allowed):
    res = runner.invoke(app, [*cmd, *ARGS, "--device", device])
    option = "--format" if cmd[0] == "export" else "--target"
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith(f"error: {option}={target}: ") and res.output.rstrip().endswith(allowed)


def test_search_on_ascend_plans_for_mindspeed():
    res = runner.invoke(app, ["search", *ARGS, "--device", "Atlas 800T A2", "--top", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["target"] == "mindspeed"
    ok = runner.invoke(app, ["export", "--format", "mindspeed", *ARGS, "--device", "ascend-910c", "--tp", "2"])
    assert ok.exit_code == 0 and "--sequence-parallel" in ok.output  # the default SP, as MindSpeed's scripts
    fp8 = runner.invoke(app, ["estimate", *ARGS, "--device", "ascend-910c", "--precision", "fp8"])
    assert fp8.exit_code == 2 and "device ascend-910c has no fp8 peak" in fp8.output
