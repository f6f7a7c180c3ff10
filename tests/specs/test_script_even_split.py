"""A script's pipeline split is Megatron-LM's: without first/last stage counts (or a layout) the
layers must divide by pp, else Megatron asserts "Number of layers should be divisible by the
pipeline-model-parallel size" (megatron/training/arguments.py) and autopar refuses the script,
naming flags that make it run (each suggestion below checked OK by Megatron's own validate_args
through tools/realclients/megatron_check.py). autopar used to cost 30 layers over pp 4 as 7,8,8,7.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS

from autopar.errors import AutoparError
from autopar.specs.script import _first_last_counts, read_script


def _script(tmp_path: Path, layers: str) -> Path:
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text()  # pp 4
    path = tmp_path / "job.sh"
    path.write_text(text.replace("--num-layers 32 ", f"--num-layers {layers} "))
    return path


def test_layers_pp_does_not_divide_are_refused_with_the_flags_that_run(tmp_path):
    # 30 + 2 = 32 = 4 x 8; first 8, last 8, middle (30 - 16) / 2 = 7 each
    with pytest.raises(AutoparError, match=r"--num-layers=30 is not divisible by --pipeline-model-parallel-size=4: "
                       r"Megatron-LM asserts 'Number of layers should be divisible by the pipeline-model-parallel "
                       r"size' \(megatron/training/arguments.py\); to run it add --account-for-embedding-in-pipeline-"
                       r"split --account-for-loss-in-pipeline-split or --decoder-first-pipeline-num-layers 8 "
                       r"--decoder-last-pipeline-num-layers 8 or --pipeline-model-parallel-layout"):
        read_script(_script(tmp_path, "30"))


def test_virtual_stages_keep_each_stage_a_multiple_of_vpp(tmp_path):
    # vpp 2: middle stages 8 (30 - 6 - 8 = 16 over 2), first 6, last 8, all even
    with pytest.raises(AutoparError, match="--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 8"):
        read_script(_script(tmp_path, "30 --num-virtual-stages-per-pipeline-rank 2"))


def test_one_account_flag_is_offered_when_it_divides(tmp_path):
    # 31 + 1 = 32 = 4 x 8
    with pytest.raises(AutoparError, match=r"add --account-for-embedding-in-pipeline-split \(or --account-for-loss"):
        read_script(_script(tmp_path, "31"))


def test_the_forms_megatron_runs_are_read(tmp_path):
    lay = read_script(_script(tmp_path, "30 --decoder-first-pipeline-num-layers 8 "
                                        "--decoder-last-pipeline-num-layers 8")).layout
    assert lay["layers_per_stage"] == (8, 7, 7, 8)
    lay = read_script(_script(tmp_path, "30 --account-for-embedding-in-pipeline-split "
                                        "--account-for-loss-in-pipeline-split")).layout
    assert lay["account_for_embedding"] and lay["account_for_loss"] and lay["layers_per_stage"] is None
    assert read_script(_script(tmp_path, "32")).layout["layers_per_stage"] is None


def test_first_last_counts():
    assert _first_last_counts(30, 4, 1) == (8, 8)  # middle 7, 7
    assert _first_last_counts(30, 4, 2) == (6, 8)  # middle 8, 8
    assert _first_last_counts(31, 2, 1) == (15, 16)  # no middle stage
    assert _first_last_counts(61, 8, 1) == (6, 7)  # middle 6 x 8 = 48, 13 left
