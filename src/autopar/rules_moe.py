"""Validity rules of the MoE layout choices (``Strategy.moe_dispatcher``, ``moe_ep_overlap``) and
the run switches that depend on them (``MoeRuntime``), as Megatron-Core asserts them
(``TransformerConfig.__post_init__`` of core_v0.15: "overlap_moe_expert_parallel_comm is only
supported with expert model parallelism", "... is supported with alltoall/flex token dispatcher",
"disable full recomputation when enabling overlap_moe_expert_parallel_comm",
"virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1",
"Disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm", "disable moe in
recompute_modules ...", "MTP supports at most one layer ...", "overlap_moe_expert_parallel_comm must be
enabled when enabling delay_wgrad_compute"; Megatron-LM main's "moe_shared_expert_overlap only works
with alltoall or flex token dispatcher." with shared experts). Appended
to :data:`autopar.rules.RULES`.
"""

from __future__ import annotations

import numpy as np

from autopar.layout_batch import LayoutBatch


def _rule(name, check, reason):
    """A :class:`autopar.rules.Rule` (imported here: rules.py appends these to its own)."""
    from autopar.rules import Rule

    return Rule(name, check, reason)


def _default_moe(b: LayoutBatch) -> np.ndarray:
    """Where a layout keeps the MoE defaults (alltoall dispatcher, no EP overlap)."""
    return ~b.moe_ep_overlap & b.dispatcher_is("alltoall")


MOE_RULES = (
    _rule("moe_choices_need_experts",
          lambda p, b: _default_moe(b) | (p.model.num_experts > 0),
          lambda p, s: f"moe_dispatcher={s.moe_dispatcher}, moe_ep_overlap={s.moe_ep_overlap}: model "
          f"{p.model.name} has no routed experts (leave the defaults alltoall, off)"),
    _rule("ep_overlap_needs_ep",
          lambda p, b: ~b.moe_ep_overlap | (b.ep > 1),
          lambda p, s: f"moe_ep_overlap (--overlap-moe-expert-parallel-comm) needs ep > 1 (got ep={s.ep}): "
          "Megatron-Core asserts 'overlap_moe_expert_parallel_comm is only supported with expert model parallelism'"),
    _rule("ep_overlap_dispatcher",
          lambda p, b: ~b.moe_ep_overlap | ~b.dispatcher_is("allgather"),
          lambda p, s: "moe_ep_overlap with the allgather dispatcher: Megatron-Core asserts "
          "'overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher'"),
    _rule("ep_overlap_no_full_recompute",
          lambda p, b: ~b.moe_ep_overlap | ((b.recompute != 2) & ~((b.recompute == 1) & b.module_on("moe"))),
          lambda p, s: f"moe_ep_overlap with recompute={s.recompute} ({','.join(s.recompute_modules)}): "
          "Megatron-Core asserts 'disable full recomputation when enabling overlap_moe_expert_parallel_comm' and "
          "no 'moe' in recompute_modules"),
    _rule("ep_overlap_needs_vpp",
          lambda p, b: ~b.moe_ep_overlap | (b.pp == 1) | (b.vpp > 1),
          lambda p, s: f"moe_ep_overlap with pp={s.pp} and vpp={s.vpp}: Megatron-Core asserts "
          "'virtual_pipeline_model_parallel_size must be specified when pipeline_model_parallel_size > 1'"),
    _rule("ep_overlap_not_shared_overlap",
          lambda p, b: ~b.moe_ep_overlap | (not p.train.moe.shared_expert_overlap),
          lambda p, s: "moe_ep_overlap with --moe-shared-expert-overlap: Megatron-Core asserts 'Disable "
          "moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm'"),
    _rule("ep_overlap_mtp",
          lambda p, b: ~b.moe_ep_overlap | (p.model.mtp_num_layers <= 1),
          lambda p, s: f"moe_ep_overlap with {p.model.mtp_num_layers} MTP layers: Megatron-Core asserts 'MTP supports at "
          "most one layer when enabling overlap_moe_expert_parallel_comm'"),
    _rule("shared_overlap_dispatcher",
          lambda p, b: ~b.dispatcher_is("allgather") | (not p.train.moe.shared_expert_overlap)
          | (p.model.shared_expert_ffn_hidden_size == 0),
          lambda p, s: "--moe-shared-expert-overlap with the allgather dispatcher: Megatron-LM main raises "
          "'moe_shared_expert_overlap only works with alltoall or flex token dispatcher.' "
          "(megatron/core/transformer/transformer_config.py); use alltoall or flex"),
    _rule("deepep_needs_tp_ep",
          lambda p, b: ~b.dispatcher_is("deepep") | (b.etp * b.ep > 1),
          lambda p, s: f"moe_dispatcher=deepep with etp={s.etp or s.tp}, ep={s.ep}: Megatron-Core asserts 'DeepEP dispatcher "
          "requires TPxEP > 1' (megatron/core/transformer/moe/token_dispatcher.py); use alltoall at ep 1"),
    _rule("flex_needs_nvidia",
          lambda p, b: ~(b.dispatcher_is("deepep") | b.dispatcher_is("hybridep"))
          | (p.cluster.device.vendor in (None, "nvidia")),
          lambda p, s: f"moe_dispatcher={s.moe_dispatcher} on {p.cluster.device.name}: DeepEP and HybridEP are "
          "NVIDIA kernels (NVSHMEM over NVLink/RDMA); use alltoall or allgather"),
    _rule("delay_wgrad_needs_ep_overlap",
          lambda p, b: b.moe_ep_overlap | (not p.train.moe.delay_wgrad),
          lambda p, s: "--delay-wgrad-compute without moe_ep_overlap (--overlap-moe-expert-parallel-comm): "
          "Megatron-LM asserts the overlap for delayed weight gradients"),
)
