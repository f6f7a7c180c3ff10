"""A launch script's bad value is named by the script's own flag, not by the autopar option or
ModelSpec field it becomes (found by tests/fuzz/test_fuzz_launch_script.py): the script's
``--global-batch-size -5`` was reported as ``--gbs=-5``, ``GPUS_PER_NODE=0`` as
``--devices-per-node=0``, ``--num-query-groups`` as ``model.num_kv_heads``, and a 5,000-digit
``NNODES`` was a ValueError traceback."""

from __future__ import annotations

import pytest

from test_bad_input import BASE_SCRIPT, MIXTRAL_SCRIPT, one_line_error

SCRIPT_ARGS = ["--device", "h100-80gb", "--vocab-size", "32000"]


@pytest.mark.parametrize("base, old, new, needle", [
    (BASE_SCRIPT, "NNODES=2", "NNODES=" + "9" * 5000, "launcher --nnodes=99999999999999999999... (5000 digits): "
     "must be an integer in 1..999999999"),  # ValueError: Exceeds the limit (4300 digits)
    (BASE_SCRIPT, "GPUS_PER_NODE=8", "GPUS_PER_NODE=0", "launcher --nproc_per_node=0: must be an integer in 1.."),
    (BASE_SCRIPT, "NNODES=2", "NNODES=200000", "job.sh: --nnodes=200000: must be an integer in 1..100000"),
    (BASE_SCRIPT, "GPUS_PER_NODE=8", "GPUS_PER_NODE=2048", "job.sh: --nproc_per_node=2048: must be an integer in "
     "1..1024"),
    (BASE_SCRIPT, "--global-batch-size 256", "--global-batch-size -5",
     "job.sh: --global-batch-size=-5: must be an integer in 1..1073741824"),  # was --gbs=-5
    (BASE_SCRIPT, "--seq-length 4096", "--seq-length 99999999999", "job.sh: --seq-length=99999999999"),
    (BASE_SCRIPT, "TP=2", "TP=4294967296", "job.sh: --tensor-model-parallel-size=4294967296: must be an integer in "
     "1..2147483648"),  # was --tp=...
    (MIXTRAL_SCRIPT, "--num-query-groups 8", "--num-query-groups 9223372036854775807",
     "job.sh: --num-query-groups=9223372036854775807: Input should be less than"),  # was model.num_kv_heads
    (MIXTRAL_SCRIPT, "--rotary-base 1000000", "--rotary-base 0", "job.sh: --rotary-base=0.0: Input should be greater "
     "than 0"),  # was model.rope_theta
    (MIXTRAL_SCRIPT, "--moe-router-topk 2", "--moe-router-topk 9", "job.sh: --moe-router-topk=9 must be in "
     "1..8 (--num-experts)"),
])
def test_script_values_are_named_by_the_script_flag(tmp_path, base, old, new, needle):
    assert old in base
    path = tmp_path / "job.sh"
    path.write_text(base.replace(old, new, 1))
    err = one_line_error(["estimate", "--script", str(path), *SCRIPT_ARGS])
    assert needle in err


def test_command_line_values_keep_the_option_name(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(BASE_SCRIPT)
    assert "--gbs=-5: must be an integer" in one_line_error(["estimate", "--script", str(path), *SCRIPT_ARGS,
                                                             "--gbs", "-5"])
