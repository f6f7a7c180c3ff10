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
from conftest import SHARED

runner = CliRunner()
LLAMA = ["-m", "llama3-8b", "--device", "h100-80gb"]


def one_line_error(args: list[str]) -> str:
    """stderr of a run that must fail as a user error: exit 2, one line, no traceback."""
    result = runner.invoke(app, args)
    err = result.stderr.strip()
    assert result.exit_code == 2, (result.exit_code, result.output, repr(result.exception))
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
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
BASE_SCRIPT = (SHARED / "scripts" / "pretrain_llama2_7b.sh").read_text()


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
LLAMA_CFG = json.loads((SHARED / "models" / "llama3-8b.json").read_text())
QWEN_MOE_CFG = json.loads((SHARED / "models" / "qwen3-30b-a3b.json").read_text())
MIXTRAL_CFG = json.loads((SHARED / "models" / "mixtral-8x7b.json").read_text())


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
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_CFG).replace('"vocab_size": 128256', '"vocab_size": ' + "9" * 5000))
    assert "a value cannot be read" in one_line_error(["estimate", "-m", str(path), "--device", "h100-80gb"])


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
    (lambda t: _db_with(t, 1e-3, "not json"), "shape='not json': expected a JSON object of positive dimensions"),
])
def test_corrupt_profile_db(tmp_path, make, needle):
    path = make(tmp_path)
    assert needle in one_line_error(["search", *LLAMA, "--top", "1", "--profile-db", str(path)])


def test_profile_device_without_profile_db():
    assert "--profile-device='h100' needs --profile-db" in one_line_error(
        ["search", *LLAMA, "--profile-device", "h100"])
