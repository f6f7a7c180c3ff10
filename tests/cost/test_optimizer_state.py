"""Optimizer state and gradient dtypes (precision-aware optimizer), optimizer offload to the host,
fp8 (Transformer Engine) linear inputs and the MoE layer's saved tensors, checked by hand on
NVIDIA's Qwen3-30B-A3B 16-H100 recipe and a DeepSeek-V3 1,024-H100 layout; the launch-script
flags and the Megatron export of each."""

from __future__ import annotations

import numpy as np
import pytest

from autopar.cost import activations as act
from autopar.cost.memory import stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import all_stages
from autopar.cost.stage_time import optimizer_time_s
from autopar.errors import AutoparError
from autopar.estimate import estimate
from autopar.export import WRITERS
from autopar.export.megatron import megatron_args
from autopar.specs.script import read_script
from autopar.specs.train import TrainSpec
from autopar.strategy import Strategy
from conftest import SCRIPTS, make_problem
from test_bad_input import one_line_error

QWEN3_RECIPE = SCRIPTS / "pretrain_qwen3_30b_a3b_h100_fp8cs.sh"
GIB = 2**30
# Megatron-Bridge 25.11: tp 1, pp 2, vpp 24, ep 8, etp 1, mbs 2 (dp 8 on 16 H100)
QWEN3_LAYOUT = Strategy(dp=8, tp=1, pp=2, vpp=24, ep=8, etp=1, mbs=2, zero=1, schedule="interleaved")
# Megatron-Bridge DeepSeek-V3 H100: tp 2, pp 8, ep 64, etp 1, selective mla_up_proj + mlp
DSV3_LAYOUT = Strategy(dp=64, tp=2, pp=8, ep=64, etp=1, mbs=1, sp=True, zero=1, recompute="selective",
                       recompute_modules=("mla_up_proj", "mlp"))


def _recipe_with(flags: str) -> str:
    """The Qwen3 recipe script with ``flags`` in place of ``--grad-reduce-in-bf16``; with CPU offload
    its fp8 recipe becomes the delayed one (Megatron asserts it with ``--fp8-param-gather``)."""
    text = QWEN3_RECIPE.read_text().replace("--grad-reduce-in-bf16", flags)
    if "--optimizer-cpu-offload" in flags and "--fp8-recipe" not in flags:
        text = text.replace("--fp8-recipe tensorwise", "--fp8-recipe delayed")
    return text


def _qwen3(**train):
    return make_problem("qwen3-30b-a3b", nodes=2, gbs=512, seq=4096, **train)


def _dsv3(**train):
    return make_problem("deepseek-v3", nodes=128, gbs=8192, seq=4096, **train)


# ----- activations ------------------------------------------------------------------------------
def test_qwen3_layer_activations_by_hand_bf16_and_fp8():
    """One Qwen3-30B-A3B layer, n = 2 x 4096 tokens, tp 1, per token: attention = norm input 2h +
    QKV input 2h (h = 2048) + q, k, v 2 x (4096 + 2 x 512) + flash output 2 x 4096 + fp32 LSE 4 x 32
    = 26,752 B; MoE block = norm + router input 2 x 2h, fp32 logits and scores 2 x 4 x 128, the
    8 copies' fc1 input 8 x 2 x 2048 and SwiGLU 8 x 6 x 768: 78,848 B (no combine copy: the
    probabilities are multiplied in the activation since Megatron-Core 0.13). Under fp8 the
    QKV, output-projection, fc1 and fc2 inputs are 1-byte copies: 28,800 + 56,320 B."""
    for precision, per_token in (("bf16", 26_752 + 78_848), ("fp8", 28_800 + 56_320)):
        p = _qwen3(precision=precision)
        batch, _ = all_stages(p, QWEN3_LAYOUT)
        none = np.zeros(len(batch), dtype=bool)
        layer = act.attention_bytes(p, batch, none) + act.mlp_bytes(p, batch, moe=True, selective=none)
        assert layer[0] == per_token * 8192


def test_fp8_linear_inputs_are_megatron_only():
    """torchtitan's float8 keeps its bf16 inputs: 2 B per linear input element."""
    megatron = make_problem("llama3-8b", precision="fp8")
    titan = make_problem("llama3-8b", precision="fp8", framework="torchtitan")
    assert act.linear_input_bytes(megatron) == 1 and act.linear_input_bytes(titan) == 2


