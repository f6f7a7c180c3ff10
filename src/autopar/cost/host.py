"""Host (CPU) launch time of a pipeline stage: eager training can be CPU-bound.

An eager framework (Megatron-Core + Transformer Engine, torchtitan) issues every operator from
Python: the interpreter, the PyTorch dispatcher and the CUDA launch cost the host
``DeviceSpec.host_op_s`` seconds per op. The GPU runs the queued kernels asynchronously, so a
micro-batch's wall time on a stage is ``max(GPU time, host time)``: the host hides behind
large kernels, and small, numerous kernels leave the GPU waiting for launches ("CPU overhead"
or "host boundedness", the main bottleneck of DeepSeek-V3 training on GB200 NVL72 in
Megatron-LM's ``docs/discussions/deepseek-v3-gb200-optimization``, sec. 2). A dropless MoE
layer does not let the host run further ahead: the ``alltoall`` dispatcher copies the token
counts per expert to the host (a device-to-host synchronisation, ``token_dispatcher.py``
``cuda_sync_point``), so the bound holds per micro-batch, not only per step.

``host_op_s`` per device class (TransformerEngine issue #2053, CPU time of one eager
``torch.nn.Linear`` forward): 13.5 us on a DGX H100 (Xeon Platinum 8480C, the x86 default),
37.1 us on the Grace CPU of GB200 (33.2 us on GH200). Megatron-LM / NeMo issue the layer's ops
through Transformer Engine modules and fused functions and Megatron-Core's Python autograd
functions (``--transformer-impl transformer_engine``, the default), whose Python prologue costs
more: the same bf16 Linear forward through ``transformer_engine.pytorch.Linear`` took 99.66 us
on GB200 and 90.53 us on GH200 in that issue, 2.69x and 2.73x the ``torch.nn`` path - the same
ratio on two CPUs, a property of the software stack. With ``TrainSpec.framework='megatron'``
every counted op costs ``host_op_s *`` :data:`TE_OP_HOST_FACTOR` (99.66 / 37.08); torchtitan and
DeepSpeed call PyTorch modules directly and pay ``host_op_s``.

Forward ops per decoder layer, counted from Megatron-Core's modules (one kernel each unless
noted); the backward runs one autograd node per forward op and a second GEMM (weight gradient)
per forward GEMM:

* attention (MHA/GQA, ``attention.py``): input norm, QKV GEMM, q/k/v split, RoPE on q and k,
  core attention, output GEMM, residual add: :data:`ATTENTION_OPS`, the core attention one
  fused kernel, or unfused (``TrainSpec.flash_attention`` off; Megatron/TE
  ``UnfusedDotProductAttention``) ``baddbmm``, fused scale-mask-softmax, dropout when the model
  has it, and ``bmm`` (:func:`core_attention_ops`); MLA
  (``multi_latent_attention.py``) adds the q/kv down GEMMs, their two norms, the up GEMMs'
  splits, the RoPE part split and the q/k concatenations: :data:`MLA_EXTRA_OPS`;
* TP collectives: 2 per block (all-gather + reduce-scatter with SP, 2 all-reduces without);
* dense MLP: norm, fc1, activation, fc2, residual add: :data:`MLP_OPS`;
* MoE block (``moe_layer.py``): norm + residual (2), the router - 72 kernels for DeepSeek-V3's
  sigmoid, group-limited, expert-bias routing with the sequence aux loss before
  ``--moe-router-fusion`` (Megatron-LM GB200 guide sec. 2.1.4, :data:`ROUTER_OPS_DEEPSEEK`),
  :data:`ROUTER_OPS_TOPK` for softmax top-k with the switch aux loss (gate GEMM, softmax, top-k,
  routing-map and probability scatters, 5 aux-loss reductions, the token-count all-reduce, the
  aux-loss scaler and tracker), the fused router's
  :data:`autopar.cost.moe_dispatch.ROUTER_FUSED_HOST_OPS` with ``MoeRuntime.router_fusion``;
  the alltoall dispatcher (token counts, their exchange and device-to-host copy, fused permute,
  all-to-all, local chunk sort, and back: :data:`DISPATCH_OPS`, + all-gather / reduce-scatter
  with ``etp > 1``, + the unfused permutation's ops without ``MoeRuntime.permute_fusion``:
  :data:`autopar.cost.moe_dispatch.PERMUTE_UNFUSED_EXTRA_HOST_OPS`); the experts as TE
  ``GroupedLinear`` (per GEMM group one input split and one module call, whose per-expert
  cuBLAS GEMMs are launched by one C++ call, ``te_general_grouped_gemm``, on multiple streams:
  a few microseconds each, left out; then the activation) - so the host time does not grow with
  the local experts, as the dgxc DeepSeek-V3 GB200 runs show (34.17 s at ep 32 with 8 local
  experts, 34.19 s at ep 64 with 4); shared experts: fc1, activation, fc2 and the add to the
  routed output (:data:`SHARED_EXPERT_OPS`) plus the TP collectives.

Scope: framework Python between ops (``getattr``, config branches, ``torch.empty`` calls
without a kernel; Megatron-LM GB200 guide sec. 2) is not counted, so the host time is a lower
bound. Check against measured eager runs on Grace, where the host sets the pace: DeepSeek-V3 in
NeMo 25.04 (dgxc-benchmarking, 34.2 s per step: about 32 ms per layer and micro-batch) and the
GB200 guide's MXFP8 baseline (494 TFLOP/s: about 34 ms) against about 25 ms counted here; Grok-1
fp8 on GB200 (5.2 s per step: 10.2 ms per layer and micro-batch, an upper bound on its host
time) against 11.5 ms counted - within about 25% either way.
"""

