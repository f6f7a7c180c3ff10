"""``--format megatron-bridge``: the recipe and ConfigContainer overrides run the planned layout,
field by field (issue 14 item 4).

The written script is read back the way Megatron-Bridge's runner reads it (``shlex`` words,
``KEY=VALUE`` overrides in Hydra syntax), independently of the writer, and every field that makes
the layout is compared with the plan: dp (what the world leaves after tp*pp*cp,
``ConfigContainer.get_data_parallel_size``), tp, pp, vpp, cp, ep, etp, mbs, gbs, micro-batch
count, SP, the pipeline split, recompute granularity/method/num_layers/modules, distributed
optimizer / Megatron-FSDP, precision recipe and sequence length. Where Hydra is installed, the
overrides are also applied as Megatron-Bridge's ``parse_hydra_overrides`` applies them
(``src/megatron/bridge/training/utils/omegaconf_utils.py``: OmegaConf struct mode, Hydra's
override parser and ``ConfigLoaderImpl._apply_overrides_to_config``).
"""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.export import WRITERS
from autopar.export.megatron_bridge import overrides, recipe_for
from autopar.pipeline.layout import PipelineLayout, layout_of
from autopar.search import search
from autopar.strategy import Strategy, default_layers_per_stage
from conftest import make_problem

# Megatron-Bridge's mixed-precision recipe names (training/mixed_precision.py, @register).
PRECISION_RECIPE = {"bf16": "bf16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed"}
# Megatron-FSDP sharding strategy per ZeRO stage (Megatron-Core DistributedDataParallelConfig).
SHARDING = {0: "no_shard", 1: "no_shard", 2: "optim_grads", 3: "optim_grads_params"}


def _value(text: str):
    """One Hydra override value: null, true/false, integer, decimal number, [a,b] list or a bare string."""
    if text.startswith("[") and text.endswith("]"):
        return [_value(x) for x in text[1:-1].split(",") if x]
    if text.lstrip("-").replace(".", "", 1).isdigit() and "." in text:
        return float(text)
    return {"null": None, "true": True, "false": False}.get(text, int(text) if text.lstrip("-").isdigit() else text)


def read_back(text: str) -> tuple[int, str, dict]:
    """(world size, recipe, overrides) of a written script, as the shell and the runner see it."""
    assert text.startswith("#!/bin/bash\n")
    command = " ".join(line for line in text.splitlines() if not line.startswith("#")).replace("\\ ", " ")
    words = shlex.split(command)
    assert words[0] == "torchrun" and words[5] == "scripts/training/run_recipe.py"
    world = int(words[words.index("--nnodes") + 1]) * int(words[words.index("--nproc_per_node") + 1])
    table = {}
    for word in words[words.index("--recipe") + 2:]:
        key, _, value = word.partition("=")
        assert key not in table, key
        table[key] = _value(value)
    return world, words[words.index("--recipe") + 1], table


