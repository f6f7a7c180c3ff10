"""Megatron-FSDP exports carry the flags Megatron-LM requires."""

from __future__ import annotations

from autopar.strategy import Strategy
from conftest import make_problem


def test_megatron_fsdp_export_has_the_required_flags():
    """Megatron-LM's Megatron-FSDP user guide, "Required Configurations": --use-megatron-fsdp,
    --data-parallel-sharding-strategy, --no-gradient-accumulation-fusion, --use-distributed-optimizer,
    --ckpt-format fsdp_dtensor. ZeRO-1 stays the plain distributed optimizer."""
    from autopar.export.megatron import megatron_args

    p = make_problem("llama3-8b", gbs=64, seq=4096)
    for zero, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        words = megatron_args(p, Strategy(dp=8, zero=zero)).split()
        for flag in ("--use-megatron-fsdp", "--use-distributed-optimizer", "--no-gradient-accumulation-fusion"):
            assert flag in words
        assert words[words.index("--ckpt-format") + 1] == "fsdp_dtensor"
        assert words[words.index("--data-parallel-sharding-strategy") + 1] == strategy
    zero1 = megatron_args(p, Strategy(dp=8, zero=1)).split()
    assert "--use-distributed-optimizer" in zero1
    assert not {"--use-megatron-fsdp", "--ckpt-format", "--no-gradient-accumulation-fusion"} & set(zero1)
