"""The caveat on ZeRO 2/3 layouts whose framework's sharded data parallelism few validation rows measured
(autopar.validate.bands.sharded_rows_note), in the search table and JSON."""

import json

from autopar.validate.bands import sharded_rows, sharded_rows_note, shipped_errors


def _count(framework: str) -> int:
    return sum(1 for r in shipped_errors()
               if r["kind"] == "step_time" and r["framework"] == framework and r["zero"] >= 2)


def test_sharded_rows_are_the_shipped_rows_that_ran_zero_2_or_3():
    # Megatron-FSDP: one Megatron-Bridge row; torchtitan's FSDP2 rows are all zero 3 (issue 15's TT rows).
    assert sharded_rows("megatron") == ("MBR-2511-H100-1",)
    assert len(sharded_rows("torchtitan")) == _count("torchtitan") >= 5


def test_note_only_when_a_layout_shards_and_rows_are_few():
    assert sharded_rows_note("megatron", [0, 1, 1]) is None  # no layout shards
    note = sharded_rows_note("megatron", [1, 3])
    assert note == ("zero 2/3 layouts (Megatron-FSDP): 1 measured step-time row (MBR-2511-H100-1), fewer than 5: "
                    "their step times are less certain than the band says")
    assert sharded_rows_note("torchtitan", [3]) is None  # enough FSDP2 rows
    assert sharded_rows_note("galvatron", [3]) is None  # PyTorch FSDP: the FSDP2 rows measure it
    assert sharded_rows_note("megatron-bridge", [3]).startswith("zero 2/3 layouts (Megatron-FSDP): 1 measured")
    assert sharded_rows_note("sapp", [2]).startswith("zero 2/3 layouts (MindFormers optimizer parallelism): 0 measured "
                                                     "step-time rows, fewer than 5")
    assert sharded_rows_note("megatron", [2], min_rows=1) is None


def test_search_table_and_json_carry_the_note(capsys):
    from typer.testing import CliRunner

    from autopar.cli.app import app

    args = ["search", "--model", "llama3-70b", "--device", "h100-80gb", "--nodes", "8", "--devices-per-node", "8",
            "--gbs", "1024", "--seq-len", "8192", "--top", "3", "--zero", "3"]
    out = CliRunner().invoke(app, args + ["--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["certainty"]["sharding_note"].startswith("zero 2/3 layouts (Megatron-FSDP): 1 measured")
    table = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert "zero 2/3 layouts (Megatron-FSDP)" in table.stdout