# ----- NVIDIA's Qwen3-30B-A3B recipe ----------------------------------------------------------
def test_qwen3_recipe_script_reads_bf16_grads_and_fp8_weights():
    plan = read_script(QWEN3_RECIPE)
    assert plan.train_fields["grad_dtype"] == "bf16" and plan.train_fields["fp8_param_storage"] is True
    assert plan.layout["vpp"] == 24 and plan.layout["ep"] == 8 and plan.layout["etp"] == 1


def test_qwen3_recipe_fits_by_hand():
    """Stage 1 of 2 (24 layers, output layer): experts 24 x 128 x 3 x 2048 x 768 / ep 8 =
    1,811,939,328 params on one device, expert data-parallel size 16 / (etp 1 x ep 8 x pp 2) = 1,
    so their fp32 master + Adam state is 12 B each, unsharded: 21.7e9 B. Main gradients bf16
    (Megatron-Bridge ``grad_reduce_in_fp32=False``): 2 B per param. fp8 weights with
    ``--fp8-param-gather``: fp8 + transpose, 2 B. Activations: the last rank holds 2 x 0 + 23 x 2
    + 1 = 47 one-layer chunks in flight at 85,120 B/token x 8192 tokens, plus the output layer's
    inputs and fp32 logits 8192 x (2 x 2 x 2048 + 4 x 151,936) and one MoE layer's dispatch
    buffers 2 x 2048 x (8 x 8192 sent + 8 x 8192 received)."""
    p = _qwen3(precision="fp8", fp8_param_storage=True, grad_dtype="bf16")
    batch, stages = all_stages(p, QWEN3_LAYOUT)
    params = stage_params(p, batch, stages)
    mem = stage_memory(p, batch, stages)
    assert params.experts[1] == 24 * 128 * 3 * 2048 * 768 // 8 == 1_811_939_328
    expert_optimizer = 12 * params.experts[1]
    dense_optimizer = 12 * params.dense[1] / 8
    assert mem.optimizer_bytes[1] == pytest.approx(expert_optimizer + dense_optimizer)
    assert mem.grads_bytes[1] == pytest.approx(2 * params.total[1])
    layers = 47 * 85_120 * 8192
    logits = 8192 * (2 * 2 * 2048 + 4 * 151_936)
    dispatch = 2 * 2048 * (8 * 8192 + 8 * 8192)
    assert mem.activations_bytes[1] == layers + logits + dispatch == 38_355_861_504
    e = estimate(p, QWEN3_LAYOUT)
    assert e.fits and e.peak_memory_bytes < 0.9 * e.device_memory_bytes
    assert 65 * GIB < e.peak_memory_bytes < 72 * GIB  # it ran on 80 GB H100s; was 92.6 GiB


def test_qwen3_recipe_script_estimate_fits_from_the_command_line():
    from typer.testing import CliRunner

    from autopar.cli import app

    result = CliRunner().invoke(app, ["estimate", "--script", str(QWEN3_RECIPE), "--device", "h100-80gb", "--json"])
    assert result.exit_code == 0, result.output
    import json

    out = json.loads(result.stdout)
    assert out["fits"] and out["strategy"]["vpp"] == 24
    assert out["peak_memory_bytes"] < 0.9 * out["device_memory_bytes"]


