"""Bad input of every kind gets one error line naming the field, the value and what is allowed
(exit code 2), never a traceback, a hang or a silently wrong number. One parametrised test per
class of input: search results (--from), launch scripts, HF configs, device overrides, profile
databases, --layers files, measurement CSVs, conflicting options."""

from __future__ import annotations

import copy
import json
import sqlite3

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from conftest import MEASUREMENTS, MODELS, SCRIPTS

runner = CliRunner()
LLAMA = ["-m", "llama3-8b", "--device", "h100-80gb"]


def one_line_error(args: list[str]) -> str:
    """stderr of a run that must fail as a user error: exit 2, one line, no traceback."""
    return error_line_of(runner.invoke(app, args), prefix="")


def error_line_of(result, prefix: str = "error:") -> str:
    """stderr of a finished ``CliRunner`` run that failed as a user error: exit 2, one line that
    starts with ``prefix``, no traceback."""
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output, repr(result.exception))
    assert len(err.splitlines()) == 1 and err.startswith(prefix) and "Traceback" not in err, err
    return err


# ----- export --from: a search result JSON edited by hand ------------------------------------
@pytest.fixture(scope="module")
def result_doc() -> dict:
    out = runner.invoke(app, ["search", *LLAMA, "--top", "2", "--json"])
    assert out.exit_code == 0
    return json.loads(out.stdout)


def _edit_layouts(doc, value):
    doc["layouts"] = value


def _edit_strategy(key, value):
    def edit(doc):
        doc["layouts"][0]["strategy"][key] = value
    return edit


@pytest.mark.parametrize("edit, needle", [
    (lambda d: _edit_layouts(d, {"a": 1}), "'layouts' is a dict"),
    (lambda d: _edit_layouts(d, [5]), "layouts[0] has no 'strategy' object"),
    (lambda d: _edit_layouts(d, [{}]), "layouts[0] has no 'strategy' object"),
    (_edit_strategy("layers_per_stage", 5), "layers_per_stage=5: expected a list"),
    (_edit_strategy("recompute_per_stage", "full"), "recompute_per_stage='full': expected a list"),
    (_edit_strategy("tp", True), "tp=True: Input should be a valid integer"),
    (_edit_strategy("tp", "8"), "tp='8': Input should be a valid integer"),
    (_edit_strategy("gbs", "1024"), "gbs='1024': expected an integer"),
])
def test_malformed_search_result_for_export(tmp_path, result_doc, edit, needle):
    doc = copy.deepcopy(result_doc)
    edit(doc)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    assert needle in one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA])


def test_export_refuses_layout_options_with_from_and_unwritable_out(tmp_path, result_doc):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result_doc))
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA, "--tp", "4", "--mbs", "2"])
    assert "--from with --mbs, --tp" in err
    err = one_line_error(["export", "--format", "megatron", "--from", str(path), *LLAMA, "--out", str(tmp_path)])
    assert f"--out={str(tmp_path)!r}: cannot write" in err


# ----- launch scripts -------------------------------------------------------------------------
BASE_SCRIPT = (SCRIPTS / "pretrain_llama2_7b.sh").read_text()


@pytest.mark.parametrize("old, new, needle", [
    ("TP=2", "TP=0", "--tensor-model-parallel-size=0: must be an integer >= 1"),
    ("--micro-batch-size 1", "--micro-batch-size 0", "--micro-batch-size=0: must be an integer >= 1"),
    ("--sequence-parallel \\", "--sequence-parallel \\\n    --num-virtual-stages-per-pipeline-rank 0 \\",
     "--num-virtual-stages-per-pipeline-rank=0: must be an integer >= 1"),
    ("--sequence-parallel \\", "--sequence-parallel \\\n    --num-layers-per-virtual-pipeline-stage 0 \\",
     "--num-layers-per-virtual-pipeline-stage=0: must be an integer >= 1"),
    ("--recompute-num-layers 1", "--recompute-num-layers 0", "--recompute-num-layers=0: must be an integer >= 1"),
    ("--recompute-method uniform", "--recompute-method foo", "--recompute-method='foo': allowed uniform, block"),
    ("--recompute-granularity full", "--recompute-granularity partial",
     "--recompute-granularity='partial': allowed full, selective"),
    ("--bf16", "--bf16 \\\n    --fp16", "both --bf16 and --fp16"),
])
@pytest.mark.parametrize("command", ["search", "estimate"])
def test_malformed_launch_script(tmp_path, command, old, new, needle):
    assert old in BASE_SCRIPT
    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT.replace(old, new, 1))
    err = one_line_error([command, "--script", str(path), "--device", "h100-80gb", "--vocab-size", "32000"])
    assert err.startswith("error: job.sh: ") and needle in err


