"""Real decoder layers at a shard's width: saved-for-backward bytes vs the analytic model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from autopar.profile import kernels  # noqa: E402
from autopar.profile.layer import RECOMPUTE, Shard, analytic_layer_bytes, build_layer, profile_layer  # noqa: E402

COMMON = dict(hidden_size=256, num_hidden_layers=2, vocab_size=1000, hidden_act="silu", max_position_embeddings=4096)
CONFIGS = {
    "llama": dict(model_type="llama", intermediate_size=512, num_attention_heads=8, num_key_value_heads=4,
                  rms_norm_eps=1e-5, **COMMON),
    "qwen2": dict(model_type="qwen2", intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
                  rms_norm_eps=1e-6, **COMMON),
    "mixtral": dict(model_type="mixtral", intermediate_size=384, num_attention_heads=8, num_key_value_heads=4,
                    rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2, **COMMON),
    "deepseek_v3": dict(model_type="deepseek_v3", intermediate_size=512, moe_intermediate_size=128,
                        num_attention_heads=8, num_key_value_heads=8, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=96, kv_lora_rank=64,
                        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_group=2, topk_group=1,
                        rms_norm_eps=1e-6, routed_scaling_factor=1.0, norm_topk_prob=True, **COMMON),
}


def _hf_only_bytes(name: str, raw: dict, shard: Shard, moe: bool, recompute: str) -> float:
    """Bytes the HF DeepSeek-V3 layer keeps that Megatron's analytic layer does not (see the
    profile docs): V is a view into kv_b's (nope + v)-wide output, so the nope half stays
    allocated; the router upcasts its input to fp32 and keeps that copy for the weight grad."""
    if name != "deepseek_v3" or recompute == "full":
        return 0.0
    n = shard.mbs * shard.seq // shard.cp
    v_view = 2 * n * raw["num_attention_heads"] // shard.tp * raw["qk_nope_head_dim"]
    return v_view + (4 * n * raw["hidden_size"] if moe else 0)


CASES = [(name, moe, tp) for name in CONFIGS for moe in ([False, True] if name == "deepseek_v3" else
                                                          [name == "mixtral"]) for tp in (1, 2)]


@pytest.mark.parametrize(("name", "moe", "tp"), CASES)
def test_saved_bytes_match_analytic(name, moe, tp):
    raw = CONFIGS[name]
    shard = Shard(tp=tp, etp=tp, mbs=2, seq=64)
    layer, rotary = build_layer(raw, shard, moe, "cpu", torch.bfloat16)
    for recompute in RECOMPUTE:
        prof = profile_layer(layer, rotary, shard, recompute, "cpu", torch.bfloat16, repeats=1, warmup=0)
        analytic = analytic_layer_bytes(raw, shard, recompute, moe)
        measured = prof.saved_bytes - _hf_only_bytes(name, raw, shard, moe, recompute)
        assert measured == pytest.approx(analytic, rel=0.05), (name, moe, tp, recompute, prof.saved_bytes, analytic)
        assert prof.fwd_s > 0 and prof.bwd_s > 0 and prof.peak_bytes is None
    if recompute == "full":
        assert prof.saved_bytes == 2 * 2 * 64 * 256  # only the layer input (bf16)


def test_fused_kernels_match_autograd():
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 16, 6, dtype=torch.float64, requires_grad=True)
    out = kernels.FlashAttentionFn.apply(q, k, v, 0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3).transpose(1, 2)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, atol=1e-5)

    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    y = kernels.RMSNormFn.apply(x, w, 1e-6)
    y_ref = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (x, w), g), torch.autograd.grad(y_ref, (x, w), g)):
        assert torch.allclose(a, b, atol=1e-5)

    gate, up = (torch.randn(4, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    s = kernels.SwiGLUFn.apply(gate, up)
    s_ref = torch.nn.functional.silu(gate) * up
    g = torch.randn_like(s)
    for a, b in zip(torch.autograd.grad(s, (gate, up), g), torch.autograd.grad(s_ref, (gate, up), g)):
        assert torch.allclose(a, b, atol=1e-8)


def test_profile_layer_hf_feeds_the_estimate(tmp_path):
    """The key 'profile layer' writes is the one the planner looks up (same model, shard, mbs, seq)."""
    import json

    from typer.testing import CliRunner

    from autopar.cli import app

    model = tmp_path / "tiny.json"
    model.write_text(json.dumps(CONFIGS["llama"]))
    db = str(tmp_path / "l.db")
    runner = CliRunner()
    out = runner.invoke(app, ["profile", "layer", "--db", db, "--model", str(model), "--tp", "2", "--mbs", "2",
                              "--seq-len", "64", "--recompute", "none", "--hf", "--repeats", "1"])
    assert out.exit_code == 0, out.output
    common = ["estimate", "--model", str(model), "--device", "h100-80gb", "--devices-per-node", "2", "--gbs", "4",
              "--seq-len", "64", "--mbs", "2", "--profile-db", db, "--json"]
    doc = json.loads(runner.invoke(app, [*common, "--tp", "2"]).output)
    assert doc["profile"]["sources"][0]["dense layer"] == "layer profile (recompute=none)"
    doc = json.loads(runner.invoke(app, [*common, "--tp", "1"]).output)  # another shard: operators
    assert doc["profile"]["sources"][0]["dense layer"].startswith("operators")
