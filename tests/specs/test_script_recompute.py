"""Recompute flags of a launch script read as Megatron-LM reads them (autopar.specs.script_recompute).

The shipped Llama-2 7B script (tp 2, pp 4, ``--recompute-granularity full --recompute-method uniform
--recompute-num-layers 1``) with its recompute lines edited. Each refusal was checked with Megatron-LM's
own validate_args / TransformerConfig (``tools/realclients/megatron_check.py``): the message quoted is
the one Megatron raises.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS

from autopar.errors import AutoparError
from autopar.specs.script import read_script

FULL = ("    --recompute-granularity full \\\n    --recompute-method uniform \\\n"
        "    --recompute-num-layers 1 \\\n")


def _script(tmp_path: Path, recompute: str, name: str = "job.sh") -> Path:
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text()
    assert FULL in text
    path = tmp_path / name
    path.write_text(text.replace(FULL, "".join(f"    {flag} \\\n" for flag in recompute.split(";") if flag)))
    return path


def _layout(tmp_path: Path, recompute: str) -> tuple[str, int | None, tuple[str, ...]]:
    lay = read_script(_script(tmp_path, recompute)).layout
    return lay["recompute"], lay["recompute_layers"], lay["recompute_modules"]


def test_recompute_activations_is_selective_whatever_the_granularity(tmp_path):
    """validate_args: ``if args.recompute_activations: args.recompute_granularity = 'selective'`` (the
    script was costed as full recompute: 8.447 s / 12.53 GiB instead of selective's 6.664 s / 19.81 GiB)."""
    assert _layout(tmp_path, "--recompute-activations") == ("selective", None, ("core_attn",))
    assert _layout(tmp_path, "--recompute-granularity full;--recompute-activations") == ("selective", None,
                                                                                          ("core_attn",))
    assert _layout(tmp_path, "--recompute-granularity selective") == ("selective", None, ("core_attn",))


def test_selective_with_a_recompute_method_is_refused(tmp_path):
    with pytest.raises(AutoparError, match=r"--recompute-method=uniform with selective recompute "
                       r"\(--recompute-activations sets .*'recompute method is not yet supported for selective "
                       r"recomputing granularity' \(megatron/training/arguments.py\)"):
        read_script(_script(tmp_path, FULL.replace(" \\\n", ";").replace("    ", "") + "--recompute-activations"))
    with pytest.raises(AutoparError, match="--recompute-method=block with selective recompute: Megatron-LM asserts"):
        _layout(tmp_path, "--recompute-granularity selective;--recompute-method block")


def test_selective_with_a_recompute_layer_count_is_refused(tmp_path):
    with pytest.raises(AutoparError, match=r"--recompute-num-layers=1 with selective recompute: .*"
                       "recompute_num_layers must be None' \\(megatron/core/transformer/transformer_config.py\\)"):
        _layout(tmp_path, "--recompute-granularity selective;--recompute-num-layers 1")


def test_full_recompute_layers_from_the_method(tmp_path):
    assert _layout(tmp_path, "--recompute-granularity full;--recompute-method uniform;--recompute-num-layers 1") == (
        "full", None, ("core_attn",))
    assert _layout(tmp_path, "--recompute-granularity full;--recompute-method block;--recompute-num-layers 3") == (
        "full", 3, ("core_attn",))
    assert _layout(tmp_path, "") == ("none", None, ("core_attn",))


def test_full_without_a_method_is_refused(tmp_path):
    """TransformerConfig raises it; autopar costed full recompute of every layer."""
    with pytest.raises(AutoparError, match=r"--recompute-granularity full without --recompute-method: Megatron-LM "
                       r"raises .*recompute_method must be \"block\" or \"uniform\"' "
                       r"\(megatron/core/transformer/transformer_config.py\)"):
        _layout(tmp_path, "--recompute-granularity full;--recompute-num-layers 1")


def test_full_without_a_layer_count_is_refused(tmp_path):
    with pytest.raises(AutoparError, match="--recompute-granularity full without --recompute-num-layers: Megatron-LM "
                       "raises 'When using recompute_granularity: full recompute_num_layers must be between 1"):
        _layout(tmp_path, "--recompute-granularity full;--recompute-method uniform")


def test_uniform_chunks_of_several_layers_are_refused_not_costed_as_one(tmp_path):
    """uniform N = 4 keeps one input per 4 layers and rebuilds 4 layers at once: a different peak
    from N = 1, which autopar had costed instead (the same 12.53 GiB for N = 1, 2, 4, 8)."""
    with pytest.raises(AutoparError, match=r"--recompute-method uniform --recompute-num-layers 4: not modelled "
                       r"\(Megatron-Core checkpoints chunks of 4 layers.*use --recompute-num-layers 1, or "
                       r"--recompute-method block"):
        _layout(tmp_path, "--recompute-granularity full;--recompute-method uniform;--recompute-num-layers 4")
