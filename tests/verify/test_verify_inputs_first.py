"""``autopar verify``: every input is checked before a job is written or launched (a ``--record``
file that is no profile database was refused only after the runs it was to store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from conftest import SCRIPTS

runner = CliRunner()
VERIFY = ["verify", "--model", "llama2-7b", "--device", "h100-80gb", "--script", str(SCRIPTS / "pretrain_llama2_7b.sh"),
          "--top", "1"]


@pytest.mark.parametrize("content, needle", [
    (b"{}\n", "not an autopar profile database (not an SQLite file: it starts with b'{}\\n'"),
    (b"x", "not an autopar profile database (not an SQLite file: it starts with b'x'"),
])
def test_a_record_file_that_is_no_database_is_refused_before_any_job(tmp_path, content, needle):
    record = tmp_path / "res.json"
    record.write_bytes(content)
    out = tmp_path / "jobs"
    for launcher in ("none", "local"):
        res = runner.invoke(app, [*VERIFY, "--launcher", launcher, "--record", str(record), "--out", str(out)])
        assert res.exit_code == 2, res.output
        assert res.stderr.strip() == f"error: --record={str(record)!r}: {needle}, not b'SQLite format 3\\x00')"
        assert not out.exists() and record.read_bytes() == content  # nothing written, the file as it was


def test_a_record_whose_folder_cannot_be_made_is_refused_before_any_job(tmp_path):
    (tmp_path / "f").write_text("a file")
    out = tmp_path / "jobs"
    res = runner.invoke(app, [*VERIFY, "--launcher", "none", "--record", str(tmp_path / "f" / "runs.db"),
                              "--out", str(out)])
    assert res.exit_code == 2 and "cannot create its folder" in res.stderr and not out.exists()


def test_a_new_or_empty_record_file_is_accepted_and_left_alone(tmp_path):
    """A missing file is created only when runs are stored (``--launcher none`` stores none); an
    empty (0-byte) file is an empty SQLite database."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for record in (empty, tmp_path / "new" / "runs.db"):
        res = runner.invoke(app, [*VERIFY, "--launcher", "none", "--record", str(record),
                                  "--out", str(tmp_path / f"jobs-{record.name}")])
        assert res.exit_code == 0, res.output
    assert empty.read_bytes() == b"" and not Path(tmp_path / "new").exists()


def test_no_measured_job_exits_3_with_one_line(tmp_path, monkeypatch):
    """Every job failed (the launcher not found): the report is printed, then one ``verify:``
    line and exit code 3 (was 0, as if the runs had measured something)."""
    import shutil

    bin_dir = tmp_path / "bin"  # a PATH with bash and no torchrun
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash"))
    monkeypatch.setenv("PATH", str(bin_dir))
    res = runner.invoke(app, [*VERIFY[:-1], "2", "--launcher", "local", "--out", str(tmp_path / "jobs")])
    assert res.exit_code == 3, res.output
    assert res.stderr.strip().splitlines()[-1] == ("verify: no job produced a measurement (2 runs: "
                                                   "command_not_found 2); exit code 3")


def test_report_only_exits_3_until_a_job_has_a_measured_step(tmp_path):
    from conftest import TESTS_DATA

    out = tmp_path / "jobs"
    assert runner.invoke(app, [*VERIFY[:-1], "2", "--launcher", "none", "--out", str(out)]).exit_code == 0
    res = runner.invoke(app, ["verify", "--report-only", "--out", str(out), "--json"])
    assert res.exit_code == 3 and res.stderr.strip().splitlines()[-1] == (
        "verify: no job produced a measurement (2 runs: not_run 2); exit code 3")
    first = sorted(p for p in out.iterdir() if p.is_dir())[0]
    (first / "log.txt").write_text((TESTS_DATA / "logs" / "megatron_mixtral_16xh100.log").read_text())
    res = runner.invoke(app, ["verify", "--report-only", "--out", str(out), "--json"])
    assert res.exit_code == 0 and "no job produced a measurement" not in res.stderr


def test_no_measurement_counts_each_failure():
    from autopar.verify.logs import RunResult
    from autopar.verify.report import no_measurement

    assert no_measurement([RunResult(failure="out_of_memory"), RunResult(failure="out_of_memory"),
                           RunResult(failure="timeout")]) == \
        "no job produced a measurement (3 runs: out_of_memory 2, timeout 1)"
    assert no_measurement([RunResult(failure="timeout"), RunResult(steps=3, step_time_s=1.5)]) is None


@pytest.mark.parametrize("option, needle", [
    ("foo", "not one sbatch option; give one long option per --sbatch-option, as --name, --name=value or --name "
            "value (e.g. --qos=high)"),  # was written as '#SBATCH foo'
    ("--qos=high\necho hi", "not one sbatch option"),  # a second line of the batch script
    ("--nodes=4", "sbatch --nodes: autopar writes it from the job"),  # after autopar's: Slurm took the user's
    ("--nod 4", "sbatch --nodes: autopar writes it from the job"),  # getopt_long's abbreviation
    ("--gpus-per-node=4", "sbatch --gpus-per-node: autopar writes it from the job"),
    ("--time=10:00:00", "sbatch --time: autopar writes it from --time-limit-s (and cancels the job 5 minutes after); "
                        "give --time-limit-s SECONDS instead"),
    ("--account=proj", "sbatch --account: give --account instead"),
])
def test_an_sbatch_option_that_is_malformed_or_autopars_own_is_refused(tmp_path, option, needle):
    out = tmp_path / "jobs"
    res = runner.invoke(app, [*VERIFY, "--launcher", "slurm", "--sbatch-option", option, "--out", str(out)])
    assert res.exit_code == 2 and res.stderr.strip().startswith(f"error: --sbatch-option={option!r}: {needle}"), \
        res.output
    assert not out.exists()


@pytest.mark.parametrize("launcher", ["none", "local"])
@pytest.mark.parametrize("option", [["--sbatch-option", "--qos=high"], ["--account", "proj"],
                                    ["--container-image", "nvcr.io#nvidia/pytorch:25.01-py3"]])
def test_a_slurm_option_without_slurm_is_refused(tmp_path, launcher, option):
    """With --launcher none or local no batch script is written: the option was ignored silently."""
    res = runner.invoke(app, [*VERIFY, "--launcher", launcher, *option, "--out", str(tmp_path / "jobs")])
    assert res.exit_code == 2 and res.stderr.strip() == (
        f"error: {option[0]} is a Slurm option and --launcher is {launcher!r}: add --launcher slurm or drop "
        f"{option[0]} (it would be ignored)"), res.output


def test_check_sbatch_options_keeps_well_formed_ones():
    from autopar.verify.launch import check_sbatch_options

    assert check_sbatch_options(["--qos=high", "--exclusive", "--mem 0", "--nodelist=n[1-4]"]) == (
        "--qos=high", "--exclusive", "--mem 0", "--nodelist=n[1-4]")
