"""``--use-torch-fsdp2`` scripts Megatron-LM's validate_args rejects are refused with its assert
(autopar.specs.script_fsdp); one it runs is read as ZeRO-3. The shipped Llama-2 7B script (tp 2, pp 4,
distributed optimizer, ``export CUDA_DEVICE_MAX_CONNECTIONS=1``, untied, no gradient-accumulation
fusion) with ``--use-torch-fsdp2`` was costed as ZeRO-3 at pp 4; Megatron rejects it (checked with
tools/realclients/megatron_check.py: pp 1 without the optimizer and the export is OK, dp 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS

from autopar.errors import AutoparError
from autopar.specs.script import read_script


def _script(tmp_path: Path, pp: int = 1, dist_opt: bool = False, export: bool = False, extra: str = "",
            drop: str = "") -> Path:
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("PP=4", f"PP={pp}")
    if not dist_opt:
        text = text.replace("--use-distributed-optimizer \\", "\\")
    if not export:
        text = text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", "")
    if drop:
        text = text.replace(f"{drop} \\", "\\")
    path = tmp_path / "job.sh"
    path.write_text(text.replace("--bf16\n", f"--bf16 --vocab-size 32000 --use-torch-fsdp2 {extra}\n"))
    return path


def _refused(path: Path, needle: str) -> None:
    with pytest.raises(AutoparError, match=needle):
        read_script(path)


def test_fsdp2_megatron_runs_is_zero3(tmp_path):
    plan = read_script(_script(tmp_path))
    assert (plan.layout["zero"], plan.layout["pp"]) == (3, 1)


def test_pipeline_parallelism_is_refused(tmp_path):
    _refused(_script(tmp_path, pp=4, dist_opt=True, export=True),
             r"--use-torch-fsdp2 with --pipeline-model-parallel-size=4: Megatron-LM asserts '--use-torch-fsdp2 is not "
             r"supported with pipeline parallelism' \(megatron/training/arguments.py\)")


def test_distributed_optimizer_is_refused(tmp_path):
    _refused(_script(tmp_path, dist_opt=True), "with --use-distributed-optimizer: Megatron-LM asserts "
             "'--use-torch-fsdp2 is not supported with MCore's distributed optimizer'")


def test_one_max_connection_is_refused(tmp_path):
    _refused(_script(tmp_path, export=True), "with CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM asserts 'FSDP always "
             "requires CUDA_DEVICE_MAX_CONNECTIONS value large than one'")


def test_the_other_asserts(tmp_path):
    _refused(_script(tmp_path, drop="--no-gradient-accumulation-fusion"), "add --no-gradient-accumulation-fusion")
    _refused(_script(tmp_path, drop="--untie-embeddings-and-output-weights"),
             "requires --untie-embeddings-and-output-weights")
    _refused(_script(tmp_path, extra="--ckpt-format torch"), "--ckpt-format=torch: .*torch_dist or torch_dcp")
    _refused(_script(tmp_path, extra="--expert-model-parallel-size 2"), "not supported with expert parallelism")
