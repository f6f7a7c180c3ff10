"""autopar's classification of the framework flags its script reader does not read.

``classify(flag, groups)`` -> ``(class, reason, only)``: first a flag's own rule, then the rule of
the parser group that adds it (Megatron's ``_add_*_args`` function, a MindSpeed feature file),
else ``refused`` (an unclassified flag is never silently accepted).
"""

from __future__ import annotations

# Flags accepted with these values only (the one autopar costs).
ONLY = {
    "--optimizer": (("adam",), "Adam's two fp32 moments are the optimizer state autopar costs"),
    "--distributed-backend": (("nccl", "hccl", "gloo"), "process-group backend"),
}

FUSION = ("a fused kernel: its speed is within the calibrated device efficiency and it keeps no extra "
          "activations autopar counts")
DP_OVERLAP = ("autopar costs the data-parallel gradient reduce and parameter gather overlapped with "
              "compute, as Megatron's recipes run them (TrainSpec.overlap_grad_reduce)")
BOOKKEEPING = "loss scaling / scaling-factor bookkeeping: no memory or time autopar counts"
ROPE = "a rotary-embedding variant: no parameters, elementwise work autopar does not count separately"
HOST = "process, communicator or allocator setup: no effect on the planned memory or step time"
NUMERICS = "changes numerics only, not memory or step time"
MOE_ROUTING = "router loss or routing detail: the router's memory and time are costed the same"

