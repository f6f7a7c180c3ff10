"""Bad files and out-of-range values: launch scripts, tokenizer files, search results, measurement
CSVs, HF configs, device overrides, balance inputs. Each once crashed (a traceback), was silently
replaced by a default or costed as something else, or printed absurd numbers; each now gets one
error line naming the field, the value and what is allowed (exit code 2). One parametrised test
per class of input; the comment after a case says what happened before."""

from __future__ import annotations

import copy
import csv
import io
import json

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.specs.hf import model_from_hf_dict
from conftest import MEASUREMENTS, MODELS
from test_bad_input import BASE_SCRIPT, LAYERS_DOC, LLAMA, LLAMA_CFG, MIXTRAL_SCRIPT, one_line_error

runner = CliRunner()
SCRIPT_ARGS = ["--device", "h100-80gb", "--vocab-size", "32000"]


# ----- launch scripts: values Megatron-LM refuses --------------------------------------------------
@pytest.mark.parametrize("base, old, new, needle", [
    (BASE_SCRIPT, "--num-attention-heads 32", "--num-attention-heads 0",
     "--num-attention-heads=0: must be an integer >= 1"),  # ZeroDivisionError
    (BASE_SCRIPT, "--hidden-size 4096", "--hidden-size 4097",
     "--hidden-size=4097 is not divisible by --num-attention-heads=32"),  # head_dim 128 assumed
    (BASE_SCRIPT, "--ffn-hidden-size 11008", "--ffn-hidden-size 0",
     "--ffn-hidden-size=0: must be an integer >= 1"),  # silently the SwiGLU default 10880
    (BASE_SCRIPT, "--max-position-embeddings 4096", "--max-position-embeddings 0",
     "--max-position-embeddings=0: must be an integer >= 1"),  # silently 1
    (BASE_SCRIPT, "--position-embedding-type rope", "--position-embedding-type alibi",
     "--position-embedding-type='alibi': allowed learned_absolute, rope, mrope, relative, none"),  # costed as rope
    (BASE_SCRIPT, "--attention-dropout 0.0", "--attention-dropout -1",
     "--attention-dropout=-1.0: must be a probability in [0, 1)"),  # read as "no dropout"
    (BASE_SCRIPT, "--hidden-dropout 0.0", "--hidden-dropout nan", "--hidden-dropout=nan: must be a probability"),
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 2 --moe-ffn-hidden-size 0",
     "--moe-ffn-hidden-size=0: must be an integer >= 1"),  # silently the dense FFN width
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 2 --moe-layer-freq '[2]*32'",
     "--moe-layer-freq='[2]*32': a list's entries must be 0 (dense) or 1 (MoE)"),  # 2 read as MoE
])
def test_launch_script_shapes_megatron_refuses(tmp_path, base, old, new, needle):
    assert old in base
    path = tmp_path / "job.sh"
    path.write_text(base.replace(old, new, 1))
    assert needle in one_line_error(["estimate", "--script", str(path), *SCRIPT_ARGS])


@pytest.mark.parametrize("growth, needle", [
    ('A=x\n' + 'A="$A$A"\n' * 40, "variable A expands to more than 100,000 characters"),  # hung
    ("A=(x)\n" + "A=(${A[@]} ${A[@]})\n" * 40, "variable A expands to more than 100,000 characters"),
    ('A=x\n' + 'A="$A$A"\n' * 16 + "echo $A $A $A $A\n", "a command expands to more than 100,000 characters"),
])
def test_launch_script_expansion_that_would_not_finish(tmp_path, growth, needle):
    """Each doubling is one statement; 2^17 characters is the first past the limit, so the error
    comes after ~17 cheap steps instead of 2^40 characters (shlex is quadratic in the length)."""
    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT.replace("TP=2", growth + "TP=2", 1))
    err = one_line_error(["estimate", "--script", str(path), *SCRIPT_ARGS])
    assert err.startswith("error: job.sh: ") and needle in err


