"""MindSpeed-LLM flags autopar does not model are refused with their reason (autopar.specs.script_refused)."""

import pytest
from typer.testing import CliRunner

from autopar.cli import app
from autopar.specs.script_refused import REFUSED_MINDSPEED_FLAGS

runner = CliRunner()


@pytest.mark.parametrize("flag", sorted(REFUSED_MINDSPEED_FLAGS))
def test_unmodelled_mindspeed_flag_is_one_error_line(tmp_path, flag):
    path = tmp_path / "run.sh"
    path.write_text("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py --num-layers 8 --hidden-size 1024 "
                    "--num-attention-heads 16 --seq-length 2048 --vocab-size 1000 --bf16 --use-fused-rmsnorm "
                    f"--tensor-model-parallel-size 2 --sequence-parallel {flag}\n")
    res = runner.invoke(app, ["estimate", "--script", str(path), "--device", "h100-80gb"])
    err = res.stderr.strip()
    assert res.exit_code == 2 and len(err.splitlines()) == 1, err
    assert f"run.sh: {flag} is not modelled by autopar (it " in err and "drop it" in err
