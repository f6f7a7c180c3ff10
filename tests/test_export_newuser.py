"""Exports a new user runs as printed: each must pass the target framework's own start-up checks
(``shared/reference/ecosystem.md``; the Megatron-Core source lines are quoted per test)."""

from __future__ import annotations

from autopar.export import WRITERS
from autopar.export.checks import violations
from autopar.specs.script import read_script
from autopar.strategy import Strategy
from conftest import make_problem


def test_deepseek_v3_expert_bias_comes_with_the_sigmoid_score_function(tmp_path):
    """DeepSeek-V3 (topk_method noaux_tc, scoring_func sigmoid) exports
    ``--moe-router-enable-expert-bias``; Megatron-Core's TransformerConfig raises "Expert bias for
    aux-loss-free routing only supports sigmoid score function" unless
    ``--moe-router-score-function sigmoid`` is given too (its default is softmax)."""
    p = make_problem("deepseek-v3", nodes=2, gbs=64, seq=4096)
    s = Strategy(tp=2, sp=True, pp=4, dp=2, ep=4, etp=1, recompute="full", recompute_layers=1)
    for fmt in ("megatron", "mindspeed"):
        text = WRITERS[fmt](p, s)
        words = text.split()
        assert words[words.index("--moe-router-score-function") + 1] == "sigmoid"
        assert violations(read_script(tmp_path / f"{fmt}.sh", text)) == []
    # The check itself: the same script without the score function is refused, naming the flag.
    bad = text.replace("--moe-router-score-function sigmoid ", "")
    assert violations(read_script(tmp_path / "bad.sh", bad)) == [
        "expert_bias_needs_sigmoid: --moe-router-enable-expert-bias with score function softmax"]


def test_dense_and_softmax_moe_exports_name_no_score_function():
    """Mixtral and Qwen3-MoE route with softmax (Megatron's default): no score-function flag."""
    for model in ("mixtral-8x7b", "qwen3-30b-a3b", "llama3-8b"):
        p = make_problem(model, gbs=64, seq=4096)
        s = Strategy(dp=8, ep=8 if p.model.is_moe else 1, etp=1 if p.model.is_moe else None)
        assert "--moe-router-score-function" not in WRITERS["megatron"](p, s)


def test_profile_ops_without_torch_leaves_no_empty_database(tmp_path, monkeypatch):
    """The README's first profiling command on the plain install: one error line naming the extra,
    and no empty ``--db`` file behind (which the README's next command, ``search --profile-db``,
    then read as a database of no devices)."""
    import importlib.util

    from typer.testing import CliRunner

    from autopar.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    db = tmp_path / "ops.db"
    res = CliRunner().invoke(app, ["profile", "ops", "--db", str(db), "--model", "llama3-8b", "--device", "h100-80gb"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: profile: needs torch; install autopar's 'profile' extra (pip install torch transformers)"]
    assert not db.exists()


def test_search_on_an_empty_profile_db_says_to_fill_it(tmp_path):
    from typer.testing import CliRunner

    from autopar.cli import app
    from autopar.profile.opdb import OpDB

    db = tmp_path / "ops.db"
    OpDB(db)  # created, nothing measured
    res = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--gbs", "8",
                                   "--profile-db", str(db)])
    assert res.exit_code == 2
    assert res.output.strip() == (f"error: --profile-db={str(db)!r}: holds no measurements yet "
                                  "(fill it with 'autopar profile ops'; runs stored by 'autopar verify --record' "
                                  "count once 'autopar calibrate' has fitted factors from successful ones)")


def test_torchtitan_toml_says_it_is_sections_to_merge():
    """torchtitan takes the model from ``[model] name/flavor`` (else its debug model), which the
    export does not write: the file must say so, and still parse to the same sections."""
    import tomllib

    from autopar.export import torchtitan

    p = make_problem("llama3-8b", gbs=64, seq=4096)
    text = torchtitan.write(p, Strategy(dp=8, zero=3))
    head = text.splitlines()[:3]
    assert all(line.startswith("# ") for line in head) and "llama3-8b" in head[0] and "[model]" in head[1]
    assert tomllib.loads(text) == torchtitan.config(p, Strategy(dp=8, zero=3))
    # [model] converters and [compile] override what the model's own train config turns on
    assert set(tomllib.loads(text)) == {"training", "parallelism", "activation_checkpoint", "model", "compile"}


