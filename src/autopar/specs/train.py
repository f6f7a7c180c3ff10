"""``TrainSpec``: what is trained, independent of how it is parallelised."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.errors import AutoparError
from autopar.specs.cluster import Precision
from autopar.specs.model import ModelSpec

# Megatron-LM ``--recompute-modules`` values (arguments.py; ecosystem.md 1.2), in its order.
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)


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
    tp_comm_overlap: bool = Field(default=False, description="TP collectives overlapped with GEMMs "
                                  "(Megatron --tp-comm-overlap, Transformer Engine userbuffers)")
    tp_backward_overlap: bool = Field(
        default=True,
        description="backward TP collectives of column-parallel linears overlapped with their own "
        "GEMMs without userbuffers (Megatron-LM since 2021-09, on by default: "
        "--no-async-tensor-model-parallel-allreduce turns it off; LinearWithGradAccumulationAndAsyncCommunication): "
        "the input-gradient all-reduce / reduce-scatter runs under the weight-gradient GEMM, the SP input "
        "re-gather under the data-gradient GEMM (autopar.cost.tp_overlap); off for DeepSpeed's Megatron fork "
        "and torchtitan without AsyncTP")
    recompute_modules: tuple[RecomputeModule, ...] = Field(
        default=("core_attn",), min_length=1,
        description="what selective recompute re-runs (Megatron --recompute-modules, default core_attn): "
        "core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts (autopar.cost.recompute); "
        "applies to every layout or stage with recompute 'selective'")
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

    @model_validator(mode="after")
    def _megatron_only_modules(self) -> "TrainSpec":
        """``recompute_modules`` other than Megatron's default is a Megatron-LM option: torchtitan's
        selective recompute is per-op SAC and DeepSpeed checkpoints whole layers."""
        if self.framework != "megatron" and self.recompute_modules != ("core_attn",):
            raise ValueError(f"recompute_modules={','.join(self.recompute_modules)} is a Megatron-LM option; "
                             f"framework {self.framework} recomputes its own way (leave the default core_attn)")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def grad_bytes(self) -> int:
        return 4 if self.grad_dtype == "fp32" else 2


def parse_recompute_modules(text: str, option: str) -> tuple[str, ...]:
    """Megatron's ``--recompute-modules`` value (names separated by spaces or commas) as a tuple.

    Raises:
        AutoparError: no name, or a name outside :data:`RECOMPUTE_MODULES` (``option`` names the
            source in the message).
    """
    names = tuple(dict.fromkeys(text.replace(",", " ").split()))  # in order, duplicates dropped
    unknown = [n for n in names if n not in RECOMPUTE_MODULES]
    if not names or unknown:
        raise AutoparError(f"{option}={text!r}: allowed {', '.join(RECOMPUTE_MODULES)} (one or more)")
    return names


def check_recompute_modules(modules: tuple[str, ...], model: ModelSpec, option: str) -> None:
    """Megatron-LM's rules for ``--recompute-modules`` that depend on the model (ecosystem.md 1.3
    rule 25): ``mla_up_proj`` needs MLA; ``moe_act`` and ``moe`` need MoE layers (``moe_act``
    needs the grouped-GEMM experts every MoE layout here uses); ``shared_experts`` needs shared
    experts.

    Raises:
        AutoparError: a module the model does not have, naming it and the model.
    """
    needs = {"mla_up_proj": (model.mla, "multi-latent attention"), "moe_act": (model.is_moe, "MoE layers"),
             "moe": (model.is_moe, "MoE layers"),
             "shared_experts": (bool(model.shared_expert_ffn_hidden_size), "shared experts")}
    for name in modules:
        has, what = needs.get(name, (True, ""))
        if not has:
            raise AutoparError(f"{option}: {name} needs {what}; model {model.name} has none "
                               f"(allowed here: {', '.join(m for m in RECOMPUTE_MODULES if needs.get(m, (True,))[0])})")