# ----- HF config.json -------------------------------------------------------------------------
LLAMA_CFG = json.loads((MODELS / "llama3-8b.json").read_text())
QWEN_MOE_CFG = json.loads((MODELS / "qwen3-30b-a3b.json").read_text())
MIXTRAL_CFG = json.loads((MODELS / "mixtral-8x7b.json").read_text())


@pytest.mark.parametrize("base, changes, needle", [
    (LLAMA_CFG, {"max_position_embeddings": True}, "field 'max_position_embeddings'=True must be an integer"),
    (LLAMA_CFG, {"max_position_embeddings": "8k"}, "field 'max_position_embeddings'='8k' must be an integer"),
    (LLAMA_CFG, {"text_config": "x"}, "field 'text_config'='x' must be an object"),
    (QWEN_MOE_CFG, {"mlp_only_layers": [100]}, "'mlp_only_layers' has [100]: layer indices must be in 0..47"),
    (QWEN_MOE_CFG, {"mlp_only_layers": [-1, 3]}, "'mlp_only_layers' has [-1]"),
    (MIXTRAL_CFG, {"num_local_experts": 0}, "field 'num_local_experts'=0 must be >= 1"),
])
def test_malformed_hf_config(tmp_path, base, changes, needle):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **changes}))
    assert needle in one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])