def assert_runs_the_plan(p, s: Strategy, text: str) -> None:
    """Every layout field of the read-back overrides equals the plan's."""
    world, _, ov = read_back(text)
    m = lambda key: ov[f"model.{key}"]  # noqa: E731
    assert world == p.world_size and world // (m("tensor_model_parallel_size") * m("pipeline_model_parallel_size")
                                               * m("context_parallel_size")) == s.dp
    assert (m("tensor_model_parallel_size"), m("pipeline_model_parallel_size"), m("context_parallel_size")) == \
        (s.tp, s.pp, s.cp)
    assert (m("virtual_pipeline_model_parallel_size") or 1) == s.vpp
    assert m("expert_model_parallel_size") == s.ep
    assert (m("expert_tensor_parallel_size") or s.tp) == s.expert_tp
    assert m("sequence_parallel") is s.sp
    mbs, gbs = ov["train.micro_batch_size"], ov["train.global_batch_size"]
    assert (mbs, gbs) == (s.mbs, p.train.global_batch_size)
    assert gbs // (mbs * s.dp) == p.train.global_batch_size // (s.mbs * s.dp) and gbs % (mbs * s.dp) == 0
    assert ov["++dataset.seq_length"] == ov["++dataset.sequence_length"] == m("seq_length") == p.train.seq_len
    # pipeline split: Megatron-Core's even split unless first/last counts, the embedding/loss switches or a
    # layout string (what the first/last counts cannot say: 21 layers on a middle rank of vpp 2) say so
    written = m("pipeline_model_parallel_layout")
    assert written is None or (PipelineLayout.parse(written, s.pp) == layout_of(p, s)
                               and m("num_layers_in_first_pipeline_stage") is None)
    assert (m("account_for_embedding_in_pipeline_split"), m("account_for_loss_in_pipeline_split")) == \
        (s.account_for_embedding, s.account_for_loss)
    split = s.layers_per_stage or default_layers_per_stage(p.model.num_layers, s.pp, s.account_for_embedding,
                                                           s.account_for_loss) or (p.model.num_layers,)
    first, last = m("num_layers_in_first_pipeline_stage"), m("num_layers_in_last_pipeline_stage")
    if first is None:
        assert len(set(split)) == 1 or s.account_for_embedding or s.account_for_loss or written
    else:
        middle = (p.model.num_layers - first - last) // (s.pp - 2) if s.pp > 2 else None
        assert (first, *[middle] * (s.pp - 2), last) == tuple(split)
    # recompute
    granularity = m("recompute_granularity")
    assert (granularity or "none") == s.recompute
    if s.recompute == "full":
        assert (m("recompute_method"), m("recompute_num_layers")) == (
            ("block", s.recompute_layers) if s.recompute_layers else ("uniform", 1))
    else:
        assert (m("recompute_method"), m("recompute_num_layers")) == (None, None)
    assert m("recompute_modules") == list(s.recompute_modules)
    # ZeRO: the distributed optimizer (both configs, Bridge syncs them) and Megatron-FSDP
    assert ov["ddp.use_distributed_optimizer"] is ov["optimizer.use_distributed_optimizer"] is (s.zero >= 1)
    assert ov["ddp.use_megatron_fsdp"] is (s.zero >= 2)
    assert ov["ddp.data_parallel_sharding_strategy"] == SHARDING[s.zero]
    assert (ov.get("checkpoint.ckpt_format") == "fsdp_dtensor") is (s.zero >= 2)
    # precision and what the cost model assumes around it
    assert ov["mixed_precision"] == PRECISION_RECIPE[p.train.precision]
    assert ov["optimizer.use_precision_aware_optimizer"] is False
    assert {ov[f"optimizer.{k}"] for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                           "exp_avg_sq_dtype")} == {"float32"}
    assert ov["comm_overlap"] is None and m("tp_comm_overlap") is False
    assert ov.get("model.cp_comm_type") == (s.cp_comm_type if s.cp > 1 else None)  # the searched CP algorithm
    assert ov.get("model.hierarchical_context_parallel_sizes") == (
        [s.cp_a2a_size, s.cp // s.cp_a2a_size] if s.cp > 1 and s.cp_comm_type == "a2a+p2p" else None)
    if p.model.is_moe:  # the layout's dispatcher and EP overlap (autopar.cost.moe_dispatch)
        flex = s.moe_dispatcher in ("deepep", "hybridep")
        assert (m("moe_token_dispatcher_type"), m("moe_flex_dispatcher_backend")) == (
            "flex" if flex else s.moe_dispatcher, s.moe_dispatcher if flex else None)
        assert m("overlap_moe_expert_parallel_comm") is s.moe_ep_overlap


SEARCHED = [("llama3-8b", 1, 128, 8192), ("qwen3-30b-a3b", 2, 256, 4096), ("llama3-70b", 8, 512, 8192)]


@pytest.mark.parametrize("model, nodes, gbs, seq", SEARCHED)
def test_searched_top10_run_as_planned(model, nodes, gbs, seq):
    p = make_problem(model, nodes=nodes, gbs=gbs, seq=seq)
    result = search(p, 10, target="megatron-bridge")
    assert len(result.layouts) == 10
    for e in result.layouts:
        assert_runs_the_plan(p, e.strategy, WRITERS["megatron-bridge"](p, e.strategy))


LLAMA70 = dict(model="llama3-70b", nodes=8, gbs=512, seq=8192)
EXPLICIT = [  # the branches a top 10 may miss
    (LLAMA70, {}, dict(dp=4, tp=4, pp=4, vpp=2, schedule="interleaved", layers_per_stage=(18, 21, 21, 20),
                       recompute="full", recompute_layers=2, sp=True)),
    (dict(model="llama3.1-405b", nodes=64, gbs=2048, seq=8192), {},
     dict(dp=8, tp=8, pp=8, vpp=8, schedule="interleaved", account_for_embedding=True, account_for_loss=True,
          sp=True)),
    (LLAMA70, {}, dict(dp=16, tp=4, zero=0, recompute="full", sp=True)),
    (LLAMA70, {}, dict(dp=8, tp=2, cp=4, zero=2, recompute="selective", sp=True)),
    (LLAMA70, dict(precision="fp8", fp8_param_storage=True), dict(dp=8, tp=8, zero=1, sp=True)),
    (dict(model="qwen3-30b-a3b", nodes=2, gbs=256, seq=4096), {},
     dict(dp=8, tp=2, ep=8, etp=1, sp=True, zero=3, recompute="selective", recompute_modules=("core_attn", "moe_act"))),
]


@pytest.mark.parametrize("problem, train, layout", EXPLICIT)
def test_explicit_layouts_run_as_planned(problem, train, layout):
    p = make_problem(problem["model"], nodes=problem["nodes"], gbs=problem["gbs"], seq=problem["seq"], **train)
    s = Strategy(**layout)
    assert_runs_the_plan(p, s, WRITERS["megatron-bridge"](p, s))


def test_recipes_are_the_models_own():
    assert recipe_for(make_problem("llama3.1-405b")) == "llama31_405b_pretrain_config"
    assert recipe_for(make_problem("deepseek-v3")) == "deepseek_v3_pretrain_config"
    renamed = make_problem("llama3-8b")
    renamed = type(renamed)(renamed.model.model_copy(update={"name": "my-llama"}), renamed.cluster, renamed.train)
    assert recipe_for(renamed) == "llama3_8b_pretrain_config"  # the shape decides, not the name


def test_unequal_middle_stages_are_a_layout_string():
    p = make_problem("llama3-8b")
    ov = overrides(p, Strategy(dp=2, pp=4, layers_per_stage=(7, 9, 8, 8)))
    assert ov["model.pipeline_model_parallel_layout"] == "Et*7|t*9|t*8|t*8L"
    assert ov["model.num_layers_in_first_pipeline_stage"] is None


@pytest.mark.parametrize("model, train, layout, reason", [
    ("mixtral-8x7b", {}, dict(dp=8), "no pretrain recipe builds model mixtral-8x7b"),
    ("llama3-8b", {}, dict(dp=2, pp=4, recompute_per_stage=("full", "none", "none", "none")),
     "recompute per stage full,none,none,none"),
    ("llama3-8b", dict(precision="fp8"), dict(dp=8), "fp8_param_gather=True"),
    ("llama3-8b", dict(precision="fp16"), dict(dp=8), "fp16_mixed"),
    ("llama3-8b", dict(flash_attention=False), dict(dp=8), "fused attention"),
    ("llama3-8b", {}, dict(dp=4, tp=2, sp=True, tp_comm_overlap=True), "CommOverlapConfig"),
])
def test_refusals_name_the_reason(model, train, layout, reason):
    p = make_problem(model, **train)
    with pytest.raises(AutoparError, match=reason):
        overrides(p, Strategy(**layout))


def test_a_vocabulary_change_is_another_model():
    p = make_problem("llama3-8b")
    p = type(p)(p.model.model_copy(update={"vocab_size": 32000}), p.cluster, p.train)
    with pytest.raises(AutoparError, match="no pretrain recipe builds model llama3-8b"):
        recipe_for(p)


def test_cli_export_and_search_target(tmp_path):
    runner = CliRunner()
    base = ["-m", "llama3-8b", "--device", "h100-80gb", "--gbs", "128", "--seq-len", "8192"]
    res = runner.invoke(app, ["search", *base, "--target", "megatron-bridge", "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    (tmp_path / "r.json").write_text(res.stdout)
    out = runner.invoke(app, ["export", "--format", "megatron-bridge", "--from", str(tmp_path / "r.json"), "--rank", "2"])
    assert out.exit_code == 0, out.output
    assert read_back(out.stdout)[1] == "llama3_8b_pretrain_config"
    bad = runner.invoke(app, ["search", "-m", "mixtral-8x7b", "--device", "h100-80gb", "--nodes", "4",
                              "--target", "megatron-bridge"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: Megatron-Bridge: no pretrain recipe builds model "
                                                        "mixtral-8x7b")


def test_overrides_apply_as_megatron_bridge_applies_them():
    """Hydra's parser and OmegaConf struct mode, as omegaconf_utils.parse_hydra_overrides: every key
    must exist (0.3's dataset lacks seq_length, which ``++`` adds), a recipe's CommOverlapConfig and
    MixedPrecisionConfig objects are replaced by null and a recipe name."""
    pytest.importorskip("hydra")
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    p = make_problem("qwen3-30b-a3b", nodes=2, gbs=256)
    s = Strategy(dp=4, tp=2, ep=8, etp=1, cp=2, sp=True, zero=2, recompute="full")
    _, _, table = read_back(WRITERS["megatron-bridge"](p, s))
    words = shlex.split(WRITERS["megatron-bridge"](p, s).split("--recipe ", 1)[1].replace("\\\n", " "))[1:]
    recipe_like: dict = {"comm_overlap": {"tp_comm_overlap": True}, "mixed_precision": {"bf16": True},
                         "dataset": {"sequence_length": 4096}}
    for key in table:
        node = recipe_like
        parts = key.lstrip("+").split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if not key.startswith("++") and parts[-1] not in node:
            node[parts[-1]] = "recipe's"
    cfg = OmegaConf.create(recipe_like)
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(words), cfg=cfg)
    applied = OmegaConf.to_container(cfg)
    for key, value in table.items():
        node = applied
        for part in key.lstrip("+").split("."):
            node = node[part]
        assert node == value, key
