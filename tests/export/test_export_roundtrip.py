"""Every writer's output read back by our reader for that format and re-checked against the
framework's rules (ecosystem.md 1.3, 2, 3.3, 4), over many search results; plus refusals.

torchtitan's own config classes are not loaded: torchtitan needs torch (multi-GB), not
installed here, so the TOML is checked with tomllib and our rule predicates only."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import WRITERS, deepspeed, galvatron, megatron_deepspeed, sapp, torchtitan
from autopar.export.checks import violations
from autopar.export.layout_flags import stage_layers
from autopar.search import search
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import make_problem

PROBLEMS = [make_problem("llama3-8b", nodes=2, gbs=256, seq=4096), make_problem("mixtral-8x7b", nodes=4, gbs=512),
            make_problem("qwen2.5-7b", nodes=1, gbs=64, seq=8192)]
RESULTS = [(p, e.strategy) for p in PROBLEMS for e in search(p, top_k=25).layouts]


def _key(p, s):
    return (s.tp, s.pp, s.vpp, s.cp, s.ep, s.expert_tp if p.model.is_moe else None, s.sp, s.zero, s.recompute,
            s.recompute_layers, s.mbs, stage_layers(p, s), s.tp_comm_overlap, s.cp_comm_type, s.cp_a2a_size,
            s.moe_dispatcher, s.moe_ep_overlap)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(RESULTS), st.sampled_from(["megatron", "mindspeed"]))
def test_megatron_family_round_trip(tmp_path_factory, case, fmt):
    p, s = case
    try:
        text = WRITERS[fmt](p, s)
    except AutoparError as err:
        assert fmt == "mindspeed" and ("zero=" in str(err) or "vpp" in str(err) or "cp_comm_type=allgather" in str(err)
                                       or "moe_dispatcher=" in str(err))
        return
    plan = read_script(tmp_path_factory.mktemp("x") / "out.sh", text)
    assert plan.framework == fmt
    assert violations(plan) == []
    back = plan.strategy(plan.num_nodes * plan.devices_per_node, p.model.num_layers)
    assert _key(p, back) == _key(p, s)
    assert plan.model_spec().num_params == p.model.num_params
    # Megatron-LM asserts the variable for tp/cp > 1 and refuses it under Megatron-FSDP (zero >= 2)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS=1" in text) == ((s.tp > 1 or s.cp > 1) and s.zero < 2)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(RESULTS))
def test_config_writers_round_trip(case):
    p, s = case
    for module, read in ((torchtitan, torchtitan.read), (deepspeed, json.loads), (galvatron, json.loads)):
        try:
            doc = read(megatron_deepspeed.config_json(p, s) if module is deepspeed else module.write(p, s))
        except AutoparError as err:
            assert "cannot express" in str(err)
            continue
        if module is torchtitan:
            assert torchtitan.check(doc, p.world_size, p.model.num_layers) == []
        elif module is deepspeed:
            assert deepspeed.check(doc, s.dp, s.pp) == []
        else:
            assert galvatron.check(doc, p.world_size, p.model.num_layers) == []
            assert [int(x) for x in doc["pp_division"].split(",")] == list(stage_layers(p, s))
    if s.tp_comm_overlap or (s.cp > 1 and s.cp_comm_type != "p2p"):  # neither knob in the SAPP arrays
        with pytest.raises(AutoparError, match="SAPP cannot express this layout: (TP communication|context)"):
            sapp.write(p, s)
        return
    if s.moe_dispatcher != "alltoall" or s.moe_ep_overlap:  # Megatron-LM / Megatron-Bridge only
        with pytest.raises(AutoparError, match="SAPP cannot express this layout: moe_dispatcher"):
            sapp.write(p, s)
        return
    if s.recompute_modules != ("core_attn",):  # Megatron-LM's --recompute-modules: only its writer
        with pytest.raises(AutoparError, match="SAPP cannot express this layout: recompute modules"):
            sapp.write(p, s)
        return
    arrays = json.loads(sapp.write(p, s))
    if s.vpp == 1:
        assert sum(arrays["offset"]) == p.model.num_layers % s.pp


def test_torchtitan_values():
    p = make_problem("llama3-8b", nodes=2, gbs=256, seq=4096, precision="fp8")
    s = Strategy(dp=4, tp=2, pp=2, vpp=2, sp=True, zero=3, recompute="selective", schedule="interleaved", mbs=1)
    doc = torchtitan.read(torchtitan.write(p, s))
    par = doc["parallelism"]
    assert (par["data_parallel_shard_degree"], par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (4, 2, 2)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and par["pipeline_parallel_layers_per_stage"] == 8
    assert doc["training"]["local_batch_size"] == 64 and doc["activation_checkpoint"]["selective_ac_option"] == "op"
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True


@pytest.mark.parametrize("fmt, layout, reason", [
    ("torchtitan", dict(dp=8, tp=2, sp=True, zero=1), "zero=1"),
    ("torchtitan", dict(dp=16, tp=1, ep=2, etp=1, zero=3), "ep"),
    ("torchtitan", dict(dp=4, tp=4, sp=False, zero=3), "without sequence parallelism"),
    ("deepspeed", dict(dp=8, pp=2, zero=2), "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    ("deepspeed", dict(dp=8, cp=2, zero=1), "cp=2 with cp_comm_type=p2p: DeepSpeed's sequence parallelism is Ulysses"),
    ("galvatron", dict(dp=16, zero=1), "zero=1"),
    ("mindspeed", dict(dp=8, zero=2), "Megatron FSDP"),
    # Megatron-LM takes unequal middle stages as --pipeline-model-parallel-layout; MindSpeed has no vpp form
    ("mindspeed", dict(dp=2, pp=4, vpp=2, schedule="interleaved", layers_per_stage=(6, 10, 8, 8)),
     "cannot be combined with virtual pipeline stages"),
    ("galvatron", dict(dp=8, cp=2, zero=0), "never reads cp_sizes_enc"),
])
def test_refusals(fmt, layout, reason):
    p = make_problem("llama3-8b", nodes=2, gbs=256)
    s = Strategy(**layout)
    if fmt == "torchtitan" and layout.get("ep"):
        p, s = make_problem("qwen3-30b-a3b", nodes=2, gbs=256), Strategy(dp=16, tp=1, ep=2, etp=1, zero=1)
        reason = "zero=1"
    with pytest.raises(AutoparError, match=reason):
        WRITERS[fmt](p, s)


@pytest.mark.parametrize("model, fmt, layout, reason", [
    ("qwen3-30b-a3b", "torchtitan", dict(dp=8, pp=2, zero=0), "qwen3 does not support pipelining"),
    ("deepseek-v3", "torchtitan", dict(dp=8, cp=2, zero=3), "Context Parallel only supports SDPA attention"),
    # torchtitan 0.2.2 has no multi-token prediction module: DeepSeek-V3's MTP layer would not run
    ("deepseek-v3", "torchtitan", dict(dp=8, ep=8, etp=1, zero=3), "multi-token prediction: .* no MTP module"),
    ("mixtral-8x7b", "torchtitan", dict(dp=16, zero=3), "torchtitan 0.2.2 has no model"),
    ("mixtral-8x7b", "galvatron", dict(dp=16, zero=3), "no MoE model"),
    # the model's reason, not the first unrelated layout feature (vpp=2 here)
    ("mixtral-8x7b", "deepspeed", dict(dp=4, pp=2, vpp=2, zero=1), "MoE has no Megatron-DeepSpeed"),
])
def test_refusals_carry_the_frameworks_reason(model, fmt, layout, reason):
    with pytest.raises(AutoparError, match=reason):
        WRITERS[fmt](make_problem(model, nodes=2, gbs=256), Strategy(**layout))


def test_cli_export_from_result_and_refusal(tmp_path):
    runner = CliRunner()
    base = ["--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "2", "--gbs", "256"]
    res = runner.invoke(app, ["search", *base, "--json", "--top", "3"])
    (tmp_path / "r.json").write_text(res.stdout)
    out = runner.invoke(app, ["export", "--format", "megatron", "--from", str(tmp_path / "r.json"), "--rank", "2", *base])
    assert out.exit_code == 0, out.output
    best2 = json.loads(res.stdout)["layouts"][1]["strategy"]
    assert f"--tensor-model-parallel-size {best2['tp']} " in out.stdout
    bad = runner.invoke(app, ["export", "--format", "deepspeed", *base, "--pp", "2", "--zero", "2"])
    assert bad.exit_code == 2 and "error:" in bad.output
    bad = runner.invoke(app, ["export", "--format", "torchtitan", *base, "--tp", "2", "--sp", "--zero", "1"])
    assert bad.exit_code == 2 and "zero=1" in bad.output


PER_STAGE = dict(dp=2, pp=4, zero=1, layers_per_stage=(7, 8, 9, 8), recompute_per_stage=("full", "none", "none", "none"))


@pytest.mark.parametrize("fmt", ["megatron", "mindspeed", "torchtitan", "deepspeed"])
def test_one_setting_writers_refuse_per_stage_recompute_naming_those_that_can(fmt):
    p = make_problem("llama3-8b", nodes=1, gbs=64)
    with pytest.raises(AutoparError, match=r"recompute per stage full,none,none,none .*--format sapp, or galvatron"):
        WRITERS[fmt](p, Strategy(**PER_STAGE))


def test_sapp_and_galvatron_write_recompute_per_stage():
    p = make_problem("llama3-8b", nodes=1, gbs=64)
    arrays = sapp.config(p, Strategy(**PER_STAGE))
    assert arrays["offset"] == [-1, 0, 1, 0] and arrays["recompute"] == [7, 0, 0, 0]
    assert arrays["select_recompute"] == [0, 0, 0, 0]
    mixed = sapp.config(p, Strategy(**dict(PER_STAGE, recompute_per_stage=("full", "selective", "none", "none"))))
    assert mixed["recompute"] == [7, 0, 0, 0] and mixed["select_recompute"] == [0, 8, 0, 0]
    doc = galvatron.config(p, Strategy(**dict(PER_STAGE, zero=0)))
    assert doc["checkpoint"] == ",".join(["1"] * 7 + ["0"] * 25)
    assert galvatron.check(doc, p.world_size, p.model.num_layers) == []
    with pytest.raises(AutoparError, match="selective recompute.*--format sapp"):
        galvatron.config(p, Strategy(**dict(PER_STAGE, zero=0, recompute_per_stage=("selective",) + ("none",) * 3)))


def test_cli_search_target_sapp_round_trip(tmp_path):
    """The pipelined sapp-target search of test_pipeline_per_stage (#1 sets recompute per stage):
    its result JSON carries it, export --format sapp writes it, Megatron refuses it; the CLI
    search with --target sapp reports its target and a null megatron_args only when #1 needs it."""
    from autopar.space import SpaceOptions

    # MindFormers runs on Ascend: a 910B held to 40 GiB, where stage 0 needs recompute and the later stages do not
    from autopar.cli.inputs import problem_from_options

    forty = ["memory_bytes=42949672960"]
    p = problem_from_options("llama3-8b", "ascend-910b", 1, None, 64, 4096, None, None, forty, None, None)
    result = search(p, top_k=3, options=SpaceOptions(tp=(1,), pp=(4,), cp=(1,), mbs=(1,), zero=(1,), max_vpp=1),
                    target="sapp")
    best = result.layouts[0].strategy
    assert best.recompute_per_stage is not None
    (tmp_path / "r.json").write_text(json.dumps(result.to_dict()))
    runner = CliRunner()
    base = ["--model", "llama3-8b", "--device", "ascend-910b", "--device-set", forty[0], "--nodes", "1", "--gbs", "64",
            "--seq-len", "4096"]
    out = runner.invoke(app, ["export", "--format", "sapp", "--from", str(tmp_path / "r.json"), *base])
    assert out.exit_code == 0, out.output
    arrays = json.loads(out.stdout)
    assert arrays["recompute"] == [n if r == "full" else 0 for n, r in zip(best.layers_per_stage, best.stage_recompute)]
    assert sum(arrays["offset"]) == 0 and len(arrays["offset"]) == 4
    bad = runner.invoke(app, ["export", "--format", "mindspeed", "--from", str(tmp_path / "r.json"), *base])
    assert bad.exit_code == 2 and "--format sapp" in bad.output
    res = runner.invoke(app, ["search", *base, "--target", "sapp", "--json", "--top", "3"])
    doc = json.loads(res.stdout)
    assert doc["target"] == "sapp"
    assert (doc["megatron_args"] is None) == bool(doc["layouts"][0]["strategy"]["recompute_per_stage"])
