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


def test_megatron_script_says_what_the_user_adds_and_why_the_checkpoint_format_changes():
    """The Megatron-LM export's script (as the Megatron-Bridge one does) says in a comment above
    torchrun that data, tokenizer, checkpoint, --train-iters and the multi-node rendezvous are the
    user's to add; where Megatron-FSDP switches --ckpt-format to fsdp_dtensor it says why. ZeRO-1
    keeps Megatron-LM's default format and has no such comment."""
    from autopar.export.megatron import write

    p = make_problem("llama3-8b", gbs=64, seq=4096, nodes=2)
    text = write(p, Strategy(dp=16, zero=3))
    head = text[:text.index("torchrun")]
    assert all(line.startswith(("#", "export ")) for line in head.splitlines())
    for words in ("--data-path", "--tokenizer-type", "--save/--load", "--train-iters", "--node_rank", "--master_addr",
                  "--rdzv-endpoint"):
        assert words in head, words
    assert "--ckpt-format fsdp_dtensor: Megatron-FSDP (--use-megatron-fsdp) needs this checkpoint format" in head
    plain = write(p, Strategy(dp=16, zero=1))
    assert "--train-iters" in plain[:plain.index("torchrun")] and "fsdp_dtensor" not in plain