def test_binary_launch_script(tmp_path):
    path = tmp_path / "job.sh"
    path.write_bytes(b"\xff\xfe\x00")  # UnicodeDecodeError
    assert "not a text file" in one_line_error(["search", "--script", str(path), "--device", "h100-80gb"])


# ----- tokenizer files a script names (the vocabulary comes from them) -----------------------------
@pytest.mark.parametrize("flag, name, content, needle", [
    ("--tokenizer-name-or-path", "tok/config.json", b'{"a": 1}', "has vocab_size=None, expected an integer >= 1"),
    ("--tokenizer-name-or-path", "tok/config.json", b'{"vocab_size": "abc"}', "has vocab_size='abc'"),
    ("--tokenizer-name-or-path", "tok/config.json", b"not json", "cannot read it as JSON"),
    ("--vocab-file", "vocab.json", b"[1, 2", "cannot read it as JSON"),
    ("--vocab-file", "vocab.json", b"5", "holds a JSON int, expected an object"),
    ("--vocab-file", "vocab.json", b"\xff\xfe", "cannot read it as JSON"),
    ("--vocab-file", "vocab.json", b"{}", "holds no tokens"),
])
def test_malformed_tokenizer_file(tmp_path, flag, name, content, needle):
    """All but the empty vocab.json crashed (KeyError, JSONDecodeError, ValueError, TypeError,
    UnicodeDecodeError); each must name the flag and ask for --vocab-size."""
    file = tmp_path / name
    file.parent.mkdir(exist_ok=True)
    file.write_bytes(content)
    where = str(file.parent if name.endswith("config.json") else file)
    script = tmp_path / "job.sh"
    script.write_text(BASE_SCRIPT.replace("--tokenizer-model ${TOKENIZER_MODEL}", f"{flag} {where}", 1))
    err = one_line_error(["estimate", "--script", str(script), "--device", "h100-80gb"])
    assert flag in err and needle in err and "--vocab-size N" in err


# ----- search results and measurement CSVs with sizes beyond int64 ---------------------------------
@pytest.fixture(scope="module")
def result_doc() -> dict:
    out = runner.invoke(app, ["search", *LLAMA, "--top", "1", "--json"])
    assert out.exit_code == 0
    return json.loads(out.stdout)


@pytest.mark.parametrize("key", ["mbs", "etp", "ep", "vpp", "recompute_layers"])
def test_search_result_sizes_beyond_int64(tmp_path, result_doc, key):
    """OverflowError converting the layout to int64 arrays."""
    doc = copy.deepcopy(result_doc)
    doc["layouts"][0]["strategy"].update({key: 2**63, "recompute": "full"})
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA])
    assert f"{key}={2**63}: Input should be less than or equal to 2147483648" in err


CSV_LINES = (MEASUREMENTS).read_text().splitlines()