NO_EFFECT_FLAGS: dict[str, tuple[str, ...]] = {
    "the attention softmax computed in fp32: fused attention kernels (flash, cuDNN) already do, and the unfused "
    "path (Megatron FusedScaleMaskSoftmax) casts the probabilities back to the 16-bit dtype it keeps, so the "
    "stored activations and GEMMs are unchanged": ("--attention-softmax-in-fp32",),
    "eager training steps before the CUDA graphs are captured: the steady-state step autopar costs is "
    "the same": ("--cuda-graph-warmup-steps",),
    FUSION: ("--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
             "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-persist-layer-norm",
             "--no-gradient-accumulation-fusion", "--use-fused-weighted-squared-relu", "--use-te-activation-func",
             "--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm",
             "--no-gradient-reduce-div-fusion", "--use-fused-swiglu", "--use-fused-rotary-pos-emb",
             "--use-fusion-attn-v2", "--use-fused-ring-attention-update",
             "--gemm-gradient-accumulation-fusion", "--use-fused-moe-token-permute-and-unpermute", "--jit-compile",
             "--use-triton-swiglu-limit"),
    DP_OVERLAP: ("--overlap-grad-reduce", "--overlap-param-gather", "--overlap-param-gather-with-optimizer-step",
                 "--ddp-num-buckets", "--ddp-bucket-size", "--ddp-pad-buckets-for-high-nccl-busbw",
                 "--ddp-average-in-collective", "--param-and-grad-buffer-pad", "--reset-bucket-group-order"),
    BOOKKEEPING: ("--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis",
                  "--fp8-margin", "--fp8-interval", "--fp8-amax-history-len", "--fp8-amax-compute-algo"),
    ROPE: ("--rotary-percent", "--rotary-interleaved", "--rotary-seq-len-interpolation-factor", "--use-rope-scaling",
           "--rope-scaling-factor", "--no-rope-freq", "--mrope-section", "--rotary-scaling-factor", "--mscale",
           "--mscale-all-dim", "--rope-scaling-type", "--original-max-position-embeddings", "--beta-fast",
           "--beta-slow", "--rope-scaling-mscale", "--rope-scaling-mscale-all-dim",
           "--rope-scaling-original-max-position-embeddings", "--longrope-freqs-type", "--low-freq-factor",
           "--high-freq-factor", "--long-factor", "--short-factor", "--long-mscale", "--short-mscale",
           "--dynamic-factor", "--use-glm-rope", "--rope-scaling-beta-fast", "--rope-scaling-beta-slow",
           "--yarn-scaling-factor", "--rope-theta", "--rope-factor", "--rope-type"),
    HOST: ("--distributed-timeout-minutes", "--distributed-timeout-seconds-after-init", "--local-rank",
           "--lazy-mpu-init", "--use-ring-exchange-p2p", "--init-model-with-meta-device", "--use-cpu-initialization",
           "--disable-gloo-process-groups", "--disable-gloo-group", "--high-priority-stream-groups",
           "--pipeline-model-parallel-comm-backend", "--nccl-communicator-config-path",
           "--disable-symmetric-registration", "--manual-gc", "--manual-gc-interval", "--no-manual-gc-eval",
           "--empty-unused-memory-level", "--use-mcore-models", "--enable-experimental", "--te-rng-tracker",
           "--inference-rng-tracker", "--dataloader-type", "--train-sync-interval", "--ai-framework",
           "--enable-share-memory", "--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port",
           "--hccl-op-mode", "--hccl-group-buffer", "--hccl-group-buffer-adaptive",
           "--hccl-ep-group-buffer-adaptive-factor", "--op-cal-tflops", "--async-log-allreduce", "--no-shared-storage",
           "--check-weight-hash-across-dp-replicas-interval", "--load-checkpoint-loosely", "--cache-mla-latents"),
    NUMERICS: ("--apply-query-key-layer-scaling", "--disable-bf16-reduced-precision-matmul", "--apply-layernorm-1p",
               "--openai-gelu", "--onnx-safe", "--activation-func-clamp-value", "--glu-linear-offset",
               "--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss",
               "--check-for-large-grads", "--calculate-per-token-loss", "--no-clone-scatter-output-in-embedding",
               "--mtp-loss-scaling-factor", "--bert-no-binary-head", "--apply-residual-connection-post-layernorm",
               "--embedding-multiplier-scale", "--output-multiplier-scale", "--scale-emb", "--dim-model-base",
               "--scale-depth", "--input-jitter", "--swiglu-limit", "--add-rmsnorm-offset", "--query-pre-attn-scalar",
               "--output-logit-softcapping", "--attn-logit-softcapping", "--fill-neg-inf", "--square-alibi-mask",
               "--alibi-diagonal-opposite", "--relative-attention-num-buckets",
               "--relative-attention-max-distance", "--moe-use-upcycling", "--moe-upcycling-granularity",
               "--sgd-momentum", "--apply-wd-to-qk-layernorm", "--use-deter-comp", "--skip-bias-add",
               "--squared-relu", "--gelu-tanh"),
    MOE_ROUTING: ("--moe-router-load-balancing-type", "--moe-router-dtype", "--moe-router-pre-softmax",
                  "--moe-router-bias-update-rate", "--moe-router-padding-for-fp8", "--moe-z-loss-coeff",
                  "--moe-input-jitter-eps", "--moe-per-layer-logging", "--moe-apply-probs-on-input",
                  "--norm-topk-prob", "--seq-aux",
                  "--moe-device-level-aux-loss-coeff", "--moe-comm-aux-loss-coeff", "--router-gating-in-fp32",
                  "--moe-revert-type-after-topk", "--topk-softmax-in-fp32", "--use-global-aux-loss",
                  "--routed-scaling-factor", "--n-group", "--topk-group", "--noisy-gate-policy", "--no-use-rts",
                  "--moe-use-sinkhorn", "--print-expert-load", "--moe-pad-experts-for-cuda-graph-inference"),
    "ramp-up of the global batch: autopar plans the final --global-batch-size": ("--rampup-batch-size",),
    "a step-time measurement or profiling switch": (
        "--profile", "--profile-step-start", "--profile-step-end", "--profile-ranks", "--use-pytorch-profiler",
        "--record-memory-history", "--memory-snapshot-path", "--iterations-to-skip",
        "--result-rejected-tracker-filename"),
    "the fused (flash) attention autopar costs unless --attention-backend says unfused/local": ("--use-flash-attn",),
    "the training length, exit and evaluation schedule": (
        "--train-iters", "--train-samples", "--log-interval", "--exit-interval", "--exit-duration-in-mins",
        "--exit-signal-handler", "--tensorboard-dir", "--variable-seq-lengths"),
    "replication of checkpoints across ranks": ("--replication", "--replication-jump", "--replication-factor"),
}