# ----- precision-aware optimizer on DeepSeek-V3 --------------------------------------------------
def test_deepseek_v3_bf16_moments_and_grads_by_hand():
    """DeepSeek-V3 (report sec. 3.3.3) and Megatron-Bridge's recipe: fp32 master, bf16 moments, bf16
    main gradients: 4 + 2 + 2 = 8 B of optimizer state per param instead of 12 (dense over dp x cp
    = 64, experts over 1024 / (etp 1 x ep 64 x pp 8) = 2), and 2 B of gradient instead of 4."""
    fp32 = _dsv3()
    aware = _dsv3(grad_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert aware.train.optimizer_bytes_per_param == 8 and fp32.train.optimizer_bytes_per_param == 12
    batch, stages = all_stages(aware, DSV3_LAYOUT)
    params = stage_params(aware, batch, stages)
    before, after = stage_memory(fp32, batch, stages), stage_memory(aware, batch, stages)
    for i in range(8):
        assert after.optimizer_bytes[i] == pytest.approx(8 * params.dense[i] / 64 + 8 * params.experts[i] / 2)
        assert after.optimizer_bytes[i] == pytest.approx(before.optimizer_bytes[i] * 8 / 12)
        assert after.grads_bytes[i] == pytest.approx(before.grads_bytes[i] / 2)
    # stage 1: 8 MoE layers x 256 experts x 3 x 7168 x 2048 / ep 64 = 1,409,286,144 expert params
    assert params.experts[1] == 8 * 256 * 3 * 7168 * 2048 // 64 == 1_409_286_144


# ----- offload ------------------------------------------------------------------------------------
def test_offload_moves_the_optimizer_shard_and_charges_the_host_link():
    """Half the shard on the host: the device keeps half the optimizer state; each step copies
    the offloaded gradients down (4 B fp32) and the fp32 masters up (4 B) over PCIe Gen5 (64 GB/s
    per direction on H100): (0.5 x shard x 8 B) / 64e9 s, or 4 B / 64e9 with the copies
    overlapped (``--overlap-cpu-optimizer-d2h-h2d``)."""
    base = _qwen3()
    half = _qwen3(optimizer_offload_fraction=0.5)
    both = _qwen3(optimizer_offload_fraction=0.5, optimizer_offload_overlap=True)
    batch, stages = all_stages(base, QWEN3_LAYOUT)
    params = stage_params(base, batch, stages)
    shard = params.dense / 8 + params.experts / 1
    before, after = stage_memory(base, batch, stages), stage_memory(half, batch, stages)
    np.testing.assert_allclose(after.optimizer_bytes, before.optimizer_bytes / 2)
    np.testing.assert_allclose(after.weights_bytes + after.grads_bytes, before.weights_bytes + before.grads_bytes)
    t0, t_half, t_both = (optimizer_time_s(q, batch, params) for q in (base, half, both))
    np.testing.assert_allclose(t_half - t0 / 2, 0.5 * shard * (4 + 4) / 64e9, rtol=1e-12)
    np.testing.assert_allclose(t_both - t0 / 2, 0.5 * shard * 4 / 64e9, rtol=1e-12)
    assert t_half[0] > 0.1  # 0.9e9-element shard: ~0.11 s of PCIe per step, no longer negligible


def test_offload_on_a_device_without_host_bandwidth_is_one_error(tmp_path):
    script = tmp_path / "offload.sh"
    script.write_text(_recipe_with("--use-precision-aware-optimizer --optimizer-cpu-offload"))
    err = one_line_error(["estimate", "--script", str(script), "--device", "b200"])
    assert "--optimizer-offload-fraction=1.0: device b200 has no host link bandwidth" in err
    assert "--device-set host_bandwidth_bytes_per_s=" in err


# ----- launch-script flags -------------------------------------------------------------------------
@pytest.mark.parametrize("flags, fields", [
    ("--grad-reduce-in-bf16", dict(grad_dtype="bf16")),
    ("--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
     dict(grad_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")),
    ("--use-precision-aware-optimizer --main-params-dtype fp16 --exp-avg-dtype fp8 --exp-avg-sq-dtype fp16",
     dict(main_params_dtype="fp16", exp_avg_dtype="fp8", exp_avg_sq_dtype="fp16")),
    ("--use-precision-aware-optimizer --optimizer-cpu-offload",
     dict(optimizer_offload_fraction=1.0, optimizer_offload_overlap=False)),
    ("--use-precision-aware-optimizer --optimizer-cpu-offload --optimizer-offload-fraction 0.25 "
     "--overlap-cpu-optimizer-d2h-h2d", dict(optimizer_offload_fraction=0.25, optimizer_offload_overlap=True)),
])
def test_script_flags_are_read_and_exported_back(tmp_path, flags, fields):
    script = tmp_path / "run.sh"
    script.write_text(_recipe_with(flags))
    plan = read_script(script)
    got = {k: plan.train_fields[k] for k in fields}
    assert got == fields
    p = _qwen3(precision="fp8", fp8_param_storage=True, **fields)
    args = megatron_args(p, QWEN3_LAYOUT)
    back = read_script(tmp_path / "back.sh", "torchrun pretrain_gpt.py --num-layers 48 --hidden-size 2048 "
                       "--num-attention-heads 32 --seq-length 4096 --vocab-size 151936 "
                       + args.replace("\\\n", " "))
    assert {k: back.train_fields[k] for k in fields} == fields
    base = TrainSpec(global_batch_size=512, seq_len=4096, **fields)
    assert base.optimizer_bytes_per_param <= 12


def test_each_flag_changes_the_estimate(tmp_path):
    """Every flag moves the memory (or, for the overlap switch, the time) the way it should."""
    def run(flags):
        script = tmp_path / "run.sh"
        script.write_text(_recipe_with(flags))
        plan = read_script(script)
        p = _qwen3(precision="fp8", fp8_param_storage=True,
                   **{k: v for k, v in plan.train_fields.items() if k in TrainSpec.model_fields and k not in (
                       "global_batch_size", "seq_len", "precision", "flash_attention", "make_vocab_size_divisible_by",
                       "fp8_param_storage")})
        e = estimate(p, QWEN3_LAYOUT)
        return e.memory_per_stage[1], e.time_breakdown_s["optimizer"]

    (m0, t0) = run("")
    aware = "--use-precision-aware-optimizer"
    assert run("--grad-reduce-in-bf16")[0].grads_bytes == pytest.approx(m0.grads_bytes / 2)
    assert run(f"{aware} --main-grads-dtype bf16")[0].grads_bytes == pytest.approx(m0.grads_bytes / 2)
    assert run(f"{aware} --main-params-dtype fp16")[0].optimizer_bytes == pytest.approx(m0.optimizer_bytes * 10 / 12)
    assert run(f"{aware} --exp-avg-dtype bf16")[0].optimizer_bytes == pytest.approx(m0.optimizer_bytes * 10 / 12)
    assert run(f"{aware} --exp-avg-sq-dtype fp8")[0].optimizer_bytes == pytest.approx(m0.optimizer_bytes * 9 / 12)
    m1, t1 = run(f"{aware} --optimizer-cpu-offload --optimizer-offload-fraction 0.5")
    assert m1.optimizer_bytes == pytest.approx(m0.optimizer_bytes / 2) and t1 > t0
    assert run(f"{aware} --optimizer-cpu-offload --optimizer-offload-fraction 0.5 "
               "--overlap-cpu-optimizer-d2h-h2d")[1] < t1


@pytest.mark.parametrize("flags, message", [
    ("--exp-avg-dtype bf16", "--exp-avg-dtype=bf16 needs --use-precision-aware-optimizer"),
    ("--use-precision-aware-optimizer --exp-avg-dtype int8", "--exp-avg-dtype='int8': allowed fp32, fp16, bf16, fp8"),
    ("--use-precision-aware-optimizer --main-params-dtype bf16", "--main-params-dtype='bf16': allowed fp32, fp16"),
    ("--optimizer-cpu-offload", "--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    ("--use-precision-aware-optimizer --optimizer-cpu-offload --optimizer-offload-fraction 1.5",
     "--optimizer-offload-fraction=1.5: must be in [0, 1]"),
    ("--optimizer-offload-fraction 0.5", "--optimizer-offload-fraction without --optimizer-cpu-offload"),
    ("--grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32", "--accumulate-allreduce-grads-in-fp32 with bf16"),
    ("--use-precision-aware-optimizer --optimizer-cpu-offload --fp8-recipe tensorwise",
     "--optimizer-cpu-offload with --fp8-param-gather and --fp8-recipe=tensorwise"),
])
def test_bad_optimizer_flags_are_one_error(tmp_path, flags, message):
    script = tmp_path / "bad.sh"
    script.write_text(_recipe_with(flags))
    err = one_line_error(["estimate", "--script", str(script), "--device", "h100-80gb"])
    assert message in err


def test_other_formats_refuse_megatron_optimizer_state():
    p = _qwen3(exp_avg_dtype="bf16")
    s = Strategy(dp=16, tp=1, pp=1, ep=8, etp=1, mbs=1, zero=3)
    for fmt in ("torchtitan", "galvatron", "sapp", "deepspeed", "megatron-bridge"):
        with pytest.raises(AutoparError, match=f"export --format {fmt}: the script's optimizer dtypes"):
            WRITERS[fmt](p, s)
    with pytest.raises(AutoparError, match="bf16 main gradients are Megatron-LM's"):
        WRITERS["megatron-bridge"](_qwen3(grad_dtype="bf16"), s)
    assert "--use-precision-aware-optimizer --exp-avg-dtype bf16" in megatron_args(p, QWEN3_LAYOUT)
    assert "precision-aware" not in megatron_args(_qwen3(), QWEN3_LAYOUT)