from __future__ import annotations

import numpy as np

from autopar.cost import cuda_graph
from autopar.cost.recompute import separate_norms
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem

ATTENTION_OPS = 8
MLA_EXTRA_OPS = 11
MLP_OPS = 5
TP_OPS_PER_BLOCK = 2
ROUTER_OPS_DEEPSEEK = 72
ROUTER_OPS_TOPK = 24
DISPATCH_OPS = 12
ETP_DISPATCH_OPS = 2
MOE_BLOCK_OPS = 2  # pre-MLP norm, residual add
GROUPED_GEMM_SPLITS = 2  # TE GroupedLinear splits its input once per GEMM group (fc1, fc2)
GROUPED_GEMM_CALLS = 2  # one GroupedLinear call per GEMM group; its per-expert GEMMs come from C++
TE_OP_HOST_FACTOR = 99.66 / 37.08  # TE Linear / torch.nn.Linear forward CPU time, GB200 (TE #2053)
ACTIVATION_OPS = 1
SHARED_EXPERT_OPS = 4
MLA_UP_PROJ_OPS = 8  # q/kv up GEMMs (norms fused), q and kv splits, RoPE on q and k, q and k concatenations


def gemm_launches_by_part(p: Problem, batch: LayoutBatch, moe: bool) -> dict[str, np.ndarray]:
    """Forward GEMM calls of one layer (the GEMMs of :mod:`autopar.cost.flops`) by part: one per
    linear layer, one per GEMM group of the grouped experts (module docstring); ``attn``, ``mlp``
    (the dense MLP or the whole MoE block) and ``router`` (the MoE gate, a share of ``mlp``)."""
    m = p.model
    n = len(batch)
    attention = (3 + (2 if m.q_lora_rank else 1)) if m.mla else 2
    if not moe:
        return {"attn": np.full(n, float(attention)), "mlp": np.full(n, 2.0), "router": np.zeros(n)}
    shared = 2 if m.shared_expert_ffn_hidden_size else 0
    return {"attn": np.full(n, float(attention)), "mlp": np.full(n, 1.0 + GROUPED_GEMM_CALLS + shared),
            "router": np.ones(n)}


