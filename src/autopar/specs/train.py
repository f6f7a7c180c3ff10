"""``TrainSpec``: what is trained, independent of how it is parallelised."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autopar.specs.cluster import Precision


class TrainSpec(BaseModel):
    """Batch, sequence and numeric settings of one training job.

    Byte conventions (Megatron-LM mixed precision with Adam, ``theoretical_memory_usage.py``):
    weights in ``precision`` (2 B for bf16/fp16), main gradients in ``grad_dtype`` (fp32 = 4 B,
    Megatron's default ``accumulate_allreduce_grads_in_fp32`` for bf16), optimizer state
    fp32 master weights + Adam m + v (12 B).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: int = Field(gt=0, description="sequences per optimizer step (gbs)")
    seq_len: int = Field(gt=0, description="tokens per sequence")
    precision: Precision = "bf16"
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    flash_attention: bool = Field(default=True, description="fused attention: no s^2 activations")
    make_vocab_size_divisible_by: int = Field(default=128, gt=0, description="Megatron vocab padding unit (x tp)")
    moe_token_imbalance: float = Field(
        default=1.0, ge=1.0,
        description="routed token copies on the busiest expert rank over the balanced share (1.0 = "
        "balanced dropless routing, as Megatron's theoretical memory; C with "
        "--moe-expert-capacity-factor C and padding); scales MoE expert activations, GEMMs and all-to-all")
    fp8_param_storage: bool = Field(
        default=False,
        description="fp8 training keeps linear weights only in fp8 (Megatron --fp8-param-gather) "
        "instead of bf16 weights plus an fp8 copy and its transpose")
    overlap_grad_reduce: bool = Field(default=True, description="DP gradient reduction and parameter "
                                      "gather overlapped with backward/forward (Megatron --overlap-grad-reduce)")
    tp_backward_overlap: bool = Field(
        default=True,
        description="backward TP collectives of column-parallel linears overlapped with their own "
        "GEMMs without userbuffers (Megatron-LM since 2021-09, on by default: "
        "--no-async-tensor-model-parallel-allreduce turns it off; LinearWithGradAccumulationAndAsyncCommunication): "
        "the input-gradient all-reduce / reduce-scatter runs under the weight-gradient GEMM, the SP input "
        "re-gather under the data-gradient GEMM (autopar.cost.tp_overlap); off for DeepSpeed's Megatron fork "
        "and torchtitan without AsyncTP")
    launch_blocking: bool = Field(
        default=False,
        description="CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the kernel, so the host's "
        "per-layer dispatch time adds to the GPU time instead of overlapping it "
        "(autopar.cost.framework.launch_blocking_host_s_per_layer)")
    framework: Literal["megatron", "deepspeed", "torchtitan"] = Field(
        default="megatron",
        description="training framework whose documented behaviour differs from Megatron-LM's: "
        "'deepspeed' = DeepSpeed engine: ZeRO-3 all-gathers parameters submodule by submodule, "
        "each gather paying the ring latency over the DP group (autopar.cost.framework); 16-bit "
        "gradients, plus a full fp32 accumulation buffer with bf16 (BF16_Optimizer); 'torchtitan' "
        "= FSDP2 with fp32 sharded parameters, per-op selective AC, fp32 full-vocabulary loss "
        "(autopar.cost.framework_memory)")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def grad_bytes(self) -> int:
        return 4 if self.grad_dtype == "fp32" else 2
