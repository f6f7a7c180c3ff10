"""torchtitan FSDP2 + pipeline parallelism: the rule, the memory and DP-time terms, the TOML, the
CLI target and the validation rows (sources in :mod:`autopar.cost.framework_memory`)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MEASUREMENTS, make_problem, toy_model
from typer.testing import CliRunner

from autopar.cli import app
from autopar.cost import framework_memory as fw
from autopar.cost.memory import stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.errors import LayoutError
from autopar.export import torchtitan
from autopar.layout_batch import LayoutBatch
from autopar.rules import check_strategy
from autopar.strategy import Strategy
from autopar.validate.measurements import read_rows
from autopar.validate.row_pipeline import torchtitan_split
from autopar.validate.rows import Row, to_case
from autopar.validate.score import score_row

FSDP_PP = Strategy(dp=4, tp=1, pp=2, mbs=1, zero=3, recompute="full")


def _toy(framework: str = "torchtitan"):
    # vocab 128: no Megatron padding (multiple of 128), so embedding = output = 128 * 16 = 2048
    return make_problem(toy_model(vocab_size=128), gbs=16, seq=64, framework=framework)


def test_rule_accepts_fsdp_with_pp_except_on_deepspeed():
    check_strategy(_toy("torchtitan"), FSDP_PP)  # no error
    check_strategy(_toy("megatron"), FSDP_PP)  # Megatron-FSDP with pp: validate_args accepts it
    with pytest.raises(LayoutError) as err:
        check_strategy(_toy("deepspeed"), FSDP_PP)
    assert err.value.rules == ("zero_with_pp",) and "incompatible with pipeline parallelism" in str(err.value)
    with pytest.raises(LayoutError, match="zero_with_pp"):  # ZeRO-2 is not what torchtitan runs
        check_strategy(_toy("torchtitan"), FSDP_PP.model_copy(update={"zero": 2}))


def test_fsdp_pp_memory_by_hand():
    # Toy layer (h 16, FFN 64, 4 heads of 4, LayerNorm-free RMSNorm, no bias): q,k,v,o 4*16*16 = 1024,
    # fc1+fc2 2*16*64 = 2048, two norms 32 -> 3104. Stage 0: 2 layers + embedding 2048 = 8256;
    # stage 1: 2 layers + output 2048 + final norm 16 = 8272 parameters.
    p = _toy()
    batch = LayoutBatch.from_strategy(FSDP_PP, 16)
    batch = LayoutBatch(**{k: np.repeat(v, 2) for k, v in vars(batch).items()})
    stages = Stages(np.array([0, 1]), np.array([0, 2]), np.array([2, 2]))
    n = np.array([8256.0, 8272.0])
    assert stage_params(p, batch, stages).total == pytest.approx(n)
    mem = stage_memory(p, batch, stages)
    # sharded over dp = 4: fp32 weights 4/4, fp32 grads 4/4, AdamW m+v 8/4 bytes per parameter
    assert mem.weights_bytes == pytest.approx(n)
    assert mem.grads_bytes == pytest.approx(n)
    assert mem.optimizer_bytes == pytest.approx(2 * n)
    # held through the step: bf16 gathered stage (2 B) + fp32 unsharded gradient accumulation (4 B)
    overhead = p.cluster.device.framework_overhead_bytes
    assert mem.other_bytes - overhead == pytest.approx(6 * n)
    # pp = 1 keeps only two gathered blocks plus the root (embedding + output), 2 B each
    one = LayoutBatch.from_strategy(FSDP_PP.model_copy(update={"pp": 1, "dp": 8}), 16)
    got = fw.unsharded_param_bytes(p, one, np.array([3104.0]), np.array([True]), np.array([True]), 99e9)
    assert got[0] == pytest.approx(2 * 2 * 3104 + 2 * 2 * 2048)


def test_fsdp_pp_gradients_reduced_once_per_step():
    # Doubling the micro-batches (gbs 64 -> 128 at mbs 1, dp 4: m 16 -> 32) must not add DP time:
    # the stage is gathered and reduce-scattered once per step; per micro-batch it would double.
    from autopar.estimate import estimate

    s = Strategy(dp=4, tp=2, pp=2, mbs=1, sp=True, zero=3, recompute="full")
    dp_s = [estimate(make_problem("llama3-8b", nodes=2, gbs=g, seq=4096, framework="torchtitan"), s)
            .time_breakdown_s["dp_comm"] for g in (64, 128)]
    assert dp_s[0] > 0 and dp_s[1] <= dp_s[0] * (1 + 1e-9)


def test_toml_round_trip_of_fsdp_with_pp():
    p = make_problem("llama3-8b", nodes=2, gbs=64, seq=4096, framework="torchtitan")
    s = Strategy(dp=4, tp=2, pp=2, mbs=2, sp=True, zero=3, recompute="full")
    check_strategy(p, s)
    doc = torchtitan.read(torchtitan.write(p, s))
    par, tr = doc["parallelism"], doc["training"]
    assert (par["data_parallel_shard_degree"], par["pipeline_parallel_degree"]) == (4, 2)
    assert par["fsdp_reshard_after_forward"] == "default"  # torchtitan: no resharding with PP
    assert par["pipeline_parallel_schedule"] == "1F1B" and par["pipeline_parallel_microbatch_size"] == 2
    assert tr["local_batch_size"] == 64 // 4  # 8 micro-batches of 2
    assert torchtitan.check(doc, p.world_size, p.model.num_layers) == []


def test_cli_target_torchtitan_exports_fsdp_with_pp():
    args = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "64", "--seq-len", "4096", "--tp", "2", "--pp", "2",
            "--dp", "4", "--zero", "3", "--sp", "--mbs", "1"]
    out = CliRunner().invoke(app, ["export", "--format", "torchtitan", *args])
    assert out.exit_code == 0 and "pipeline_parallel_degree = 2" in out.output
    out = CliRunner().invoke(app, ["export", "--format", "megatron", *args])
    assert out.exit_code == 0 and "--use-megatron-fsdp" in out.output and "CUDA_DEVICE_MAX_CONNECTIONS" not in out.output


def test_torchtitan_default_split():
    # generate_split_points: first/last get L // S, middle stages one more while L % S lasts
    assert torchtitan_split(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert torchtitan_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert torchtitan_split(32, 4) == (8, 8, 8, 8)


def test_405b_pipeline_rows_are_mapped_and_scored():
    rows = {r.id: r for r in read_rows(MEASUREMENTS) if r.id.startswith("TT2412-T")}
    one = to_case(rows["TT2412-T5-1-tps"])  # local batch 32, 1F1B: pp = 8 micro-batches of 4
    assert (one.strategy.pp, one.strategy.vpp, one.strategy.mbs, one.strategy.zero) == (8, 1, 4, 3)
    assert one.strategy.num_microbatches(256) == 8
    assert one.strategy.layers_per_stage == (15, 16, 16, 16, 16, 16, 16, 15)
    four = to_case(rows["TT2412-T6-4-tps"])  # local batch 8 over pp 8: mbs 1
    assert (four.strategy.mbs, four.strategy.cp, four.strategy.num_microbatches(8)) == (1, 8, 8)
    assert any("mbs=" in a for a in one.assumed)
    cache: dict = {}
    for rid in ("TT2412-T5-1-tps", "TT2412-T5-1-mem", "TT2412-T6-1-tps", "TT2412-T6-4-mem"):
        result = score_row(rows[rid], cache)
        assert result.predicted is not None, result.reason
        assert abs(result.error_pct) < 50


def test_interleaved_row_uses_two_stages_per_rank():
    from autopar.validate.row_pipeline import Unscorable, torchtitan_pipeline

    row = Row({"id": "TT2412-X", "notes": "schedule Interleaved 1F1B", "layers": "126"})
    assumed: list[str] = []
    # 16 stages of 7, 8 x 14, 7 = Megatron's split with embedding and loss counted as layers;
    # 8 micro-batches (= pp, torchtitan's default before pytorch/torchtitan#781) of 32 / 8 = 4
    mbs, vpp, split = torchtitan_pipeline(row, 32, 8, None, None, assumed)
    assert (mbs, vpp) == (4, 2) and split == {"account_for_embedding": True, "account_for_loss": True}
    with pytest.raises(Unscorable, match="local batch 12"):
        torchtitan_pipeline(row, 12, 8, None, None, [])
    # 61 layers over 4 x 8 stages: torchtitan gives 1, 2 x 29, 1, 1 (generate_split_points), which
    # the accounted split cannot say; stage i on rank i % 4, so rank 2 and 3 end with one layer
    # each, the MTP layer and the loss after rank 3's.
    dsv3 = Row({"id": "TT-DSV3", "notes": "interleaved", "layers": "61"})
    _, vpp, split = torchtitan_pipeline(dsv3, 32, 4, None, 8, [], mtp_num_layers=1)
    assert vpp == 8 and split == {"pipeline_layout": "Et|(tt|)*29t|tmL"}
