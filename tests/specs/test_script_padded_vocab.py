"""``--padded-vocab-size`` is the embedding and output-layer size (Megatron-LM and MindSpeed-LLM
``build_tokenizer`` pad the vocabulary only when it is absent; GPTModel takes
``args.padded_vocab_size``): a MindSpeed-LLM script with 65536 was costed as its 32000 tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCRIPTS

from autopar.errors import AutoparError
from autopar.specs.script import read_script


def _script(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "job.sh"  # tp 2; --use-fused-rmsnorm makes it a MindSpeed-LLM script
    path.write_text((SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace(
        "--bf16\n", f"--bf16 --vocab-size 32000 --use-fused-rmsnorm {extra}\n"))
    return path


def test_padded_vocab_size_is_the_embedding_size(tmp_path):
    plan = read_script(_script(tmp_path, "--padded-vocab-size 65536"))
    base = read_script(_script(tmp_path, ""))
    assert plan.framework == "mindspeed" and plan.model_fields["vocab_size"] == 65536
    assert plan.train_fields["make_vocab_size_divisible_by"] == 1  # no further padding
    # untied embedding and output layer: 2 x (65536 - 32000) x 4096 = 274,726,912 more parameters
    assert plan.model_spec().num_params - base.model_spec().num_params == 274_726_912


def test_padded_vocab_size_megatron_cannot_build_is_refused(tmp_path):
    with pytest.raises(AutoparError, match="--padded-vocab-size=32001 is not divisible by "
                       "--tensor-model-parallel-size=2: Megatron-Core's VocabParallelEmbedding asserts"):
        read_script(_script(tmp_path, "--padded-vocab-size 32001"))
    with pytest.raises(AutoparError, match="--padded-vocab-size=30000 is below the vocabulary size 32000"):
        read_script(_script(tmp_path, "--padded-vocab-size 30000"))


def test_vocab_size_option_other_than_the_padded_size_is_refused(tmp_path):
    """``--vocab-size`` replaced the script's padded size without a word (8.924 s became 8.447 s)."""
    plan = read_script(_script(tmp_path, "--padded-vocab-size 65536"))
    with pytest.raises(AutoparError, match=r"--vocab-size=32000 conflicts with job.sh: --padded-vocab-size 65536 "
                       r"\(Megatron builds"):
        plan.model_spec(32000)
    assert plan.model_spec(65536).vocab_size == 65536  # the same size is no conflict