UNMODELLED = "changes memory or step time in a way autopar does not model"
REFUSED_FLAGS: dict[str, tuple[str, ...]] = {
    "MindSpeed's older MLA flag names are not read; use Megatron-LM's --multi-latent-attention, "
    "--qk-head-dim and --qk-pos-emb-head-dim": ("--multi-head-latent-attention", "--qk-rope-head-dim",
                                               "--qk-nope-head-dim"),
    "Ascend MC2 for the MoE all-to-all or batched matmul is not modelled (the TP MC2 of --use-ascend-mc2 "
    "is)": ("--moe-alltoall-mc2", "--moe-bmm-mc2"),
    "TP communication overlap is read from --tp-comm-overlap alone; its tuning and per-GEMM switches are "
    "not modelled": (
        "--tp-comm-overlap-cfg", "--disable-tp-comm-overlap-ag", "--disable-tp-comm-overlap-rs",
        "--tp-comm-overlap-rs-dgrad", "--disable-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad",
        "--tp-comm-bootstrap-backend", "--disable-tp-comm-split-ag", "--disable-tp-comm-split-rs",
        "--enable-overlap-ag-with-matmul", "--enable-overlap-matmul-with-rs", "--enable-backward-overlap-ag-with-matmul"),
    "the backward TP all-reduce then runs exposed; autopar costs it overlapped (Megatron's default)": (
        "--no-async-tensor-model-parallel-allreduce",),
    "a deprecated alias Megatron-LM no longer reads the same way; use the flag it was renamed to "
    "(--micro-batch-size, --tensor-model-parallel-size, --recompute-activations, --seq-length, --num-layers, "
    "--position-embedding-type none)": (
        "--batch-size", "--model-parallel-size", "--checkpoint-activations", "--encoder-seq-length",
        "--decoder-seq-length", "--encoder-num-layers", "--decoder-num-layers", "--no-position-embedding",
        "--warmup"),
    "it changes the global batch at run time": ("--decrease-batch-size-if-needed",),
    "deterministic kernels (some fused attention and reduction kernels disabled) are slower than the ones "
    "autopar costs": ("--deterministic-mode", "--npu-deterministic"),
    "MindSpeed's sliding-window flags are not read; use Megatron-LM's --window-size": (
        "--sliding-window", "--interleave-sliding-window", "--sliding-window-size"),
    "MindSpeed's fp32-parameter reuse (a memory saving of mixed-precision training) is not modelled": (
        "--reuse-fp32-param",),
    "activation memory under full recompute with TP (split saved inputs) is not modelled":
        ("--distribute-saved-activations",),
    "the pipeline's point-to-point traffic then changes (no overlap, no scatter/gather, or a changed "
    "interleaving group), which autopar does not model": (
        "--no-overlap-p2p-communication", "--overlap-p2p-communication-warmup-flush",
        "--microbatch-group-size-per-virtual-pipeline-stage", "--no-scatter-gather-tensors-in-pipeline",
        "--no-align-grad-reduce", "--no-align-param-gather", "--optimize-send-recv-comm",
        "--optimize-vpp-send-recv-comm"),
    "deferred or delayed weight-gradient computation is not modelled": (
        "--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "--dualpipev-dw-detach"),
    "in-network or user-buffer collectives change the collective bandwidth autopar costs": (
        "--use-nccl-ub", "--use-sharp", "--sharp-enabled-group", "--hccl-slice-size"),
    "sharded-data-parallel variants other than ZeRO 0-3 / FSDP full sharding are not modelled": (
        "--fsdp-double-buffer", "--suggested-communication-unit-size", "--enable-full-sharding-in-hsdp",
        "--num-distributed-optimizer-instances", "--torch-fsdp2-no-reshard-after-forward", "--fsdp2-config-path",
        "--layerzero", "--layerzero-config", "--enable-zero3", "--distributed-optimizer-no-replica"),
    "fp8 weight-transpose caching, fp8 wgrad off and fp8 weight-buffer reuse are not modelled": (
        "--keep-fp8-transpose-cache", "--no-fp8-wgrad", "--reuse-grad-buf-for-mxfp8-param-ag", "--fp8-reuse-quantized-weight",
        "--no-use-gmm-fp8", "--te-gmm-mode", "--te-comparison-with-cpu", "--te-comparison-with-bf16"),
    "FP4 parameter storage (weights kept only in NVFP4) is not modelled": ("--fp4-param-gather",),
    "context-parallel variants beyond --cp-comm-type / --context-parallel-algo are not modelled": (
        "--cp-window-size",
        "--use-cp-send-recv-overlap", "--megatron-cp-in-bnsd", "--kv-head-repeat-before-uly-alltoall",
        "--adaptive-cp-without-coarse", "--adaptive-cp-dynamic-attn-mask", "--adaptive-cp-only-reschedule",
        "--adaptive-cp-manually-set-mask-list", "--context-parallel-kv-cache-policy",
        "--context-parallel-cache-interval", "--use-ulysses-allgather-kv", "--cp-attention-mask-type",
        "--attention-mask-type", "--attention-mask-on-cpu"),
    "rank placement other than Megatron's tp-cp-ep-dp-pp order changes which groups share a node": (
        "--use-tp-pp-dp-mapping",),
    "fp32 residuals, fp32 norms or fp16 logits change activation memory autopar counts in the training dtype": (
        "--fp32-residual-connection", "--fp16-lm-cross-entropy",
        "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "--input-layernorm-in-fp32",
        "--rmsnorm-weight-in-fp32", "--init-norm-weight-in-fp32"),
    "a gated activation other than --swiglu changes the FFN autopar builds": ("--quick-geglu", "--geglu"),
    "MoE expert-TP extension, DeepEP SM counts and MoE layer recompute variants are not modelled": (
        "--moe-extended-tp", "--moe-deepep-num-sms", "--moe-layer-recompute"),
    "the optimizer-offload variant changes the host step autopar costs": (
        "--use-torch-optimizer-for-cpu-offload", "--no-pin-cpu-grads", "--no-pin-cpu-params"),
    # MindSpeed's memory group (mindspeed/arguments.py, commit 028de58): each with what it does.
    "it swaps the attention modules' activations (--swap-modules) to host memory and prefetches them back; "
    "autopar models neither the host copies nor their overlap": ("--swap-attention",),
    "it recomputes the MLP activation function outside Megatron's recompute granularity (with its own layer "
    "count); autopar's selective recompute follows Megatron's --recompute-modules": (
        "--recompute-activation-function",),
    "it recomputes the norms outside Megatron's recompute granularity (with its own layer count); use "
    "Megatron's --recompute-granularity selective --recompute-modules layernorm": ("--recompute-norm",),
    "it moves recompute into the pipeline bubble; autopar's schedule simulation has no such op": (
        "--recompute-in-bubble",),
    "it moves recompute ahead of the backward pass; not in autopar's schedule simulation": (
        "--recompute-in-advance",),
    "it chooses swap/recompute per module at run time; not predictable ahead": ("--adaptive-memory-optimization",),
    "legacy (non-Core) models or a custom layer spec change the layers autopar builds": (
        "--use-legacy-models", "--spec", "--yaml-cfg"),
}

GROUP_NO_EFFECT = {
    "_add_logging_args": "logging", "_add_checkpointing_args": "checkpoint I/O between steps",
    "_add_tokenizer_args": "tokenizer (the vocabulary size is read from --vocab-size or the tokenizer files)",
    "_add_validation_args": "evaluation between training steps", "_add_autoresume_args": "job auto-resume",
    "_add_one_logger_args": "logging", "_add_config_logger_args": "logging", "_add_ft_package_args": "fault tolerance",
    "_add_straggler_detector_args": "straggler detection", "_add_workload_inspector_server_args": "monitoring",
    "_add_inprocess_restart_args": "fault tolerance", "_add_rerun_machine_args": "fault tolerance",
    "_add_msc_args": "checkpoint storage", "_add_initialization_args": "seeds and weight initialisation",
    "_add_learning_rate_args": "learning-rate and weight-decay schedule",
    "_add_regularization_args": "optimizer hyper-parameters", "_add_data_args": "data loading",
    "_add_inference_args": "inference / generation, not the training step",
    "_add_sft_args": "fine-tuning data format", "_add_profile_args": "profiling",
    "mindspeed/arguments:_add_data_args": "tokenizer",
    "dataset/": "data loading and preprocessing", "tokenizer/": "tokenizer", "convert_checkpoint/": "checkpoint conversion",
    "evaluation/": "evaluation", "inference/": "inference / generation, not the training step",
    "functional/": "profiling and data dumps", "high_availability/": "fault tolerance", "ttp/": "fault tolerance",
    "qos/": "network quality-of-service settings", "_add_auto_settings_args": "MindSpeed's auto-tuning launcher",
    "finetune/finetune": "fine-tuning data format",
}
GROUP_REFUSED = {
    "_add_biencoder_args": "BERT biencoder / ICT models are not modelled",
    "_add_vision_args": "vision models are not modelled", "_add_retro_args": "RETRO is not modelled",
    "_add_rl_args": "RL training (generation plus training) is not modelled",
    "_add_heterogeneous_args": "heterogeneous layer configurations are not modelled",
    "_add_kitchen_quantization_arguments": "quantization recipes are not modelled",
    "_add_experimental_args": "Mamba / hybrid models are not modelled",
    "models/mamba": "Mamba models are not modelled",
    "finetune/lora": "LoRA changes the trained parameters and optimizer state autopar counts",
    "finetune/lu_lora": "LoRA changes the trained parameters and optimizer state autopar counts",
    "dpo/": "DPO runs a reference model beside the trained one",
    "qat/": "quantization-aware training is not modelled", "qad/": "quantization-aware distillation is not modelled",
    "optimizer/muon": "the Muon optimizer's state and Newton-Schulz steps are not modelled",
    "optimizer/low_precision": "quantized optimizer state is not modelled",
    "optimizer/swap_optimizer": "optimizer-state swapping is not modelled",
    "optimizer/virtual_optimizer": "optimizer-state swapping is not modelled",
    "compress": "activation / optimizer compression is not modelled",
    "memory/": "activation swapping or chunked loss memory is not modelled",
    "moe/": "this MoE variant (placement, balancing, overlap, zero experts) is not modelled",
    "mindspeed/arguments:_add_moe_args": "this MindSpeed MoE variant is not modelled",
    "_add_2d_tp_args": "2-D tensor parallelism is not modelled", "_add_ndmm_args": "N-D matmul parallelism is not modelled",
    "_add_coc_args": "Ascend compute-communication overlap (MC2 / CoC) is not modelled",
    "_add_automated_pipeline_args": "MindSpeed's automated pipeline search is not modelled",
    "_add_alibi_args": "ALiBi attention masks are not modelled", "alibi_feature": "ALiBi attention masks are not modelled",
    "multi_latent_attention/": "this MLA / sparse-attention variant is not modelled",
    "experimental_attention_variant/": "sparse attention is not modelled",
    "qwen3_next": "linear (gated delta-net) attention is not modelled",
    "mhc_feature": "hyper-connections are not modelled",
    "pipeline_parallel/": "this pipeline variant (DualPipeV, unaligned stages, a layout string) is not modelled",
    "tensor_parallel/": "unaligned tensor-parallel linears are not modelled",
    "dist_train": "disaggregated training is not modelled",
    "layerwise_disaggregated": "disaggregated training is not modelled",
    "mindspeed/arguments:_add_training_args": "this MindSpeed memory or schedule optimisation is not modelled",
    "mindspeed/arguments:_add_distributed_args": "this MindSpeed pipeline/expert variant is not modelled",
    "mindspeed/arguments:_add_cp_args": "this context-parallel variant is not modelled",
}


def classify(flag: str, groups: list[str]) -> tuple[str, str, tuple[str, ...] | None]:
    """``(class, reason, only)`` of a flag the reader does not read (module docstring)."""
    if flag in ONLY:
        values, reason = ONLY[flag]
        return "no_effect", reason, values
    for reason, flags in NO_EFFECT_FLAGS.items():
        if flag in flags:
            return "no_effect", reason, None
    for reason, flags in REFUSED_FLAGS.items():
        if flag in flags:
            return "refused", reason, None
    for rules, cls in ((GROUP_NO_EFFECT, "no_effect"), (GROUP_REFUSED, "refused")):
        for key, reason in rules.items():
            if any(g.endswith(key) or f"/{key}" in g or f":{key}" in g or key in g for g in groups):
                return cls, reason + (": no effect on memory or step time" if cls == "no_effect" else ""), None
    return "refused", UNMODELLED, None
