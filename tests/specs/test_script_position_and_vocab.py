"""Reading the position embedding and a NullTokenizer's vocabulary as the frameworks do (issue 15)."""

from __future__ import annotations

from pathlib import Path

from conftest import SCRIPTS

from autopar.specs.script import read_script


def _llama(tmp_path: Path, extra: str, rope: bool = True) -> Path:
    """The shipped llama2-7b script (--position-embedding-type rope unless ``rope`` is False) with
    ``extra`` after --bf16."""
    text = (SCRIPTS / "pretrain_llama2_7b.sh").read_text().replace("--bf16\n", f"--bf16 {extra}\n")
    if not rope:
        text = text.replace("--position-embedding-type rope", "")
    path = tmp_path / "job.sh"
    path.write_text(text)
    return path


def test_rotary_flag_wins_over_learned_absolute(tmp_path):
    """Megatron-LM arguments.py validate_args ("Legacy RoPE arguments"): ``if
    args.use_rotary_position_embeddings: args.position_embedding_type = 'rope'``; autopar read learned
    positions (4096 x 4096 embedding parameters more)."""
    both = read_script(_llama(tmp_path, "--position-embedding-type learned_absolute "
                                        "--use-rotary-position-embeddings", rope=False))
    assert both.model_spec(32000).position_embedding == "rope"
    learned = read_script(_llama(tmp_path, "--position-embedding-type learned_absolute", rope=False))
    assert learned.model_spec(32000).position_embedding == "learned"
    assert learned.model_spec(32000).num_params - both.model_spec(32000).num_params == 4096 * 4096


def _null(tmp_path: Path, extra: str = "") -> Path:
    path = _llama(tmp_path, f"--vocab-size 32000 {extra}")
    path.write_text(path.read_text().replace("--tokenizer-type Llama2Tokenizer", "--tokenizer-type NullTokenizer"))
    return path


def test_null_tokenizer_vocabulary_per_framework(tmp_path):
    """Megatron-LM main's NullTokenizer has --vocab-size tokens (null_tokenizer.py, #4057); the
    core_v0.12.1 one MindSpeed-LLM runs has one more, its end-of-document id (tokenizer.py
    ``_NullTokenizer.vocab_size``: ``self._vocab_size_without_eod + 1``)."""
    megatron = read_script(_null(tmp_path))
    assert megatron.framework == "megatron" and megatron.model_spec().vocab_size == 32000
    mindspeed = read_script(_null(tmp_path, "--use-fused-rmsnorm"))
    assert mindspeed.framework == "mindspeed" and mindspeed.model_spec().vocab_size == 32001
    other = read_script(_llama(tmp_path, "--vocab-size 32000 --use-fused-rmsnorm"))
    assert other.model_spec().vocab_size == 32000
