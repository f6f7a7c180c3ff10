"""``MoeRuntime``: how Megatron-Core runs a mixture-of-experts layer, beyond the parallel layout.

The layout holds the choices the search makes (``Strategy.moe_dispatcher`` and
``Strategy.moe_ep_overlap``); this spec holds the kernel and routing switches of a run. Each field
is one Megatron-LM argument (``megatron/training/arguments.py`` ``_add_moe_args``, core_v0.15;
``TransformerConfig`` of the same names); costs in :mod:`autopar.cost.moe_dispatch` and
:mod:`autopar.cost.moe`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MoeRuntime(BaseModel):
    """Kernel fusions, overlaps and routing of the MoE layers of one training run.

    ``capacity_factor``: Megatron ``--moe-expert-capacity-factor C`` (None = dropless, Megatron's
    default and its ``-1``); with ``pad_to_capacity`` (``--moe-pad-expert-input-to-capacity``)
    every expert computes ``C`` times its balanced share, without it tokens above ``C`` times the
    share are dropped, so the busiest expert computes ``min(C, skew)`` times it
    (:func:`autopar.cost.moe.token_factor`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    router_fusion: bool = Field(
        default=False, description="fused top-k, score and aux-loss kernels (Megatron --moe-router-fusion; "
        "Transformer Engine fused_topk_with_score_function / fused_compute_score_for_moe_aux_loss)")
    permute_fusion: bool = Field(
        default=True, description="fused token permute/unpermute (Megatron --moe-permute-fusion, which "
        "autopar's Megatron exports write; Transformer Engine moe_permute / moe_unpermute); a script without "
        "the flag runs unfused")
    shared_expert_overlap: bool = Field(
        default=False, description="shared experts computed while the routed tokens are dispatched and "
        "combined (Megatron --moe-shared-expert-overlap)")
    delay_wgrad: bool = Field(
        default=False, description="expert weight gradients delayed to run under the combine all-to-all of "
        "the overlapped micro-batch (Megatron --delay-wgrad-compute; needs the layout's moe_ep_overlap)")
    force_balance: bool = Field(
        default=False, description="routing forced to balance, as NVIDIA's benchmarks run "
        "(Megatron --moe-router-force-load-balancing): the routing skew is 1")
    router_padding_for_fp8: bool = Field(
        default=False, description="the router pads each expert's token count to fp8's alignment "
        "(Megatron --moe-router-padding-for-fp8), so Transformer Engine's Fp8Padding finds the counts aligned "
        "and copies nothing (autopar.cost.moe_fp8_padding)")
    capacity_factor: float | None = Field(
        default=None, gt=0, le=1e3, description="expert capacity over the balanced share "
        "(Megatron --moe-expert-capacity-factor); None = dropless")
    pad_to_capacity: bool = Field(
        default=False, description="experts padded to their full capacity "
        "(Megatron --moe-pad-expert-input-to-capacity)")

    @model_validator(mode="after")
    def _padding_needs_capacity(self) -> "MoeRuntime":
        """Raises ValueError: padding without a capacity factor (Megatron-LM asserts one)."""
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs capacity_factor (Megatron-LM asserts "
                             "--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity)")
        return self