@pytest.mark.parametrize("column, value, needle", [
    ("tp", "99999999999999999999", "tp='99999999999999999999': expected a whole number in 1..2147483648"),  # Overflow
    ("gbs", "1e30", "gbs='1e30': expected a whole number in 1..2147483648"),  # OverflowError
    ("seq_len", "99999999999", "seq_len='99999999999'"),  # pydantic's multi-line text
    ("kv_heads", "5", "model dimensions invalid: heads=32 is not a multiple of kv_heads=5)"),  # in CSV columns
])
def test_measurements_csv_sizes(tmp_path, column, value, needle):
    table = list(csv.reader(io.StringIO("\n".join(CSV_LINES[:2]))))
    table[1][table[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out).writerows(table)
    path = tmp_path / "m.csv"
    path.write_text(out.getvalue())
    assert needle in one_line_error(["validate", "--csv", str(path), "--out", str(tmp_path / "out")])


# ----- HF config.json --------------------------------------------------------------------------
def test_llama_type_mlp_is_gated_whatever_the_activation():
    """transformers' LlamaMLP always has gate_proj, up_proj and down_proj; hidden_act only picks
    the gate's function. Llama-3-8B by hand: embedding + untied head 2 x 128256 x 4096 =
    1,050,673,152; per layer attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41,943,040,
    MLP 3 x 4096 x 14336 = 176,160,768, two norms 8,192: 218,112,000 x 32 = 6,979,584,000;
    final norm 4,096; total 8,030,261,248 (ecosystem.md 5.2: 8.03 B). With hidden_act 'relu'
    autopar counted a 2-matrix MLP: 6,151,213,056."""
    for act in ("silu", "relu", "gelu_fast"):
        spec = model_from_hf_dict({**LLAMA_CFG, "hidden_act": act}, name="llama3-8b")
        assert spec.gated_mlp and spec.num_params == 8_030_261_248


DEEPSEEK_CFG = json.loads((MODELS / "deepseek-v3.json").read_text())


@pytest.mark.parametrize("base, changes, needle", [
    (LLAMA_CFG, {"attention_dropout": -0.5}, "field 'attention_dropout'=-0.5 must be a probability in [0, 1]"),
    (LLAMA_CFG, {"attention_dropout": 5}, "field 'attention_dropout'=5.0 must be a probability"),  # read as dropout
    (DEEPSEEK_CFG, {"topk_method": 5}, "field 'topk_method'=5: allowed noaux_tc, greedy, group_limited_greedy"),
    (DEEPSEEK_CFG, {"num_nextn_predict_layers": 10**9}, "num_nextn_predict_layers=1000000000: Input should be less than "
     "or equal to 10000"),  # costed as 1.2e16 parameters
    (DEEPSEEK_CFG, {"num_nextn_predict_layers": 62}, "num_nextn_predict_layers=62 must be at most num_hidden_layers=61"),
])
def test_hf_config_values_outside_their_range(tmp_path, base, changes, needle):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **changes}))
    assert needle in one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])


# ----- device overrides: values no device has --------------------------------------------------
@pytest.mark.parametrize("override, needle", [
    ("memory_bytes=1e300", "device.memory_bytes='1e300': Input should be less than or equal to 1000000000000000"),
    ("framework_overhead_bytes=1e300", "device.framework_overhead_bytes='1e300'"),  # a 300-digit GiB line
    ("hbm_bandwidth_bytes_per_s=1e300", "device.hbm_bandwidth_bytes_per_s='1e300'"),  # planned on it
    ("peak_flops.bf16=1e300", "peak_flops.bf16=1e+300: needs a dtype name and a finite value in 1e+09..1e+18"),
])
def test_device_values_above_any_device(override, needle):
    assert needle in one_line_error(["search", *LLAMA, "--top", "1", "--device-set", override])


# ----- balance options and --layers files --------------------------------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--options", ",,,"], "--options=',,,': name one or more recompute options"),  # IndexError
    (["--plot", "{tmp}"], "give a file name ending in .png, .svg, .pdf"),  # wrote DIR.png, said "wrote DIR"
    (["--plot", "{tmp}/plan.txt"], "--plot='{tmp}/plan.txt': give a file name ending in"),  # matplotlib ValueError
    (["--memory-limit-gib", "inf"], "--memory-limit-gib=inf: must be a number in (0, 931323]"),
])
def test_balance_options(tmp_path, extra, needle):
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    err = one_line_error(["balance", *LLAMA, "--pp", "4", "--tp", "2", *extra])
    assert needle.replace("{tmp}", str(tmp_path)) in err
    assert not list(tmp_path.parent.glob(tmp_path.name + ".png"))


def _layer_doc(key, value):
    doc = copy.deepcopy(LAYERS_DOC)
    doc["layers"] = [{**doc["layers"][0], key: value}] * len(doc["layers"])
    return json.dumps(doc).encode()


