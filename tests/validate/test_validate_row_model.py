"""The model of a measurements row: a preset name never overrides the row's own dimensions
(issue 13: DeepSeek-V3 with 30 layers predicted the same as with 61)."""

import pytest

from autopar.estimate import estimate
from autopar.specs import load_model
from autopar.validate.cells import Unscorable
from autopar.validate.measurements import Row, read_rows
from autopar.validate.row_model import generic_model, model_of
from autopar.validate.rows import to_case
from conftest import MEASUREMENTS

# dgxc-benchmarking DeepSeek-V3 on 512 H100, re-laid out as tp 2, pp 1 (dp 256, ep 64): without
# a pipeline every layer runs in sequence on every rank, so the step is affine in the layer count.
DSV3 = {r.id: r for r in read_rows(MEASUREMENTS)}["DGXC2505-DSV3-H100-BF16-512"].cells
FLAT = {**DSV3, "tp": "2", "pp": "1", "dp": ""}


def _case(**cells):
    return to_case(Row({**FLAT, **cells}))


def _step_s(**cells) -> float:
    case = _case(**cells)
    return estimate(case.problem, case.strategy).step_time_s


def test_deepseek_layers_come_from_the_row():
    model = _case(layers="30").problem.model
    assert model.num_layers == 30
    assert model.moe_layers == tuple(range(3, 30))  # the preset's first 3 dense layers stay dense
    assert (model.mla, model.router_num_groups, model.mtp_num_layers) == (True, 8, 1)  # the rest: the preset's


def test_30_layer_deepseek_predicts_about_half_the_61_layer_step():
    # t(L) = 3 d + (L - 3) m + f (dense layers d, MoE layers m, embedding/logits/MTP/optimizer f):
    # t(61) - t(30) = 31 m and t(30) - t(15) = 15 m, so their ratio is 31 / 15 whatever d, m, f;
    # t(30) / t(61) > 27 / 58 for any d, f > 0, and < 1 / 2 as long as 3 d + f < 4 m (0.496 here).
    t15, t30, t61 = _step_s(layers="15"), _step_s(layers="30"), _step_s(layers="61")
    assert t15 < t30 < t61  # the preset's 61 layers used to win: t30 == t61
    assert (t61 - t30) / (t30 - t15) == pytest.approx(31 / 15, rel=1e-6)
    assert 27 / 58 < t30 / t61 < 0.5


@pytest.mark.parametrize("cells, field, value", [
    ({"heads": "64"}, "num_attention_heads", 64),
    ({"hidden": "3584"}, "hidden_size", 3584),
    ({"num_experts": "128"}, "num_experts", 128),
    ({"topk": "4"}, "num_experts_per_tok", 4),
    ({"ffn": "1024"}, "moe_ffn_hidden_size", 1024),
    ({"vocab": "32000"}, "vocab_size", 32000),
])
def test_every_stated_deepseek_dimension_is_used(cells, field, value):
    model = _case(**cells).problem.model
    assert getattr(model, field) == value
    preset = load_model("deepseek-v3")
    assert getattr(preset, field) != value  # the row really differs from the preset


def test_smaller_deepseek_dimensions_predict_a_shorter_step():
    # half the heads (attention FLOPs and MLA up-projections halve), half the routed experts per
    # token (routed expert FLOPs and dispatched tokens halve): each must be faster than the preset
    full = _step_s()
    for cells in ({"heads": "64"}, {"topk": "4"}, {"hidden": "3584"}):
        assert _step_s(**cells) < full, cells


def test_mla_heads_keep_kv_heads_equal_and_head_dim():
    model = _case(heads="64").problem.model
    assert (model.num_kv_heads, model.head_dim) == (64, 192)  # MLA: per-head q/k widths 128 + 64


def test_derived_head_dim_follows_the_row_and_decoupled_stays():
    mixtral = model_of(Row({"model": "mixtral-8x7b", "hidden": "2048", "heads": "32"}), False, [])
    assert mixtral.head_dim == 2048 // 32  # the preset's 128 = 4096 / 32 is derived
    qwen = model_of(Row({"model": "qwen3-30b-a3b", "hidden": "4096"}), False, [])
    assert (qwen.hidden_size, qwen.head_dim) == (4096, 128)  # Qwen3: kv_channels 128 apart from hidden/heads


