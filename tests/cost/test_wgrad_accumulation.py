"""--no-gradient-accumulation-fusion (issue 15: it was read and ignored): each weight gradient is
written to param.grad and added into the fp32 main gradient by the DDP hook once per micro-batch,
10 B per parameter (autopar.cost.wgrad_accumulation)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SCRIPTS
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.cost import wgrad_accumulation
from autopar.cost.stage import all_stages
from autopar.problem import Problem
from autopar.specs import load_device, load_model, make_cluster
from autopar.specs.train import TrainSpec
from autopar.strategy import Strategy

# llama2-7b over tp 2, pp 4: per layer 4*4096^2 + 3*4096*11008 = 202,375,168 sharded weights and
# 2*4096 replicated norm weights; 8 layers a stage: 8*(202,375,168/2 + 8,192) = 809,566,208 on a device.
STAGE_LAYERS = 809_566_208
OUTPUT = 32000 * 4096 // 2  # the untied output layer's vocabulary shard (tp 2)


def _problem(fusion: bool, zero_framework: str = "megatron") -> Problem:
    train = TrainSpec(global_batch_size=64, seq_len=4096, grad_accumulation_fusion=fusion, framework=zero_framework)
    return Problem(load_model("llama2-7b"), make_cluster(load_device("h100-80gb"), 2, 8), train)


def test_parameters_whose_gradient_the_hook_adds():
    p = _problem(False)
    batch, stages = all_stages(p, Strategy(dp=2, tp=2, pp=4, sp=True, zero=1))
    # first stage: its layers, not the input embedding; last stage: + final norm (4096) + output layer
    assert wgrad_accumulation.accumulated_params(p, batch, stages).tolist() == [
        STAGE_LAYERS, STAGE_LAYERS, STAGE_LAYERS, STAGE_LAYERS + 4096 + OUTPUT]


def test_unfused_accumulation_streams_ten_bytes_per_parameter():
    p = _problem(False)
    batch, stages = all_stages(p, Strategy(dp=2, tp=2, pp=4, sp=True, zero=1))
    seconds = wgrad_accumulation.unfused_backward_s(p, batch, stages)
    # 2 B param.grad read + 4 B main_grad read + 4 B written, at 3.35 TB/s x 0.7 (the h100-80gb preset)
    assert seconds[0] == pytest.approx(10 * STAGE_LAYERS / (3.35e12 * 0.7))  # 3.45 ms per micro-batch
    fused = _problem(True)
    assert not wgrad_accumulation.unfused_backward_s(fused, *all_stages(fused, Strategy(dp=2, tp=2, pp=4))).any()
    fsdp = all_stages(p, Strategy(dp=2, tp=2, pp=4, sp=True, zero=3))
    assert not wgrad_accumulation.unfused_backward_s(p, *fsdp).any()  # Megatron-FSDP: its own buffers
    assert np.all(wgrad_accumulation.unfused_backward_s(_problem(False, "deepspeed"), batch, stages) == 0)


def test_script_flag_slows_the_step_and_is_exported(tmp_path):
    import json

    script = (SCRIPTS / "pretrain_llama2_7b.sh").read_text()  # has --no-gradient-accumulation-fusion
    assert "--no-gradient-accumulation-fusion" in script
    unfused, fused = tmp_path / "u.sh", tmp_path / "f.sh"
    unfused.write_text(script)
    fused.write_text(script.replace("--no-gradient-accumulation-fusion", ""))
    args = ["--device", "h100-80gb", "--vocab-size", "32000"]
    times = [json.loads(CliRunner().invoke(app, ["estimate", "--script", str(path), *args, "--json"]).stdout)
             ["step_time_s"] for path in (unfused, fused)]
    assert times[0] > times[1]
    out = [CliRunner().invoke(app, ["export", "--script", str(path), *args, "--format", "megatron"]).output
           for path in (unfused, fused)]
    assert "--no-gradient-accumulation-fusion" in out[0] and "--no-gradient-accumulation-fusion" not in out[1]
