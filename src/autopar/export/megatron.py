"""Megatron-LM command-line arguments for a layout (``pretrain_gpt.py`` flags).

Flag names and rules: ``shared/reference/ecosystem.md`` sections 1.2, 1.3 and 1.5 (Megatron-LM
``core_v0.15.0`` / main). The expert TP size is always written out (its default silently
follows tp); uneven pipeline splits use ``--decoder-first/last-pipeline-num-layers``;
interleaving uses ``--num-virtual-stages-per-pipeline-rank`` (the form that works with uneven
splits too); ZeRO-2/3 map to Megatron FSDP sharding strategies.
"""

from __future__ import annotations

from autopar.problem import Problem
from autopar.strategy import Strategy

_FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}


def model_args(p: Problem) -> list[str]:
    """Shape flags of the model (always explicit: Megatron's FFN/kv-channels defaults differ)."""
    m = p.model
    args = [
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
        f"--kv-channels {m.head_dim}",
    ]
    if m.num_kv_heads < m.num_attention_heads and not m.mla:
        args.append(f"--group-query-attention --num-query-groups {m.num_kv_heads}")
    if m.gated_mlp:
        args.append("--swiglu")
    args.append("--normalization " + ("RMSNorm" if m.norm == "rmsnorm" else "LayerNorm"))
    if not m.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not m.linear_bias:
        args.append("--disable-bias-linear")
    if m.qkv_bias and not m.linear_bias:
        args.append("--add-qkv-bias")
    if m.qk_norm:
        args.append("--qk-layernorm")
    args.append("--position-embedding-type " + ("rope" if m.position_embedding == "rope" else "learned_absolute"))
    if m.max_position_embeddings:
        args.append(f"--max-position-embeddings {max(m.max_position_embeddings, p.train.seq_len)}")
    args.append(f"--vocab-size {m.vocab_size} --make-vocab-size-divisible-by {p.train.make_vocab_size_divisible_by}")
    if m.is_moe:
        args.append(f"--num-experts {m.num_experts} --moe-router-topk {m.num_experts_per_tok} "
                    f"--moe-ffn-hidden-size {m.moe_ffn_hidden_size} --moe-grouped-gemm "
                    "--moe-token-dispatcher-type alltoall")
    return args


def parallel_args(p: Problem, s: Strategy) -> list[str]:
    """Parallel layout, batch, recompute and optimizer-sharding flags."""
    args = [
        f"--tensor-model-parallel-size {s.tp}",
        f"--pipeline-model-parallel-size {s.pp}",
        f"--context-parallel-size {s.cp}",
    ]
    if p.model.is_moe:
        args.append(f"--expert-model-parallel-size {s.ep} --expert-tensor-parallel-size {s.expert_tp}")
    if s.sp:
        args.append("--sequence-parallel")
    if s.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {s.vpp}")
    split = s.layers_per_stage
    if split and s.pp > 1 and len(set(split)) > 1:
        args.append(f"--decoder-first-pipeline-num-layers {split[0]} --decoder-last-pipeline-num-layers {split[-1]}")
    args.append(f"--micro-batch-size {s.mbs} --global-batch-size {p.train.global_batch_size}")
    args.append(f"--seq-length {p.train.seq_len}")
    if s.zero == 1:
        args.append("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather")
    elif s.zero >= 2:
        args.append(f"--use-megatron-fsdp --data-parallel-sharding-strategy {_FSDP_STRATEGY[s.zero]} "
                    "--overlap-grad-reduce --overlap-param-gather")
    if s.recompute == "selective":
        args.append("--recompute-granularity selective")
    elif s.recompute == "full":
        method = "block" if s.recompute_layers else "uniform"
        args.append(f"--recompute-granularity full --recompute-method {method} "
                    f"--recompute-num-layers {s.recompute_layers or 1}")
    args.append("--" + p.train.precision if p.train.precision != "fp8" else "--bf16 --fp8-format hybrid")
    if p.train.flash_attention:
        args.append("--attention-backend auto")
    return args


def needs_max_connections_env(p: Problem, s: Strategy) -> bool:
    """Megatron asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when tp > 1 or cp > 1 (pre-Blackwell)."""
    return s.tp > 1 or s.cp > 1


def megatron_args(p: Problem, s: Strategy) -> str:
    """All flags, one per line with shell continuations, ready to paste into a launch script."""
    lines = parallel_args(p, s) + model_args(p)
    body = " \\\n    ".join(lines)
    env = "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" if needs_max_connections_env(p, s) else ""
    return f"{env}    {body}"
