"""Refusals of the communication knobs a target framework has no setting for: TP communication
overlap (``Strategy.tp_comm_overlap``) and the context-parallel algorithm
(``Strategy.cp_comm_type``). Which target writes which (one line each):

* Megatron-LM: ``--tp-comm-overlap`` (TE userbuffers), ``--cp-comm-type`` p2p/a2a/allgather/a2a+p2p
  with ``--hierarchical-context-parallel-sizes`` (:mod:`autopar.export.layout_flags`).
* Megatron-Bridge: ``model.cp_comm_type`` / ``hierarchical_context_parallel_sizes``; TP overlap
  refused (its userbuffers configs are tuned per shape).
* MindSpeed-LLM: ``--use-ascend-mc2`` (MindSpeed sets ``tp_comm_overlap = False`` itself,
  ``mindspeed/arguments.py``), ``--context-parallel-algo`` megatron_cp_algo / ulysses_cp_algo /
  hybrid_cp_algo with ``--ulysses-degree-in-cp``; no all-gather algorithm.
* torchtitan: ``parallelism.enable_async_tensor_parallel`` with ``compile.enable`` (its
  ``parallelize`` raises without compile); CP is PyTorch's ring only.
* DeepSpeed (Megatron-DeepSpeed): Ulysses only (``a2a``, ``--ds-sequence-parallel-size``); no TP overlap.
* Galvatron, SAPP (MindFormers arrays): neither knob.

The MoE token dispatcher and the EP all-to-all overlap (``Strategy.moe_dispatcher``,
``moe_ep_overlap``) are written by Megatron-LM (``--moe-token-dispatcher-type``,
``--moe-flex-dispatcher-backend``, ``--overlap-moe-expert-parallel-comm``) and Megatron-Bridge
(``model.*`` of the same names); every other target refuses anything but the alltoall dispatcher
without overlap (:func:`require_default_moe`). The search offers, where the target writes them,
the flex dispatcher with the backend that fits the cluster (:func:`flex_backend`) and the overlap.
"""

from __future__ import annotations

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.strategy import Strategy


def require_no_tp_overlap(framework: str, s: Strategy, why: str) -> None:
    """Refuse ``s`` with TP communication overlap on a ``framework`` without it.

    Raises:
        AutoparError: ``s.tp_comm_overlap`` is set (``why``: the framework's missing mechanism).
    """
    if s.tp_comm_overlap:
        raise AutoparError(f"{framework} cannot express this layout: TP communication overlap (tp_comm_overlap) ({why}); "
                           "turn it off (--no-tp-comm-overlap)")


def require_cp_algorithms(framework: str, s: Strategy, allowed: tuple[str, ...]) -> None:
    """Refuse a context-parallel algorithm outside ``allowed`` (with cp > 1) on ``framework``.

    Raises:
        AutoparError: ``s.cp_comm_type`` not in ``allowed`` while cp > 1.
    """
    if s.cp > 1 and s.cp_comm_type not in allowed:
        raise AutoparError(f"{framework} cannot express this layout: context parallelism cp_comm_type={s.cp_comm_type} "
                           f"(it runs {', '.join(allowed)}); use --cp-comm-type {allowed[0]}")


def te_a2a_heads_reason(p: Problem, s: Strategy) -> str | None:
    """Why Transformer Engine cannot run the all-to-all of ``s`` (``a2a``/``a2a+p2p``), or None: TE
    ``AttnFuncWithCPAndQKVOA2A`` asserts ``num_heads % cp_size == 0`` for K and V as well as Q
    (``context_parallel.py``); the rule ``cp_a2a_divides_heads`` checks Q, as MindSpeed does."""
    kv_heads, a2a = p.model.num_kv_heads // s.tp, s.cp_a2a_size
    if s.cp > 1 and a2a > 1 and kv_heads % a2a:
        return (f"cp_comm_type={s.cp_comm_type} scatters heads over {a2a} ranks but num_key_value_heads/tp = "
                f"{kv_heads} is not divisible by it (Transformer Engine context_parallel.py requires it for K and V)")
    return None


def require_default_moe(framework: str, s: Strategy, why: str) -> None:
    """Refuse a MoE dispatcher other than alltoall, or the EP overlap, on ``framework``.

    Raises:
        AutoparError: ``s.moe_dispatcher`` is not alltoall or ``s.moe_ep_overlap`` is set (``why``:
            what the framework runs instead).
    """
    if s.moe_dispatcher != "alltoall" or s.moe_ep_overlap:
        raise AutoparError(f"{framework} cannot express this layout: moe_dispatcher={s.moe_dispatcher}, "
                           f"moe_ep_overlap={s.moe_ep_overlap} ({why}); use the alltoall dispatcher without EP "
                           "overlap (--moe-dispatcher alltoall --no-moe-ep-overlap)")