@pytest.mark.parametrize("content, needle", [
    (b"\xff\xfe\x00\x01", "not a text file (expected JSON or YAML)"),  # UnicodeDecodeError
    (_layer_doc("static_bytes", 1e308), "layers[0].static_bytes=1e+308: at most 1e+15 bytes"),  # 'nan GiB' + warnings
    (_layer_doc("forward_s", 0), "layers[0].forward_s=0: must be > 0"),  # 0/0 speed-up warning
])
def test_malformed_layers_file_values(tmp_path, content, needle):
    path = tmp_path / "layers.json"
    path.write_bytes(content)
    assert needle in one_line_error(["balance", "--layers", str(path)])


# ----- options a dense model would silently ignore -------------------------------------------------
@pytest.mark.parametrize("command", ["estimate", "export"])
def test_expert_tp_on_a_dense_model(command):
    extra = ["--format", "megatron"] if command == "export" else []
    err = one_line_error([command, *LLAMA, *extra, "--etp", "2"])
    assert "--etp=2: model llama3-8b has no routed experts" in err
    assert runner.invoke(app, [command, *LLAMA, *extra, "--etp", "1"]).exit_code == 0  # = tp: allowed


# ----- JSON/YAML nested beyond Python's recursion limit, wherever a file is parsed ----------------
@pytest.mark.parametrize("args, needle", [
    (["estimate", "-m", "{f}", "--device", "h100-80gb"], "--model='{f}': nested too deeply to be a config.json"),
    (["export", "--format", "megatron", "--from", "{f}", *LLAMA], "--from='{f}': not a readable search result"),
    (["balance", "--layers", "{f}"], "--layers {f}: nested too deeply to be a layer table"),
    (["search", "-m", "llama3-8b", "--device-file", "{f}"], "--device-file: '{f}' is nested too deeply"),
    (["profile", "ops", "--db", "{f}.db", "--missing-from", "{f}"], "--missing-from='{f}': not a result"),
])
def test_deeply_nested_files(tmp_path, args, needle):
    """Each crashed with RecursionError (json and PyYAML parse recursively)."""
    if args[0] == "profile":
        pytest.importorskip("torch")  # profile ops checks for torch first
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    err = one_line_error([a.replace("{f}", str(path)) for a in args])
    assert needle.replace("{f}", str(path)) in err


@pytest.mark.parametrize("content, needle", [
    (b"not json", "cannot read '{f}' as a config.json (Expecting value"),  # JSONDecodeError
    (b"\xff\xfe", "cannot read '{f}' as a config.json ('utf-8' codec"),  # UnicodeDecodeError
    (b"null", "'{f}' must hold a JSON object, got NoneType"),  # AttributeError
])
def test_profile_layer_malformed_config(tmp_path, content, needle):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")  # profile layer checks for both first
    path = tmp_path / "config.json"
    path.write_bytes(content)
    err = one_line_error(["profile", "layer", "--db", str(tmp_path / "p.db"), "-m", str(path)])
    assert needle.replace("{f}", str(path)) in err


def test_cluster_whose_layout_space_does_not_fit_in_memory():
    """720,720 = 2^4 3^2 5 7 11 13 devices (90,090 nodes of 8, within --nodes' bound) has 240
    divisors: DeepSeek-V3's space was 235 million layouts and numpy's 22.8 GiB allocation crashed;
    Llama-3-8B's is 80,739,760 candidates in 135,770 (tp, cp, pp, vpp) blocks. The search counts
    each block's layouts without building them (autopar.search.valid_space) but goes through the
    blocks one by one: more than MAX_BLOCKS = 50,000 is refused before that (it took 30 s)."""
    err = one_line_error(["search", *LLAMA, "--nodes", "90090", "--gbs", str(2**30)])
    assert "720720 devices: llama3-8b's layout space there has 135,770 (tp, cp, pp, vpp) blocks, more than" in err


def test_search_result_without_layouts(tmp_path, result_doc):
    """Was '--rank=1: the result holds layouts 1..0'."""
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**result_doc, "layouts": []}))
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA])
    assert "the result holds no layouts" in err
