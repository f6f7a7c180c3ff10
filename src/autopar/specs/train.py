"""``TrainSpec``: what is trained, independent of how it is parallelised."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.specs.cluster import Precision
from autopar.specs.moe_runtime import MoeRuntime
from autopar.specs.userbuffers import TE2_DEFAULTS, Userbuffers

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}  # bytes per element of a stored dtype
# Low-precision recipes of fp8 training (Megatron-LM --fp8-recipe, plus --fp4-recipe nvfp4); costs and
# device support: autopar.cost.fp8_recipe.
Fp8RecipeName = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]
FP8_RECIPES: tuple[str, ...] = get_args(Fp8RecipeName)
# Megatron-LM --cuda-graph-impl / --cuda-graph-scope (core_v0.15 arguments.py); costs: autopar.cost.cuda_graph.
CudaGraphImpl = Literal["none", "local", "transformer_engine"]
CUDA_GRAPH_IMPLS: tuple[str, ...] = get_args(CudaGraphImpl)
CudaGraphScope = Literal["attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration"]
CUDA_GRAPH_SCOPES: tuple[str, ...] = get_args(CudaGraphScope)
#: The scopes that capture parts of MoE layers (meaningless on a dense model).
MOE_CUDA_GRAPH_SCOPES: tuple[str, ...] = ("moe", "moe_router", "moe_preprocess")


def cuda_graph_scope_problem(impl: str, scope: tuple[str, ...]) -> str | None:
    """Why Megatron-LM refuses CUDA-graph implementation ``impl`` with ``scope``, or None: a scope needs
    an implementation; "full_iteration scope is only supported with --cuda-graph-impl=local, other
    scopes are only supported with --cuda-graph-impl=transformer_engine" (core_v0.15 ``--cuda-graph-scope``
    help); ``moe_preprocess`` "must be used together with moe_router" (main ``--cuda-graph-modules``)."""
    names = set(scope)
    if names and impl == "none":
        return "a scope needs an implementation (transformer_engine, or local with full_iteration)"
    if impl == "local" and names - {"full_iteration"}:
        return "Megatron-LM runs per-module scopes only with transformer_engine; local takes full_iteration or no " \
            "scope (whole layers)"
    if impl == "transformer_engine" and "full_iteration" in names:
        return "full_iteration needs the local implementation (Megatron-LM)"
    if "moe_preprocess" in names and "moe_router" not in names:
        return "moe_preprocess must be used together with moe_router (Megatron-LM)"
    return None


class TrainSpec(BaseModel):
    """Batch, sequence and numeric settings of one training job.

    Byte conventions (Megatron-LM mixed precision with Adam, ``theoretical_memory_usage.py``):
    weights in ``precision`` (2 B for bf16/fp16), main gradients in ``grad_dtype`` (fp32 = 4 B,
    Megatron's default ``accumulate_allreduce_grads_in_fp32`` for bf16), optimizer state
    fp32 master weights + Adam m + v (12 B).

    Megatron-LM's precision-aware optimizer (``--use-precision-aware-optimizer``, Transformer
    Engine ``FusedAdam`` with ``master_weight_dtype`` / ``exp_avg_dtype`` / ``exp_avg_sq_dtype``;
    ``megatron/training/arguments.py`` of core_v0.15.0) stores the master weights in
    ``main_params_dtype`` and Adam's moments in ``exp_avg_dtype`` / ``exp_avg_sq_dtype``
    (DeepSeek-V3 technical report, arXiv:2412.19437, sec. 3.3.3: "we adopt the BF16 data format
    instead of FP32 to track the first and second moments in the AdamW optimizer"). Optimizer
    offload (``--optimizer-cpu-offload --optimizer-offload-fraction F``, Megatron-Core
    ``optimizer/cpu_offloading/hybrid_optimizer.py``) keeps the fraction F of this device's
    optimizer shard (master weights + moments) in host memory (:mod:`autopar.cost.offload`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    global_batch_size: int = Field(gt=0, description="sequences per optimizer step (gbs)")
    seq_len: int = Field(gt=0, description="tokens per sequence")
    precision: Precision = "bf16"
    grad_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32", description="main gradients (Megatron --main-grads-dtype, or bf16 with "
        "--grad-reduce-in-bf16 / Megatron-Bridge ddp.grad_reduce_in_fp32=False; fp16 = the fp16 parameters' own "
        "dtype, Megatron's fp16 training without --accumulate-allreduce-grads-in-fp32): bytes per gradient "
        "in memory and on the data-parallel wire")
    main_params_dtype: Literal["fp32", "fp16"] = Field(
        default="fp32", description="optimizer master weights (Megatron --main-params-dtype; "
        "not fp32 needs --use-precision-aware-optimizer)")
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = Field(
        default="fp32", description="Adam first moment (Megatron --exp-avg-dtype)")
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"] = Field(
        default="fp32", description="Adam second moment (Megatron --exp-avg-sq-dtype)")
    optimizer_offload_fraction: float = Field(
        default=0.0, ge=0.0, le=1.0,
        description="share of this device's optimizer shard (master weights + moments) kept and "
        "stepped in host memory (Megatron --optimizer-cpu-offload --optimizer-offload-fraction F; "
        "0 = no offload)")
    optimizer_offload_overlap: bool = Field(
        default=False,
        description="gradient D2H and parameter H2D copies of the offloaded shard overlapped with "
        "each other and the CPU step, parameter by parameter (Megatron --overlap-cpu-optimizer-d2h-h2d)")
    flash_attention: bool = Field(default=True, description="fused attention: no s^2 activations")
    make_vocab_size_divisible_by: int = Field(default=128, gt=0, description="Megatron vocab padding unit (x tp)")
    moe_token_imbalance: float = Field(
        default=1.0, ge=1.0,
        description="routing skew: routed token copies on the busiest expert rank over the balanced share "
        "(1.0 = balanced, as Megatron's theoretical memory); ignored under moe.force_balance, capped by a "
        "dropping moe.capacity_factor, replaced by a padded one (autopar.cost.moe.token_factor); scales MoE "
        "expert activations, GEMMs and all-to-all")
    moe: MoeRuntime = Field(default_factory=MoeRuntime,
                            description="MoE kernel fusions, overlaps, forced balance and capacity (MoeRuntime)")
    fp8_param_storage: bool = Field(
        default=False,
        description="fp8 training keeps linear weights only in fp8 (Megatron --fp8-param-gather) "
        "instead of bf16 weights plus an fp8 copy and its transpose")
    fp8_recipe: Fp8RecipeName | None = Field(
        default=None,
        description="scaling recipe of fp8 training (Megatron --fp8-recipe delayed|tensorwise|blockwise|mxfp8, "
        "--fp4-recipe nvfp4; torchtitan float8 tensorwise, mx mxfp8): device support, scale and weight-copy "
        "memory, quantisation time (autopar.cost.fp8_recipe); only with precision fp8; None = the framework's own "
        "default (effective_fp8_recipe)")
    fp8_bf16_layers: tuple[int, int] | None = Field(
        default=None,
        description="(first, last): decoder layers at the start and end of the model that fp8 training keeps in "
        "bf16 (Megatron-Core first_last_layers_bf16 with num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16; "
        "Megatron-LM --first-last-layers-bf16); only with precision fp8 and a recipe other than delayed; None = "
        "none, or what the target's recipe sets (autopar.search.grid.for_target); costs in "
        "autopar.cost.fp8_bf16_layers")
    cuda_graph_impl: CudaGraphImpl = Field(
        default="none",
        description="CUDA graph capture (Megatron --cuda-graph-impl): 'local' (Megatron's CudaGraphManager; "
        "--enable-cuda-graph) or 'transformer_engine' (TE make_graphed_callables; --external-cuda-graph); host "
        "launch time removed, static buffers added (autopar.cost.cuda_graph)")
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        default=(), max_length=len(CUDA_GRAPH_SCOPES),
        description="what the graphs capture (Megatron --cuda-graph-scope): empty = each whole decoder layer; "
        "full_iteration only with 'local', the others only with 'transformer_engine'")
    activation_offload_layers: int = Field(
        default=0, ge=0, le=100_000,
        description="decoder layers whose saved activations go to host memory in forward and come back for "
        "backward (Megatron-Core cpu_offloading + cpu_offloading_num_layers; Megatron-LM "
        "--cpu-offloading-num-layers on main); needs pp 1 and no recompute (autopar.cost.activation_offload)")
    grad_accumulation_fusion: bool = Field(
        default=True,
        description="weight-gradient GEMMs accumulate into the fp32 main gradients (Megatron-LM's default; "
        "--no-gradient-accumulation-fusion turns it off): off, each weight gradient is written to param.grad and "
        "added into main_grad per micro-batch (autopar.cost.wgrad_accumulation)")
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
    userbuffers: Userbuffers = Field(
        default=TE2_DEFAULTS,
        description="Transformer Engine userbuffers num_sm / set_sm_margin of the overlapped GEMMs under Megatron's "
        "--tp-comm-overlap (autopar.specs.userbuffers): the SMs its communication kernels take from the GEMMs "
        "(autopar.cost.userbuffers_sm); default TE >= 2.0's")
    launch_blocking: bool = Field(
        default=False,
        description="CUDA_LAUNCH_BLOCKING=1: every kernel launch waits for the kernel, so the host's "
        "per-layer dispatch time adds to the GPU time instead of overlapping it "
        "(autopar.cost.framework.launch_blocking_host_s_per_layer)")
    float8_tp_gather: bool = Field(
        default=False,
        description="torchtitan float8 tensorwise training gathers its tensor-parallel activations in fp8 "
        "(torchao Float8ColwiseParallel, autopar.cost.float8_tp): torchtitan's releases of 2024-12 to 2025 did, "
        "when the converter was named 'float8'; 0.2.2, the release autopar exports for, never does (its "
        "parallelize checks '\"float8\" in model.converters', its converter is 'quantize.linear.float8')")
    grad_reduce_once: bool = Field(
        default=False,
        description="ZeRO-0/2/3 keep each stage's full gradient through the micro-batches and reduce it "
        "once per step, after the last backward (torch FSDP no_sync; Galvatron's default async_grad_reduce, set "
        "by --target galvatron): more gradient memory, one unoverlapped reduction (autopar.cost.grad_accumulation)")
    framework: Literal["megatron", "deepspeed", "torchtitan"] = Field(
        default="megatron",
        description="training framework whose documented behaviour differs from Megatron-LM's: "
        "'deepspeed' = DeepSpeed engine: ZeRO-3 all-gathers parameters submodule by submodule, "
        "each gather paying the ring latency over the DP group (autopar.cost.framework); 16-bit "
        "gradients, plus a full fp32 accumulation buffer with bf16 (BF16_Optimizer); 'torchtitan' "
        "= FSDP2 with fp32 sharded parameters, per-op selective AC, fp32 full-vocabulary loss "
        "(autopar.cost.framework_memory)")

    @model_validator(mode="after")
    def _offload_is_megatron(self) -> "TrainSpec":
        """Optimizer dtypes and offload are Megatron-LM features (the other frameworks' optimizers
        are costed as they run, :mod:`autopar.cost.framework_memory`)."""
        if self.framework != "megatron" and (self.optimizer_offload_fraction or self.optimizer_dtypes_set):
            raise ValueError(f"framework={self.framework}: optimizer offload and optimizer dtypes are "
                             "Megatron-LM's (--optimizer-cpu-offload, --use-precision-aware-optimizer)")
        return self

    @model_validator(mode="after")
    def _fp16_grads_need_fp16(self) -> "TrainSpec":
        """fp16 gradients are the parameters' dtype of fp16 training (Megatron-Core
        ``param_and_grad_buffer.py``: ``grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype``)."""
        if self.grad_dtype == "fp16" and self.precision != "fp16":
            raise ValueError(f"grad_dtype=fp16 is fp16 training's own gradient dtype; precision is {self.precision}")
        return self

    @model_validator(mode="after")
    def _recipe_needs_fp8(self) -> "TrainSpec":
        """A recipe other than the default applies to fp8 training only."""
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError(f"fp8_recipe={self.fp8_recipe} applies to precision fp8, not {self.precision}")
        return self

    @model_validator(mode="after")
    def _bf16_layers_need_fp8(self) -> "TrainSpec":
        """bf16 first/last layers are a part of fp8 training, not of delayed scaling: Megatron-Core
        ``TransformerConfig.__post_init__`` raises "Delayed scaling does not support first / last layer in
        BF16"."""
        if self.fp8_bf16_layers is None or self.fp8_bf16_layers == (0, 0):
            return self
        if min(self.fp8_bf16_layers) < 0:
            raise ValueError(f"fp8_bf16_layers={self.fp8_bf16_layers}: layer counts must be >= 0")
        if self.precision != "fp8":
            raise ValueError(f"fp8_bf16_layers={self.fp8_bf16_layers} keeps layers of fp8 training in bf16; "
                             f"precision is {self.precision}")
        if self.effective_fp8_recipe == "delayed":
            raise ValueError("fp8_bf16_layers with the delayed fp8 recipe: Megatron-Core raises 'Delayed scaling "
                             "does not support first / last layer in BF16' (use tensorwise, blockwise, mxfp8 or nvfp4)")
        return self

    @property
    def bf16_end_layers(self) -> tuple[int, int]:
        """(first, last) decoder layers kept in bf16 under fp8 training; (0, 0) when unset or not fp8."""
        if self.precision != "fp8" or self.fp8_bf16_layers is None:
            return (0, 0)
        return self.fp8_bf16_layers

    @model_validator(mode="after")
    def _cuda_graph_scope_fits_impl(self) -> "TrainSpec":
        """Megatron-LM's rule (``--cuda-graph-scope`` help, core_v0.15): "full_iteration scope is only
        supported with --cuda-graph-impl=local, other scopes are only supported with
        --cuda-graph-impl=transformer_engine"; ``moe_preprocess`` needs ``moe_router``; CUDA graphs are
        Megatron-LM's."""
        impl = self.cuda_graph_impl
        if (why := cuda_graph_scope_problem(impl, self.cuda_graph_scope)) is not None:
            raise ValueError(f"cuda_graph_impl={impl} cuda_graph_scope={','.join(self.cuda_graph_scope)}: {why}")
        if self.activation_offload_layers and self.framework != "megatron":
            raise ValueError(f"framework={self.framework}: activation offloading is Megatron-Core's (cpu_offloading)")
        if impl != "none" and self.framework != "megatron":
            raise ValueError(f"framework={self.framework}: CUDA graph capture of training is Megatron-LM's "
                             "(--cuda-graph-impl)")
        return self

    @property
    def effective_fp8_recipe(self) -> str:
        """The fp8 recipe costed and written: ``fp8_recipe``, else the framework's own default -
        Transformer Engine's ``DelayedScaling`` for Megatron-LM / DeepSpeed (Megatron's
        ``--fp8-recipe`` default), torchao's tensorwise dynamic scaling for torchtitan (its
        ``quantize.linear.float8`` default)."""
        if self.fp8_recipe is not None:
            return self.fp8_recipe
        return "tensorwise" if self.framework == "torchtitan" else "delayed"

    @property
    def optimizer_dtypes_set(self) -> bool:
        """Whether any optimizer-state dtype differs from fp32 (needs the precision-aware optimizer)."""
        return (self.main_params_dtype, self.exp_avg_dtype, self.exp_avg_sq_dtype) != ("fp32",) * 3

    @property
    def optimizer_bytes_per_param(self) -> int:
        """Master weight + Adam m + v bytes per parameter before sharding: 12 with fp32, 4 + 2 + 2
        = 8 with DeepSeek-V3's bf16 moments, 2 + 1 + 1 = 4 with fp16 masters and fp8 moments."""
        return DTYPE_BYTES[self.main_params_dtype] + DTYPE_BYTES[self.exp_avg_dtype] + DTYPE_BYTES[self.exp_avg_sq_dtype]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]