def test_search_target_deepspeed_costs_as_deepspeed():
    """--target deepspeed ranks layouts as DeepSpeed runs them (TrainSpec.framework='deepspeed',
    no async TP all-reduce), like --target torchtitan. Llama-3-70B, 64 H100, gbs 512, seq 8192:
    Megatron-costed, tp4+sp dp16 ZeRO-3 is the best writable layout at 64.2 GiB, but DeepSpeed
    keeps 16-bit gradients and a 30% allocator reserve on top (cost.framework_memory), which puts it
    above the 79.6 GiB device, so it must not be recommended for DeepSpeed."""
    from autopar.estimate import estimate
    from autopar.search import search
    from autopar.search.grid import for_target

    p = make_problem("llama3-70b", nodes=8, gbs=512, seq=8192)
    z3 = Strategy(tp=4, sp=True, dp=16, zero=3)
    assert estimate(p, z3).fits and not estimate(for_target(p, "deepspeed"), z3).fits
    ds = for_target(p, "deepspeed")
    assert (ds.train.framework, ds.train.tp_backward_overlap) == ("deepspeed", False)
    for e in search(p, top_k=3, target="deepspeed").layouts:
        s = e.strategy
        assert (s.tp, s.pp, s.dp, s.zero, s.mbs, s.recompute) != (4, 1, 16, 3, 1, "none")
        assert estimate(ds, e.strategy).peak_memory_bytes == e.peak_memory_bytes and e.fits


def test_megatron_export_states_rope_base_and_norm_epsilon():
    """Megatron's defaults are --rotary-base 10000 and --norm-epsilon 1e-5 (ecosystem.md 1.5); the
    HF configs say 500000 / 1e-5 (Llama 3), 1000000 / 1e-6 (Qwen3), so without the flags the
    exported run trains a different network. GPT-3 (learned positions) gets no rotary base."""
    def flag(model: str, name: str) -> str | None:
        words = WRITERS["megatron"](make_problem(model, gbs=64, seq=2048), Strategy(dp=8)).split()
        return words[words.index(name) + 1] if name in words else None

    assert (flag("llama3-70b", "--rotary-base"), flag("llama3-70b", "--norm-epsilon")) == ("500000", "1e-05")
    assert (flag("qwen3-30b-a3b", "--rotary-base"), flag("qwen3-30b-a3b", "--norm-epsilon")) == ("1000000", "1e-06")
    assert flag("gpt3-175b", "--rotary-base") is None


def test_hf_rope_theta_spellings():
    """transformers 5.x writes ``rope_parameters`` (possibly keyed by layer type) instead of a
    top-level ``rope_theta``; a non-number is one error line naming the field."""
    import pytest

    from autopar.errors import AutoparError
    from autopar.specs.hf import model_from_hf_dict

    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 100}
    assert model_from_hf_dict({**base, "rope_theta": 1e6}, "x").rope_theta == 1e6
    assert model_from_hf_dict({**base, "rope_parameters": {"rope_theta": 5e5}}, "x").rope_theta == 5e5
    keyed = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}
    assert model_from_hf_dict({**base, "rope_parameters": keyed}, "x").rope_theta == 1e6
    assert model_from_hf_dict(base, "x").rope_theta is None
    with pytest.raises(AutoparError, match="field 'rope_theta'='big' must be a finite number"):
        model_from_hf_dict({**base, "rope_theta": "big"}, "x")


def test_balance_default_limit_is_the_whole_device():
    """README: ``balance`` limits memory to the whole device unless --memory-limit-gib says
    otherwise (H100 80GB preset: 79.6 GiB, `autopar devices`)."""
    from typer.testing import CliRunner

    from autopar.cli import app

    args = ["balance", "--model", "llama3-8b", "--device", "h100-80gb", "--pp", "4", "--gbs", "32"]
    runner = CliRunner(env={"COLUMNS": "200"})
    assert "limit 79.6 GiB" in runner.invoke(app, args).output
    assert "limit 60.0 GiB" in runner.invoke(app, [*args, "--memory-limit-gib", "60"]).output


def test_unknown_search_target_names_the_option():
    from typer.testing import CliRunner

    from autopar.cli import app

    res = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--target", "megatronn"])
    assert res.exit_code == 2
    assert res.output.strip() == ("error: --target='megatronn': allowed megatron, megatron-bridge, mindspeed, torchtitan, deepspeed, "
                                  "galvatron, sapp")