def test_hf_config_with_an_unreadably_long_integer(tmp_path):
    """A 5,000-digit integer made the whole file unreadable, with a hint at sys.set_int_max_str_digits()."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_CFG).replace('"vocab_size": 128256', '"vocab_size": ' + "9" * 5000))
    err = one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])
    assert "vocab_size=<a 5000-digit number>: too large" in err and "set_int_max_str_digits" not in err


# ----- profile databases ----------------------------------------------------------------------
def _db_with(tmp_path, fwd_s: float, shape: str | None = None):
    from autopar.profile.opdb import OpDB

    db = OpDB(tmp_path / "p.db")
    db.put("h100", "gemm", {"m": 64, "n": 64, "k": 64}, "bf16", "v", (fwd_s, 0.0), (1e-3, 0.0), 0.0, 1)
    if shape is not None:
        db.conn.execute("UPDATE op SET shape=?", (shape,))
        db.conn.commit()
    db.close()
    return tmp_path / "p.db"


def _wrong_columns(tmp_path):
    conn = sqlite3.connect(tmp_path / "p.db")
    conn.execute("CREATE TABLE op (x)")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    return tmp_path / "p.db"


@pytest.mark.parametrize("make, needle", [
    (_wrong_columns, "table op has columns ['x']"),
    (lambda t: _db_with(t, 0.0), "fwd_s=0.0: a measured time must be in (0, 3600) s"),
    (lambda t: _db_with(t, -1.0), "fwd_s=-1.0"),
    (lambda t: _db_with(t, 1e300), "fwd_s=1e+300"),
    (lambda t: _db_with(t, 1e-3, "not json"), "shape='not json': expected a JSON object of dimensions"),
])
def test_corrupt_profile_db(tmp_path, make, needle):
    path = make(tmp_path)
    assert needle in one_line_error(["search", *LLAMA, "--top", "1", "--profile-db", str(path)])


def test_profile_device_without_profile_db():
    assert "--profile-device='h100' needs --profile-db" in one_line_error(
        ["search", *LLAMA, "--profile-device", "h100"])


# ----- device overrides (--device-set, --device-file) ------------------------------------------
@pytest.mark.parametrize("override, needle", [
    ("memory_gb=80", "--device-set='memory_gb=80': unknown device field 'memory_gb'; allowed: name, description"),
    ("memory_bytes=true", "memory_bytes=True: expected a number, not true/false"),
    ("peak_flops.bf16=yes", "peak_flops.bf16=True: expected a number, not true/false"),
    ("gemm_efficiency=1e-300", "device.gemm_efficiency='1e-300': Input should be greater than or equal to 0.01"),
    ("hbm_bandwidth_bytes_per_s=1e-30", "greater than or equal to 1000000"),
    ("inter_node_bandwidth_bytes_per_s=1e-300", "greater than or equal to 1000000"),
    ("intra_node_latency_s=1e30", "device.intra_node_latency_s='1e30': Input should be less than or equal to 1"),
    ("peak_flops.bf16=1", "peak_flops.bf16=1.0: needs a dtype name and a finite value in 1e+09..1e+18 FLOP/s"),
])
def test_absurd_or_mistyped_device_override(override, needle):
    assert needle in one_line_error(["search", *LLAMA, "--nodes", "2", "--top", "1", "--device-set", override])


def test_device_file_with_an_unknown_field(tmp_path):
    path = tmp_path / "dev.yaml"
    path.write_text("base: h100-80gb\nhbm_bw: 3e12\n")
    line = one_line_error(["search", "-m", "llama3-8b", "--device-file", str(path)])
    assert f"--device-file {str(path)!r}: unknown device field 'hbm_bw'; allowed: name," in line, line


# ----- balance --layers FILE, and micro-batch counts the simulation cannot reach -----------------
LAYER = {"forward_s": 0.01, "backward_s": 0.02, "static_bytes": 1e9, "activation_bytes": {"none": 2e9, "full": 1e8}}
LAYERS_DOC = {"pp": 4, "num_microbatches": 16, "memory_limit_bytes": 80e9, "layers": [LAYER] * 16}


def _layer_edit(key, value, index=3):
    def edit(doc):
        doc["layers"][index] = {**LAYER, key: value}
    return edit


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(pp=10**9), "pp=1000000000 x vpp=1 exceeds the 16 layers"),
    (lambda d: d.update(pp=4, vpp=8), "pp=4 x vpp=8 exceeds the 16 layers"),
    (lambda d: d.update(num_microbatches=10**9), "num_microbatches=1000000000: balancing takes at most 100,000 "
     "micro-batches per step"),
    (_layer_edit("recompute_s", [1, 2]), "layers[3].recompute_s=[1, 2]: expected a mapping from recompute options"),
    (_layer_edit("recompute_s", {"bogus": 1.0}), "layers[3].recompute_s={'bogus': 1.0}"),
    (_layer_edit("forward_s", True), "layers[3].forward_s=True: expected a number"),
    (_layer_edit("forward_s", 1e308), "layers[3].forward_s=1e+308: at most 3600 s"),  # was: overflow warnings
    (_layer_edit("recompute_s", {"full": 1e9}), "layers[3].recompute_s.full=1000000000.0: at most 3600 s"),
    # unknown keys were ignored (their defaults used); a time for 'none' gave "gain +6542.6%"
    (lambda d: d.update(p2p=0.5), "unknown key 'p2p' at the top level; allowed pp, vpp, num_microbatches, "
     "memory_limit_bytes, schedule, p2p_s, layers"),
    (_layer_edit("static_byte", 1e9), "unknown key 'static_byte' in layers[3]; allowed forward_s, backward_s, "
     "static_bytes, activation_bytes, recompute_s"),
    (_layer_edit("recompute_s", {"none": 5}), "layers[3].recompute_s.none=5: option 'none' recomputes nothing (its "
     "time is 0); give recompute_s only for the options that recompute"),
])
def test_malformed_layers_file(tmp_path, edit, needle):
    doc = copy.deepcopy(LAYERS_DOC)
    doc["layers"] = list(doc["layers"])
    edit(doc)
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(doc))
    assert needle in one_line_error(["balance", "--layers", str(path)])


def test_balance_refuses_model_options_with_layers_and_unreachable_microbatches(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(LAYERS_DOC))
    err = one_line_error(["balance", "--layers", str(path), "-m", "llama3-8b", "--pp", "2"])
    assert "--layers with --model, --pp" in err
    err = one_line_error(["balance", *LLAMA, "--pp", "4", "--dp", "2", "--gbs", str(2**30)])
    assert "num_microbatches=536870912" in err  # 2^30 / (mbs 1 x dp 2), not a hang


# ----- validate --csv -------------------------------------------------------------------------
CSV_TEXT = (MEASUREMENTS).read_text().splitlines()


def _csv(tmp_path, header: str, rows: list[str]) -> str:
    path = tmp_path / "m.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def _drop_column(name):
    def make(tmp_path):
        import csv
        import io

        table = list(csv.reader(io.StringIO("\n".join(CSV_TEXT[:4]))))
        i = table[0].index(name)
        out = io.StringIO()
        csv.writer(out).writerows([r[:i] + r[i + 1:] for r in table])
        return _csv(tmp_path, *(lambda lines: (lines[0], lines[1:]))(out.getvalue().splitlines()))
    return make


def _set_cell(name, value):
    def make(tmp_path):
        import csv
        import io

        table = list(csv.reader(io.StringIO("\n".join(CSV_TEXT[:4]))))
        table[1][table[0].index(name)] = value
        out = io.StringIO()
        csv.writer(out).writerows(table)
        lines = out.getvalue().splitlines()
        return _csv(tmp_path, lines[0], lines[1:])
    return make


@pytest.mark.parametrize("make, needle", [
    (lambda t: _csv(t, "", []), "empty file (no header row)"),
    (lambda t: _csv(t, CSV_TEXT[0], []), "no measurement rows below the header"),
    (lambda t: _csv(t, CSV_TEXT[0], ["A,b,c"]), "line 2: fewer cells than the 30 columns"),
    (_drop_column("measured_value"), "missing column(s) measured_value"),
    (_drop_column("tp"), "none of the 3 rows can be scored (first: NAR21-T1-02: parallel layout"),
    (_set_cell("tp", "0"), "line 2 (NAR21-T1-02): tp='0': expected a whole number in 1..2147483648"),
    (_set_cell("layers", "x"), "layers='x': expected a whole number in 1..2147483648"),
    (_set_cell("measured_value", "0"), "measured_value='0': expected a finite number > 0"),
    (_set_cell("measured_value", "nan"), "measured_value='nan'"),
    # a repeated id was scored twice ("Rows: 3" for 2 ids)
    (lambda t: _csv(t, CSV_TEXT[0], [CSV_TEXT[1], CSV_TEXT[2], CSV_TEXT[1]]),
     "line 4: id NAR21-T1-02 is already the id of line 2; each row needs its own id"),
])
def test_malformed_measurements_csv(tmp_path, make, needle):
    path = make(tmp_path)
    assert needle in one_line_error(["validate", "--csv", path, "--out", str(tmp_path / "out")])


def test_binary_csv_and_unwritable_report(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"\xff\xfe\x00")
    assert "not a readable CSV" in one_line_error(["validate", "--csv", str(path)])
    good = _csv(tmp_path, CSV_TEXT[0], CSV_TEXT[1:3])
    assert "cannot write the report" in one_line_error(["validate", "--csv", good, "--out", "/dev/null/x"])


# ----- layouts Megatron refuses must not get a number ---------------------------------------------
def test_tp_not_dividing_the_dense_ffn_is_rejected(tmp_path):
    """14337 = 3 x 4779 is odd: Megatron's divide(ffn, tp) asserts for tp=8, so no estimate and
    no search row may use tp > 1 with it (tp=1 still fits on 8 H100s)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, "intermediate_size": 14337}))
    err = one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb", "--tp", "8"])
    assert "tp_divides_ffn: tp=8 must divide ffn_hidden_size=14337" in err
    out = runner.invoke(app, ["search", "-m", str(path), "--device", "h100-80gb", "--top", "50", "--json"])
    assert out.exit_code == 0
    assert {row["strategy"]["tp"] for row in json.loads(out.stdout)["layouts"]} == {1}


