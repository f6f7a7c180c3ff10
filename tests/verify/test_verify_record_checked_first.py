"""``verify --record FILE`` is checked before anything else (second hostile round): with no job
measuring (no torchrun here) verify exited 3 without a word about a --record it ignored or could
not use. A --record that cannot be a profile DB is refused (exit 2) before the problem is read or
any job written, and ``--report-only`` (which stores nothing) refuses --record."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autopar.cli import app

SCRIPT = str(Path(__file__).resolve().parents[1] / "data" / "scripts" / "pretrain_llama2_7b.sh")
runner = CliRunner()


def _one_error(args: list[str]) -> str:
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.output
    return lines[0]


def test_a_record_path_whose_folder_cannot_exist_is_refused_before_the_script_is_read(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    # the script lacks a vocabulary size (an error of its own): --record is named first
    line = _one_error(["verify", "--script", SCRIPT, "--device", "h100-80gb", "--record", str(text / "x.db"),
                       "--out", str(tmp_path / "v")])
    assert line.startswith(f"error: --record={str(text / 'x.db')!r}: cannot create its folder"), line
    assert not (tmp_path / "v").exists()


def test_a_text_file_or_the_script_itself_as_record_is_refused(tmp_path):
    for record in (SCRIPT, str(tmp_path / "notes.txt")):
        Path(record).exists() or Path(record).write_text("hello\n")
        line = _one_error(["verify", "--script", SCRIPT, "--vocab-size", "32000", "--device", "h100-80gb",
                           "--record", record, "--out", str(tmp_path / "v")])
        assert f"--record={record!r}: not an autopar profile database" in line, line
    assert not (tmp_path / "v").exists()


def test_record_with_report_only_is_refused(tmp_path):
    # was: --report-only read the logs, exit 3 'no job produced a measurement', --record ignored
    line = _one_error(["verify", "--report-only", "--out", str(tmp_path / "v"), "--record", str(tmp_path / "r.db")])
    assert "--record=" in line and "with --report-only: --report-only reads the logs in --out and stores nothing" \
        in line, line
    assert not (tmp_path / "r.db").exists()