def _gemm_launches(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Forward GEMM calls of one layer, all parts (:func:`gemm_launches_by_part`)."""
    parts = gemm_launches_by_part(p, batch, moe)
    return parts["attn"] + parts["mlp"]


def core_attention_ops(p: Problem) -> int:
    """Host ops of one core attention forward: 1 fused kernel, or unfused ``baddbmm`` (QK^T),
    scale-mask-softmax, dropout (when ``ModelSpec.dropout``) and ``bmm`` (probabilities x V) -
    the kernels :func:`autopar.cost.compute.core_attention_times_s` times."""
    if p.train.flash_attention:
        return 1
    return 3 + (1 if p.model.dropout else 0)


def forward_ops_by_part(p: Problem, batch: LayoutBatch, moe: bool) -> dict[str, np.ndarray]:
    """Host ops one decoder layer issues in its forward pass (module docstring), by part: ``attn``
    (norm to residual add, with its TP collectives), ``mlp`` (the dense MLP, or the MoE block) and
    ``router`` (the MoE router's ops, a share of ``mlp``; 0 for a dense layer)."""
    m = p.model
    ones = np.ones(len(batch))
    tp_ops = np.where(batch.tp > 1, TP_OPS_PER_BLOCK, 0)
    attention = ones * (ATTENTION_OPS - 1 + core_attention_ops(p) + (MLA_EXTRA_OPS if m.mla else 0) + tp_ops)
    if not moe:
        return {"attn": attention, "mlp": ones * (MLP_OPS + tp_ops), "router": np.zeros(len(batch))}
    router = ROUTER_OPS_DEEPSEEK if m.router_bias else ROUTER_OPS_TOPK
    return {"attn": attention, "mlp": ones * (MOE_BLOCK_OPS + moe_mlp_ops(p, batch)), "router": ones * router}


def layer_forward_ops(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Host ops one decoder layer issues in its forward pass (module docstring)."""
    parts = forward_ops_by_part(p, batch, moe)
    return parts["attn"] + parts["mlp"]


def moe_mlp_ops(p: Problem, batch: LayoutBatch) -> np.ndarray:
    """Host ops of a MoE block's forward between its norm and its residual add: router,
    dispatcher, grouped experts and shared experts (module docstring)."""
    from autopar.cost import moe_dispatch, moe_expert_bias

    m = p.model
    router = ROUTER_OPS_DEEPSEEK if m.router_bias else ROUTER_OPS_TOPK
    if p.train.moe.router_fusion:
        router = moe_dispatch.ROUTER_FUSED_HOST_OPS
    unfused = np.where(moe_dispatch.permute_passes(p, batch) > 1, moe_dispatch.PERMUTE_UNFUSED_EXTRA_HOST_OPS, 0)
    dispatch = DISPATCH_OPS + unfused + np.where(batch.etp > 1, ETP_DISPATCH_OPS, 0)
    experts = GROUPED_GEMM_SPLITS + GROUPED_GEMM_CALLS + ACTIVATION_OPS + moe_expert_bias.forward_host_ops(p, batch)
    return router + dispatch + experts + _shared_expert_ops(p, batch)


def _shared_expert_ops(p: Problem, batch: LayoutBatch) -> np.ndarray:
    tp_ops = np.where(batch.tp > 1, TP_OPS_PER_BLOCK, 0)
    return (SHARED_EXPERT_OPS + tp_ops) * bool(p.model.shared_expert_ffn_hidden_size)


def selective_ops(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Host ops one layer re-runs under selective recompute with the layout's
    ``recompute_modules`` (:mod:`autopar.cost.recompute`): the forward ops of each re-run
    module, counted as in :func:`layer_forward_ops`; :data:`MLA_UP_PROJ_OPS` for MLA's
    up-projections."""
    m, on = p.model, batch.module_on
    tp_ops = np.where(batch.tp > 1, TP_OPS_PER_BLOCK, 0)
    ops = on("core_attn") * core_attention_ops(p) + on("layernorm") * separate_norms(p, moe)
    ops = ops + on("mla_up_proj") * (MLA_UP_PROJ_OPS if m.mla else 0)
    if not moe:
        return ops + on("mlp") * (MLP_OPS - 1 + tp_ops)  # norm + fc1, activation, fc2
    parts = on("moe_act") * ACTIVATION_OPS + on("shared_experts") * _shared_expert_ops(p, batch)
    return ops + np.where(on("moe"), moe_mlp_ops(p, batch), parts)


def layer_backward_ops(p: Problem, batch: LayoutBatch, moe: bool) -> np.ndarray:
    """Backward host ops: one autograd node per forward op plus a weight-gradient GEMM per
    forward GEMM."""
    return layer_forward_ops(p, batch, moe) + _gemm_launches(p, batch, moe)


def stage_host_s(p: Problem, batch: LayoutBatch, n_dense: np.ndarray, n_moe: np.ndarray,
                 recomputed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward + recompute) host seconds per micro-batch of a stage with ``n_dense``
    dense and ``n_moe`` MoE layers, ``recomputed`` of them recomputed in full (their forward
    ops again, at the stage's mean per layer); selective recompute adds the re-run modules' ops
    (:func:`selective_ops`) per layer. The embedding, output layer and MTP add a few ops and
    are left out."""
    dense_fwd, dense_bwd = cuda_graph.layer_ops(p, forward_ops_by_part(p, batch, False),
                                                gemm_launches_by_part(p, batch, False), moe=False)
    forward = n_dense * dense_fwd
    backward = n_dense * dense_bwd
    if p.model.is_moe:
        moe_fwd, moe_bwd = cuda_graph.layer_ops(p, forward_ops_by_part(p, batch, True),
                                                gemm_launches_by_part(p, batch, True), moe=True)
        forward = forward + n_moe * moe_fwd
        backward = backward + n_moe * moe_bwd
    layers = n_dense + n_moe
    selective = np.where(batch.recompute == 1, n_dense * selective_ops(p, batch, False)
                         + (n_moe * selective_ops(p, batch, True) if p.model.is_moe else 0.0), 0)
    recompute = recomputed * forward / np.maximum(layers, 1) + selective
    return host_op_s(p) * forward, host_op_s(p) * (backward + recompute)


def host_op_s(p: Problem) -> float:
    """Host seconds per counted op: ``DeviceSpec.host_op_s`` (a bare PyTorch module call), times
    :data:`TE_OP_HOST_FACTOR` for Megatron-LM, which issues its ops through Transformer Engine
    (module docstring)."""
    factor = TE_OP_HOST_FACTOR if p.train.framework == "megatron" else 1.0
    return p.cluster.device.host_op_s * factor
