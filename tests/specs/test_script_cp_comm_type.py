"""``--cp-comm-type`` read from a launch script as Megatron-LM reads it, bad values refused in one line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.errors import AutoparError
from autopar.specs.script import read_script
from conftest import mixtral_script
from test_bad_input import error_line_of
from test_script_noop_layers import script_with

runner = CliRunner()


@pytest.mark.parametrize("flag", ["--cp-comm-type p2p", "--cp-comm-type p2p p2p p2p p2p p2p p2p p2p p2p", ""])
def test_cp_comm_type_p2p_is_read(tmp_path, flag):
    assert read_script(script_with(tmp_path, flag)).layout["cp"] == 2


@pytest.mark.parametrize("flag, needle", [
    ("--cp-comm-type a2a+p2p", "needs --hierarchical-context-parallel-sizes A P"),
    ("--cp-comm-type p2p p2p allgather p2p p2p p2p p2p a2a+p2p", "mixes a2a+p2p, allgather, p2p across layers"),
    ("--cp-comm-type ring", "ring not allowed; Megatron-LM accepts p2p, a2a, allgather, a2a+p2p"),
])
def test_cp_comm_type_bad_values_are_refused(tmp_path, flag, needle):
    with pytest.raises(AutoparError, match="--cp-comm-type") as err:
        read_script(script_with(tmp_path, flag))
    assert needle in str(err.value)
    result = runner.invoke(app, ["estimate", "--script", script_with(tmp_path, flag), "--device", "h100-80gb"])
    assert needle in error_line_of(result)


def test_cp_comm_type_list_must_have_one_entry_or_one_per_layer(tmp_path):
    # Megatron-Core TransformerConfig (cp > 1): len(cp_comm_type) == num_layers (32 here).
    bad = mixtral_script(tmp_path, "--context-parallel-size 2 --cp-comm-type p2p p2p")
    with pytest.raises(AutoparError, match=r"--cp-comm-type='p2p p2p': 2 values; Megatron-LM takes one value or "
                                           r"one per layer \(32 for --num-layers=32\)"):
        read_script(bad)
    assert read_script(mixtral_script(tmp_path, "--context-parallel-size 2 --cp-comm-type " + "p2p " * 32)).layout["cp"] == 2
    assert read_script(mixtral_script(tmp_path, "--cp-comm-type p2p p2p")).layout["cp"] == 1  # not checked without CP
