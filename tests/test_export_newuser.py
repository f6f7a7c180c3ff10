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