def test_all_moe_preset_gets_the_row_ffn_in_every_layer():
    mixtral = model_of(Row({"model": "mixtral-8x7b", "ffn": "8192"}), False, [])
    assert (mixtral.ffn_hidden_size, mixtral.moe_ffn_hidden_size) == (8192, 8192)


def test_shipped_moe_rows_keep_their_preset_numbers():
    # the shipped DeepSeek-V3 and Qwen3-30B-A3B rows state the preset's own dimensions
    for row in read_rows(MEASUREMENTS):
        if row["model"] in ("deepseek-v3", "qwen3-30b-a3b"):
            model = model_of(row, False, [])
            assert model == load_model(row["model"]), row.id


@pytest.mark.parametrize("cells, needle", [
    ({"layers": "3"}, "layers=3: deepseek-v3 keeps its first 3 layers dense"),
    ({"num_experts": "100"}, "num_experts=100"),  # 8 router groups must split the experts
    ({"topk": "300"}, "topk=300 must be in 1..256"),
])
def test_preset_dimensions_that_do_not_form_a_model_are_named_by_column(cells, needle):
    with pytest.raises(Unscorable, match=needle.replace("(", r"\(").replace(".", r"\.")):
        _case(**cells)


def test_generic_model_records_what_it_assumed():
    assumed: list[str] = []
    model = generic_model(Row({"model": "GPT-4B", "layers": "36", "hidden": "3072", "heads": "32"}), True, assumed)
    assert (model.num_kv_heads, model.ffn_hidden_size, model.vocab_size) == (32, 4 * 3072, 51200)
    assert (model.gated_mlp, model.position_embedding, model.dropout) == (False, "learned", True)
    assert assumed == ["architecture from the name 'GPT-4B': 4h-style MLP, LayerNorm, biases, learned positions",
                       "kv_heads=32 (= heads)", "ffn=12288 (4 hidden)", "vocab=51200"]


def test_generic_moe_row_needs_its_topk():
    with pytest.raises(Unscorable, match="topk='': a MoE row"):
        generic_model(Row({"model": "m", "layers": "4", "hidden": "64", "heads": "4", "num_experts": "8"}), False, [])


@pytest.mark.parametrize("model, experts", [("deepseek-v3", "256"), ("GPT-MoE", "8")])
def test_layer_count_is_bounded_before_the_moe_layers_are_listed(model, experts):
    # 2^31 layers built a 2^31-entry moe_layers tuple (MemoryError) before ModelSpec's bound fired
    row = Row({"model": model, "layers": str(2**31), "hidden": "64", "heads": "4", "num_experts": experts,
               "topk": "2"})
    with pytest.raises(Unscorable, match=f"layers={2**31}: expected at most 10000"):
        model_of(row, False, [])


def test_nemo_gpt3_rows_train_with_dropout_and_others_do_not():
    # dgxc gpt3_175b_hydra.yaml and NeMo-Framework-Launcher gpt3 configs: hidden/attention dropout 0.1;
    # the Llama/Nemotron configs of the same sources: 0.0.
    rows = {r.id: r for r in read_rows(MEASUREMENTS)}
    gpt3 = to_case(rows["DGXC2411-G175B-BF16-128"])
    assert gpt3.problem.model.dropout
    assert any(a.startswith("dropout=on (NeMo GPT-3") for a in gpt3.assumed)
    assert to_case(rows["NEMO2407-03"]).problem.model.dropout
    assert not to_case(rows["DGXC2411-N340B-BF16-128"]).problem.model.dropout
    assert not to_case(rows["NEMO2407-11"]).problem.model.dropout


def test_dgxc_2411_nemotron_340b_recomputes_core_attention_and_15b_does_not():
    # dgxc-benchmarking v24.11.1 nemotron4-340b-synth.yaml: activations_checkpoint_granularity
    # selective (configure.sh leaves it); nemotron4-15b-synth.yaml: null. 25.05 rows run NeMo 2's
    # performance scripts and keep the family default.
    rows = {r.id: r for r in read_rows(MEASUREMENTS)}
    big = to_case(rows["DGXC2411-N340B-FP8-128"])
    assert big.strategy.recompute == "selective" and big.strategy.recompute_modules == ("core_attn",)
    assert any(a.startswith("recompute=selective (dgxc 24.11 nemotron4-340b") for a in big.assumed)
    assert to_case(rows["DGXC2411-N15B-BF16-16"]).strategy.recompute == "none"
    assert to_case(rows["DGXC2505-N340B-H100-BF16-256"]).strategy.recompute == "none"
