#!/bin/bash
# NVIDIA's Qwen3-30B-A3B pre-training recipe on 16 H100 as Megatron-LM flags: Megatron-Bridge
# 25.11 performance summary (tp 1, pp 2, vpp 24, ep 8, mbs 2, gbs 512, seq 4096, FP8 current
# scaling) with scripts/performance/configs/qwen3 of v0.2.0: no recompute, grad_reduce_in_fp32
# False (bf16 main gradients: --grad-reduce-in-bf16), fp8_param_gather (bf16_with_fp8_current_
# scaling_mixed), expert tensor parallel 1, distributed optimizer with fp32 Adam state, no dropout
# (Qwen3MoEModelProvider hidden_dropout = attention_dropout = 0.0).
GPUS_PER_NODE=8
NNODES=2

MODEL_ARGS=(
    --num-layers 48
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 4
    --kv-channels 128
    --qk-layernorm
    --seq-length 4096
    --max-position-embeddings 40960
    --position-embedding-type rope
    --rotary-base 1000000
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --vocab-size 151936
    --attention-dropout 0.0
    --hidden-dropout 0.0
)

MOE_ARGS=(
    --num-experts 128
    --moe-router-topk 8
    --moe-ffn-hidden-size 768
    --moe-aux-loss-coeff 1e-3
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --moe-permute-fusion
    --moe-router-dtype fp32
)

TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 512
    --bf16
    --fp8-format hybrid
    --fp8-recipe tensorwise
    --fp8-param-gather
    --grad-reduce-in-bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 2
    --num-layers-per-virtual-pipeline-stage 1
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} \
    --data-path ./data/my_text_document --tokenizer-type NullTokenizer
