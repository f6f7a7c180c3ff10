"""``--overlap-grad-reduce`` in a launch script (Megatron-LM's default is off: gradients are reduced
after the last backward). A new user found ``dp_comm 0.000`` for a script without the flag: the
reader classified it "no effect" and costed the overlap anyway. Now the script's choice is
``TrainSpec.overlap_grad_reduce``, the estimate charges the reduce, and the export writes the flag
only when the plan overlaps."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from autopar.cli import app
from conftest import SCRIPTS

runner = CliRunner()


def _estimate(script: str) -> dict:
    out = runner.invoke(app, ["estimate", "--script", script, "--vocab-size", "32000", "--device", "a100-80gb",
                              "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def _scripts(tmp_path) -> tuple[str, str]:
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text()
    plain = tmp_path / "plain.sh"
    plain.write_text(text)
    overlapped = tmp_path / "overlapped.sh"
    overlapped.write_text(text.replace("--use-distributed-optimizer", "--use-distributed-optimizer --overlap-grad-reduce"))
    assert "--overlap-grad-reduce" not in text and "--overlap-grad-reduce" in overlapped.read_text()
    return str(plain), str(overlapped)


def test_script_without_the_flag_pays_the_gradient_reduce(tmp_path):
    plain, overlapped = _scripts(tmp_path)
    without, with_ = _estimate(plain), _estimate(overlapped)
    assert without["time_breakdown_s"]["dp_comm"] > with_["time_breakdown_s"]["dp_comm"]
    assert without["step_time_s"] > with_["step_time_s"]


def test_export_writes_the_overlap_only_when_planned(tmp_path):
    plain, overlapped = _scripts(tmp_path)
    for script, written in ((plain, False), (overlapped, True)):
        out = runner.invoke(app, ["export", "--format", "megatron", "--script", script, "--vocab-size", "32000",
                                  "--device", "a100-80gb"])
        assert out.exit_code == 0, out.output
        assert ("--overlap-grad-reduce" in out.stdout) is written
        assert ("--overlap-param-gather" in out.stdout) is written  # the script's distributed optimizer
