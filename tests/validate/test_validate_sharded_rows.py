"""The caveat on ZeRO 2/3 layouts whose framework's sharded data parallelism few validation rows measured
(autopar.validate.bands.sharded_rows_note), in the search table and JSON."""

import json

from autopar.validate.bands import sharded_rows, sharded_rows_note, shipped_errors


def _count(framework: str) -> int:
    return sum(1 for r in shipped_errors()
               if r["kind"] == "step_time" and r["framework"] == framework and r["zero"] >= 2)


def test_sharded_rows_are_the_shipped_rows_that_ran_zero_2_or_3():
    # Megatron-FSDP: one Megatron-Bridge row; torchtitan's FSDP2 rows are all zero 3 (issue 15's TT rows).
    assert [r["id"] for r in sharded_rows("megatron")] == ["MBR-2511-H100-1"]
    assert len(sharded_rows("torchtitan")) == _count("torchtitan") >= 5


def test_note_only_when_a_layout_shards_and_rows_are_few():
    assert sharded_rows_note("megatron", [0, 1, 1]) is None  # no layout shards
    note = sharded_rows_note("megatron", [1, 3])
    # the row says what ran: Llama-3-8B FP8-CS on one 8-GPU node (measurements.csv), not a multi-node or MoE run
    assert note == ("zero 2/3 layouts (Megatron-FSDP): 1 measured step-time row (MBR-2511-H100-1: llama3-8b fp8, "
                    "8 devices on 1 node), fewer than 5: their step times are less certain than the band says")
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


def test_sharded_rows_are_marked_in_the_table_and_the_report(tmp_path):
    """A new user found the caveat only under the table: each ZeRO 2/3 row's note says 'few rows', and
    the HTML report's certainty paragraph and ranking notes carry the caveat too."""
    from typer.testing import CliRunner

    from autopar.cli.app import app

    args = ["search", "--model", "llama3-8b", "--device", "h100-80gb", "--nodes", "1", "--gbs", "64", "--top", "4",
            "--zero", "1,3"]
    table = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert table.exit_code == 0, table.output
    rows = [line for line in table.stdout.splitlines() if line.startswith("│")]
    assert any("│    1 │" in r for r in rows) and any("│    3 │" in r for r in rows)
    assert all(("few rows" in r) == ("│    3 │" in r) for r in rows)
    assert "few rows: zero 2/3 layouts (Megatron-FSDP): 1 measured" in " ".join(table.stdout.split())
    out = CliRunner().invoke(app, args + ["--report", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    page = (tmp_path / "r" / "report.html").read_text()
    assert "the development set of autopar validate). But zero 2/3 layouts (Megatron-FSDP): 1 measured" in page
    assert "few rows: zero 2/3 layouts" in page
