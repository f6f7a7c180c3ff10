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


# What the search offers per target (autopar.space.SpaceOptions): TP overlap, and the CP algorithms.
TP_OVERLAP_TARGETS = frozenset({"megatron", "mindspeed", "torchtitan"})
CP_ALGORITHMS: dict[str, tuple[str, ...]] = {"megatron": ("p2p", "a2a", "allgather", "a2a+p2p"),
                                             "megatron-bridge": ("p2p", "a2a", "allgather", "a2a+p2p"),
                                             "mindspeed": ("p2p", "a2a", "a2a+p2p"), "deepspeed": ("a2a",)}
