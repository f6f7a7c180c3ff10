"""Dropout is one switch (ModelSpec.dropout: the attention and hidden masks together): a script with
one rate 0 and the other not is refused, and exports write both rates as costed, at the script's own
rates (issue 15: an export of attention 0.1 / hidden 0.0 wrote no dropout flag, so Megatron-LM ran
hidden dropout 0.1, its default; and a script's 0.05 was written back as 0.1)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SCRIPTS
from typer.testing import CliRunner

from autopar.cli.app import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script


def _llama(tmp_path: Path, attention: str | None, hidden: str | None) -> Path:
    """The shipped llama2-7b script (attention and hidden dropout 0.0) with the given rates (None: the
    flag removed, Megatron's default 0.1)."""
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("--bf16\n", "--bf16 --vocab-size 32000\n")
    text = text.replace("--attention-dropout 0.0", f"--attention-dropout {attention}" if attention else "")
    text = text.replace("--hidden-dropout 0.0", f"--hidden-dropout {hidden}" if hidden else "")
    path = tmp_path / "job.sh"
    path.write_text(text)
    return path


@pytest.mark.parametrize("attention, hidden, needle", [
    ("0.1", "0.0", "--attention-dropout=0.1 with --hidden-dropout=0:"),
    ("0.0", None, "--attention-dropout=0 with --hidden-dropout=0.1 (Megatron-LM's default):"),
])
def test_dropout_rates_on_and_off_are_refused(tmp_path, attention, hidden, needle):
    with pytest.raises(AutoparError, match=re.escape(f"{needle} autopar costs dropout as one switch")):
        read_script(_llama(tmp_path, attention, hidden))


@pytest.mark.parametrize("attention, hidden, written", [
    (None, None, "--attention-dropout 0.1 --hidden-dropout 0.1"),
    ("0.05", "0.02", "--attention-dropout 0.05 --hidden-dropout 0.02"),  # the script's own rates
    ("0.05", None, "--attention-dropout 0.05 --hidden-dropout 0.1"),  # hidden at Megatron's default
    ("0.0", "0.0", "--attention-dropout 0.0 --hidden-dropout 0.0"),
])
@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_exports_write_both_dropout_rates(tmp_path, attention, hidden, written, fmt):
    out = CliRunner().invoke(app, ["export", "--script", str(_llama(tmp_path, attention, hidden)), "--device",
                                   "h100-80gb", "--format", fmt, "--tp", "2", "--pp", "4"])
    assert out.exit_code == 0, out.output
    assert written in out.output


@pytest.mark.parametrize("rates, dropout", [((0.0, 0.1), True), ((0.1, 1.0), True), ((0.1, 0.1), False)])
def test_model_rates_are_two_probabilities_with_dropout_on(rates, dropout):
    from pydantic import ValidationError

    from autopar.specs import load_model
    fields = load_model("llama3-8b").model_dump() | {"dropout": dropout, "dropout_rates": rates}
    with pytest.raises(ValidationError, match="two probabilities in"):
        type(load_model("llama3-8b")).model_validate(fields)


def test_a_rate_of_one_is_refused(tmp_path):
    with pytest.raises(AutoparError, match=re.escape("--hidden-dropout=1.0: must be a probability in [0, 1) (1 drops")):
        read_script(_llama(tmp_path, "0.1", "1"))


def test_the_title_says_dropout_is_costed_and_at_which_rates(tmp_path):
    out = CliRunner().invoke(app, ["estimate", "--script", str(_llama(tmp_path, "0.05", "0.02")), "--device",
                                   "h100-80gb", "--tp", "2", "--pp", "4"])
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines()[0].endswith(", bf16, dropout 0.05 attention / 0.02 hidden")
    plain = CliRunner().invoke(app, ["estimate", "--script", str(_llama(tmp_path, "0.0", "0.0")), "--device",
                                     "h100-80gb", "--tp", "2", "--pp", "4"])
    assert plain.stdout.splitlines()[0].endswith(", bf16")