def flex_backend(p: Problem) -> str:
    """The flex dispatcher's backend for ``p``'s cluster: ``hybridep`` where the NVLink domain is
    larger than DeepEP's 8 NVLink peers (an NVL72 rack), else ``deepep``
    (:mod:`autopar.cost.moe_dispatch`)."""
    from autopar.cost.moe_dispatch import DEEPEP_MAX_NVL_PEERS

    return "hybridep" if p.cluster.fast_domain_size > DEEPEP_MAX_NVL_PEERS else "deepep"


# What the search offers per target (autopar.space.SpaceOptions): TP overlap, the CP algorithms, MoE choices.
MOE_CHOICE_TARGETS = frozenset({"megatron", "megatron-bridge"})
TP_OVERLAP_TARGETS = frozenset({"megatron", "mindspeed", "torchtitan"})
CP_ALGORITHMS: dict[str, tuple[str, ...]] = {"megatron": ("p2p", "a2a", "allgather", "a2a+p2p"),
                                             "megatron-bridge": ("p2p", "a2a", "allgather", "a2a+p2p"),
                                             "mindspeed": ("p2p", "a2a", "a2a+p2p"), "deepspeed": ("a2a",)}
FLEX_BACKENDS = ("deepep", "hybridep")


def flex_backends_tie(p: Problem) -> bool:
    """Whether ``deepep`` and ``hybridep`` cost the same on ``p``'s cluster: where the NVLink
    domain holds at most DeepEP's 8 NVLink peers (an 8-GPU H100/H200/B200 node) both forward
    tokens to the same GPUs over NVLink and over the NICs between nodes, which
    :func:`autopar.cost.moe_dispatch.flex_a2a_s` costs at DeepEP's measured fractions (DeepEP
    ``docs/legacy.md``, H800); HybridEP's own published numbers are for NVLink domains beyond a
    node (Megatron-LM's DeepSeek-V3 GB200 guide), which is where autopar costs it differently."""
    from autopar.cost.moe_dispatch import DEEPEP_MAX_NVL_PEERS

    return p.cluster.fast_domain_size <= DEEPEP_MAX_NVL_PEERS


def preferred_flex(p: Problem, target: str) -> tuple[str, str]:
    """(the flex backend the search offers for ``p`` on ``target``, why): the backend the
    target's recipe for the model runs on the device (Megatron-Bridge's MoE recipes,
    :func:`autopar.export.bridge_moe_recipes.layout_fallbacks`: DeepSeek-V3 and Qwen3-30B-A3B run
    ``hybridep``, Qwen3-235B-A22B ``deepep`` on H100) where the two cost the same
    (:func:`flex_backends_tie`), else :func:`flex_backend` (the cheaper where they differ)."""
    if target == "megatron-bridge" and flex_backends_tie(p):
        from autopar.export.bridge_moe_recipes import layout_fallbacks

        recipe = layout_fallbacks(p).get("moe_dispatcher")
        if recipe in FLEX_BACKENDS:
            return recipe, f"the one Megatron-Bridge's {p.model.name} recipe runs on {p.cluster.device.name}"
    backend = flex_backend(p)
    if backend == "deepep":
        return backend, "DeepEP's (HybridEP gains where the NVLink domain spans more than a node)"
    return backend, f"the NVLink domain ({p.cluster.fast_domain_size} GPUs) is larger than DeepEP's 8 NVLink peers"


def flex_tie_note(p: Problem, target: str) -> str | None:
    """One line saying which flex backend the search offered where ``deepep`` and ``hybridep``
    cost the same (:func:`flex_backends_tie`), or None where they do not or the target offers no
    MoE choice."""
    if not (p.model.is_moe and target in MOE_CHOICE_TARGETS and flex_backends_tie(p)):
        return None
    offered, why = preferred_flex(p, target)
    other = next(b for b in FLEX_BACKENDS if b != offered)
    return (f"MoE dispatcher: deepep and hybridep cost the same on {p.cluster.fast_domain_size}-GPU NVLink domains "
            f"(both forward tokens within the node at DeepEP's measured bandwidths); the search offers {offered}, "
            f"{why}. --moe-dispatcher {other} (or alltoall, for a cluster without DeepEP/HybridEP) pins another.")
