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


def _ms_estimate(path: Path):
    from autopar.estimate import estimate
    from autopar.problem import Problem
    from autopar.specs import load_device, make_cluster
    from autopar.specs.script import train_spec

    plan = read_script(path)
    p = Problem(plan.model_spec(), make_cluster(load_device("ascend-910b"), 2, 8), train_spec(plan))
    return plan, estimate(p, plan.strategy(16, plan.model_spec().num_layers))


def test_mindspeed_without_use_flash_attn_runs_unfused_attention(tmp_path):
    """MindSpeed's dot_product_attention_forward_wrapper runs its fused kernel only ``if
    get_args().use_flash_attn``, else Megatron's unfused DotProductAttention: costed as
    --attention-backend unfused (it was costed as fused)."""
    fused, fused_est = _ms_estimate(_llama(tmp_path, "--vocab-size 32000 --use-fused-rmsnorm"))
    path = _llama(tmp_path, "--vocab-size 32000 --use-fused-rmsnorm")
    path.write_text(path.read_text().replace("--use-flash-attn", ""))
    plain, plain_est = _ms_estimate(path)
    assert fused.framework == plain.framework == "mindspeed"
    assert fused.train_fields["flash_attention"] and not plain.train_fields["flash_attention"]
    assert plain_est.step_time_s > fused_est.step_time_s
    megatron = _llama(tmp_path, "--vocab-size 32000")
    megatron.write_text(megatron.read_text().replace("--use-flash-attn", ""))
    assert read_script(megatron).train_fields["flash_attention"]  # Megatron's default backend auto is fused


def test_tp_comm_overlap_in_a_mindspeed_script_is_refused(tmp_path):
    """MindSpeed's validate_args sets tp_comm_overlap = False; the estimate was byte-identical."""
    import pytest

    from autopar.errors import AutoparError

    with pytest.raises(AutoparError, match="--tp-comm-overlap in a MindSpeed-LLM script: MindSpeed switches it off"):
        read_script(_llama(tmp_path, "--vocab-size 32000 --use-fused-rmsnorm --tp-comm-overlap"))
    assert read_script(_llama(tmp_path, "--vocab-size 32000 --tp-comm-overlap")).layout["tp_comm_overlap"]