MIXTRAL_SCRIPT = (SCRIPTS / "pretrain_mixtral_8x7b.sh").read_text()


@pytest.mark.parametrize("base, old, new, needle", [
    (BASE_SCRIPT, "TP=2", "TP=$(( 10**10**10 ))", "10**10000000000 is beyond 64-bit shell arithmetic"),  # hung
    (BASE_SCRIPT, "TP=2", "TP=$(( 2**200 ))", "2**200 is beyond 64-bit shell arithmetic"),
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 2 --moe-layer-freq '[1]*10**10'",
     "a list of 1 x 10000000000 entries is longer than 100000"),  # MemoryError
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 2 --moe-layer-freq 0",
     "--moe-layer-freq=0: must be >= 1"),  # ZeroDivisionError
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 2 --moe-layer-freq abc",
     "--moe-layer-freq='abc': cannot evaluate 'abc'"),
    (BASE_SCRIPT, "--bf16", "--bf16 \\\n    --attention-backend banana",
     "--attention-backend='banana': allowed flash, fused, unfused, local, auto"),
    (BASE_SCRIPT, "--bf16", "--bf16 \\\n    --fp8-format e5m2", "--fp8-format='e5m2': allowed e4m3, hybrid"),
    (BASE_SCRIPT, "--bf16", "--bf16 \\\n    --decoder-first-pipeline-num-layers -2",
     "--decoder-first-pipeline-num-layers=-2: must be in 0..num_layers=32"),
])
def test_launch_script_values_beyond_what_megatron_accepts(tmp_path, base, old, new, needle):
    assert old in base
    path = tmp_path / "job.sh"
    path.write_text(base.replace(old, new, 1))
    err = one_line_error(["estimate", "--script", str(path), "--device", "h100-80gb", "--vocab-size", "32000"])
    assert needle in err


