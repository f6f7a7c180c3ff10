"""Launch-script flags of how the MoE layers run: the token dispatcher and the EP overlap (layout
fields ``Strategy.moe_dispatcher`` / ``moe_ep_overlap``), the kernel fusions, shared-expert
overlap, delayed weight gradients, forced balance and the expert capacity (``TrainSpec.moe``,
:class:`~autopar.specs.moe_runtime.MoeRuntime`). Costs: :mod:`autopar.cost.moe_dispatch`,
:func:`autopar.cost.moe.token_factor`.

Megatron-LM (``megatron/training/arguments.py`` ``_add_moe_args``): ``--moe-token-dispatcher-type``
``allgather`` (the default: Megatron-LM main ``megatron/core/transformer/transformer_config.py``
``moe_token_dispatcher_type: Literal['allgather', 'alltoall', 'flex'] = "allgather"``, which the
argument parser takes as its default; MindSpeed-LLM keeps it), ``alltoall`` or ``flex``; ``--moe-flex-dispatcher-backend deepep|hybridep``
(default deepep; the older ``--moe-enable-deepep`` means flex with DeepEP);
``--overlap-moe-expert-parallel-comm``, ``--delay-wgrad-compute``, ``--moe-permute-fusion``,
``--moe-router-fusion``, ``--moe-shared-expert-overlap``, ``--moe-router-force-load-balancing``
(store_true switches); ``--moe-expert-capacity-factor C`` (negative: dropless) with
``--moe-pad-expert-input-to-capacity`` and ``--moe-token-drop-policy probs|position`` (which tokens
drop, not how many).
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args

DISPATCHER_TYPES = ("alltoall", "allgather", "flex")
#: ``--moe-token-dispatcher-type`` when a script does not give it (Megatron-LM's TransformerConfig default).
DEFAULT_DISPATCHER = "allgather"
FLEX_BACKENDS = ("deepep", "hybridep")
DROP_POLICIES = ("probs", "position")


def dispatcher_fields(a: Args) -> dict[str, Any]:
    """``moe_dispatcher`` and ``moe_ep_overlap`` of a script (module docstring).

    Raises:
        AutoparError: a dispatcher type or flex backend outside Megatron's choices, or a flex
            backend with another dispatcher type.
    """
    # Megatron-LM's default is allgather (module docstring); it was read as alltoall
    kind = a.text("--moe-token-dispatcher-type", "flex" if a.has("--moe-enable-deepep") else DEFAULT_DISPATCHER)
    if kind not in DISPATCHER_TYPES:
        raise AutoparError(f"{a.source}: --moe-token-dispatcher-type={kind!r}: allowed {', '.join(DISPATCHER_TYPES)}")
    backend = a.text("--moe-flex-dispatcher-backend", "deepep")
    if backend not in FLEX_BACKENDS:
        raise AutoparError(f"{a.source}: --moe-flex-dispatcher-backend={backend!r}: allowed {', '.join(FLEX_BACKENDS)}")
    if a.has("--moe-flex-dispatcher-backend") and kind != "flex":
        raise AutoparError(f"{a.source}: --moe-flex-dispatcher-backend={backend} with --moe-token-dispatcher-type={kind}: "
                           "the backend applies to the flex dispatcher only")
    return dict(moe_dispatcher=backend if kind == "flex" else kind,
                moe_ep_overlap=a.has("--overlap-moe-expert-parallel-comm"))


def runtime_fields(a: Args, dispatcher: str) -> dict[str, Any]:
    """``TrainSpec.moe`` (a :class:`~autopar.specs.moe_runtime.MoeRuntime` field dict) of a script.

    Raises:
        AutoparError: router padding for fp8 without fp8 (Megatron-LM's TransformerConfig raises),
            padding without a capacity factor, a capacity factor with the flex
            dispatcher (Megatron-Core's ``MoEFlexTokenDispatcher`` is dropless), or a drop policy
            outside ``probs``/``position``.
    """
    fields: dict[str, Any] = dict(
        router_fusion=a.has("--moe-router-fusion"), permute_fusion=a.has("--moe-permute-fusion"),
        shared_expert_overlap=a.has("--moe-shared-expert-overlap"), delay_wgrad=a.has("--delay-wgrad-compute"),
        force_balance=a.has("--moe-router-force-load-balancing"),
        router_padding_for_fp8=a.has("--moe-router-padding-for-fp8"))
    if fields["router_padding_for_fp8"] and not a.has("--fp8-format"):
        raise AutoparError(f"{a.source}: --moe-router-padding-for-fp8 without --fp8-format: Megatron-LM raises "
                           "'fp8 must be specified when moe_router_padding_for_fp8 is True'")
    policy = a.text("--moe-token-drop-policy", "probs")
    if policy not in DROP_POLICIES:
        raise AutoparError(f"{a.source}: --moe-token-drop-policy={policy!r}: allowed {', '.join(DROP_POLICIES)}")
    pad = a.has("--moe-pad-expert-input-to-capacity")
    factor = a.number("--moe-expert-capacity-factor", -1.0)
    if factor < 0:  # Megatron-Core: a negative factor means dropless (TransformerConfig sets None)
        if pad:
            raise AutoparError(f"{a.source}: --moe-pad-expert-input-to-capacity without a --moe-expert-capacity-factor "
                               ">= 0: Megatron-LM asserts a capacity factor")
        return fields
    if dispatcher in FLEX_BACKENDS:
        raise AutoparError(f"{a.source}: --moe-expert-capacity-factor={factor:g} with the flex dispatcher: "
                           "Megatron-Core's flex dispatcher is dropless; use alltoall or allgather")
    if factor == 0:
        raise AutoparError(f"{a.source}: --moe-expert-capacity-factor=0 would drop every token; give a factor > 0 "
                           "or -1 (dropless)")
    return dict(fields, capacity_factor=factor, pad_to_capacity=pad)