# ----- autopar profile: options checked before anything is measured ------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--repeats", "0"], "--repeats=0: must be an integer in 1..1000"),  # was: no median for empty data
    (["--top", "0"], "--top=0: must be an integer in 1..1000"),  # was: profiled for minutes
    (["--tp", "0"], "--tp=0: must be an integer"),  # was: ZeroDivisionError
    (["--tp", "3"], "tp_divides_heads: tp=3 must divide num_attention_heads=32"),  # was: measured anyway
])
def test_profile_ops_options(tmp_path, extra, needle):
    err = one_line_error(["profile", "ops", "--db", str(tmp_path / "p.db"), *LLAMA, *extra])
    assert needle in err


def test_profile_db_in_an_impossible_folder():
    err = one_line_error(["profile", "ops", "--db", "/dev/null/p.db", *LLAMA, "--top", "1"])
    assert "cannot create its folder" in err


def test_profile_comm_sizes():
    pytest.importorskip("torch")
    assert "--sizes='abc': expected byte counts" in one_line_error(["profile", "comm", "--db", "x.db", "--sizes",
                                                                      "abc"])
    assert "--sizes=-1: must be an integer" in one_line_error(["profile", "comm", "--db", "x.db", "--sizes", "-1"])


def test_balance_refuses_layer_counts_its_exact_split_cannot_finish(tmp_path):
    """10,000 layers (ModelSpec's limit) took ~15 min in the quadratic split DP; now one line."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, "num_hidden_layers": 10_000}))
    err = one_line_error(["balance", "-m", str(path), "--device", "h100-80gb", "--nodes", "8", "--pp", "64",
                          "--dp", "1", "--tp", "1"])
    assert "num_layers=10000: balancing splits at most 1024 layers" in err


def test_empty_model_name():
    assert "--model='': empty" in one_line_error(["search", "-m", "", "--device", "h100-80gb"])


# ----- second pass: the embedding/loss split, VPP forms, MoE-only options ------------------------
@pytest.mark.parametrize("old, new, needle", [
    # Megatron-LM rule 17 (ecosystem.md 1.3): at most one VPP form; autopar used the stage count silently
    ("--bf16", "--bf16 \\\n    --num-virtual-stages-per-pipeline-rank 2 --num-layers-per-virtual-pipeline-stage 2",
     "--num-virtual-stages-per-pipeline-rank=2 with --num-layers-per-virtual-pipeline-stage=2: Megatron-LM accepts "
     "at most one"),
    # rule 18: uneven first/last stages need the stage-count form; 8,8,8,8 was estimated as vpp 2
    ("--bf16", "--bf16 \\\n    --num-layers-per-virtual-pipeline-stage 4 --decoder-first-pipeline-num-layers 8",
     "--num-layers-per-virtual-pipeline-stage=4 with --decoder-first/last-pipeline-num-layers"),
    # Megatron-LM TransformerConfig: the layout string alone, not with the first/last stage counts
    ("--bf16", "--bf16 \\\n    --pipeline-model-parallel-layout Et*8|t*8|t*8|t*8L --decoder-first-pipeline-num-layers 8",
     "Megatron-LM takes the layout alone"),
    # quotes inside GPT_ARGS="..." reach Megatron-LM literally, which refuses the character
    ("--bf16", "--bf16 \\\n    --pipeline-model-parallel-layout 'Et*8|t*8|t*8|t*8L'",
     "\"'\" is not a layer character"),
])
def test_launch_script_pipeline_forms_megatron_refuses(tmp_path, old, new, needle):
    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT.replace(old, new, 1))
    assert needle in one_line_error(["estimate", "--script", str(path), "--device", "h100-80gb", "--vocab-size", "32000"])


def test_moe_token_imbalance_on_a_dense_model_is_refused():
    """It was accepted and ignored (llama3-8b has no routed experts)."""
    err = one_line_error(["estimate", *LLAMA, "--moe-token-imbalance", "2"])
    assert "--moe-token-imbalance=2.0: model llama3-8b has no routed experts" in err


def test_torchtitan_export_writes_the_embedding_loss_split_it_was_costed_with(tmp_path):
    """30 layers, pp 2, vpp 4, embedding/loss counted: Megatron's chunks are (30 + 2) / 8 = 4 slots,
    the embedding and loss chunks 3 layers. torchtitan builds ceil((L + first_less + last_less) / k)
    stages (ecosystem.md 3.3 rule 7): k = 4 with weights 1/1 gives the same 8 chunks. The export
    wrote k = 15 // 4 = 3 with weights 0: ceil(30 / 3) = 10 stages, a different layout."""
    from autopar.export import torchtitan

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, "num_hidden_layers": 30}))
    out = runner.invoke(app, ["export", "--format", "torchtitan", "-m", str(path), "--device", "h100-80gb",
                              "--pp", "2", "--vpp", "4", "--zero", "3", "--embedding-loss-split"])
    assert out.exit_code == 0, out.output
    doc = torchtitan.read(out.stdout)
    par = doc["parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (4, 1, 1)
    assert torchtitan.check(doc, 8, 30) == []


def _balance_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def test_balance_compares_with_the_split_the_script_runs(tmp_path):
    """31 layers, pp 2, --account-for-embedding-in-pipeline-split: Megatron runs (31 + 1) / 2 = 16
    slots per stage, i.e. 15 layers + embedding, 16 layers. balance's 'even' column showed 16, 15
    (Megatron's default split without the switch)."""
    script = (BASE_SCRIPT.replace("PP=4", "PP=2", 1).replace("--num-layers 32", "--num-layers 31", 1)
              .replace("--bf16", "--bf16 \\\n    --account-for-embedding-in-pipeline-split", 1))
    path = tmp_path / "job.sh"
    path.write_text(script)
    args = ["balance", "--script", str(path), "--device", "h100-80gb", "--vocab-size", "32000", "--options", "none"]
    out = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert [row[4] for row in _balance_rows(out.stdout)] == ["15", "16"]
    assert "instead of --account-for-embedding/loss-in-pipeline-split" in out.stdout
    # with vpp 2, (31 + 1) / 4 = 8 slots a chunk: the embedding's chunk holds 7 layers (it was refused)
    out = runner.invoke(app, [*args, "--vpp", "2"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert [row[4] for row in _balance_rows(out.stdout)] == ["15 (7+8)", "16 (8+8)"]


@pytest.mark.parametrize("extra, needle", [
    # 2^63 - 1 layers x pp 2 wrapped negative in the int64 recompute_layers rule: an estimate came back
    (["--pp", "2", "--recompute", "full", "--recompute-layers", str(2**63 - 1)],
     f"--recompute-layers={2**63 - 1}: must be an integer in 1..2147483648"),
    (["--dp", str(10**20)], f"--dp={10**20}: must be an integer in 1..2147483648"),  # OverflowError
    (["--etp", str(10**20)], f"--etp={10**20}: must be an integer in 1..2147483648"),  # OverflowError
    (["--vocab-size", str(10**20)], f"--vocab-size={10**20}: must be an integer in 1..2147483648"),
])
def test_layout_and_size_options_beyond_int64_arithmetic(extra, needle):
    assert needle in one_line_error(["estimate", *LLAMA, *extra])


@pytest.mark.parametrize("changes, needle", [
    ({"vocab_size": 10**20}, f"vocab_size={10**20}: Input should be less than or equal to 2147483648"),
    ({"intermediate_size": 10**19}, f"intermediate_size={10**19}: Input should be less than or equal to 2147483648"),
])
def test_hf_config_sizes_beyond_int64_arithmetic(tmp_path, changes, needle):
    """Both crashed with OverflowError (padded vocabulary; the tp_divides_ffn rule)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_CFG, **changes}))
    assert needle in one_line_error(["search", "-m", str(path), "--device", "h100-80gb"])
