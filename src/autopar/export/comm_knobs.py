"""Refusals of the communication knobs a target framework has no setting for: TP communication
overlap (``Strategy.tp_comm_overlap``) and the context-parallel algorithm
(``Strategy.cp_comm_type``). Which target writes which (one line each):

* Megatron-LM: ``--tp-comm-overlap`` (TE userbuffers), ``--cp-comm-type`` p2p/a2a/allgather/a2a+p2p
  with ``--hierarchical-context-parallel-sizes`` (:mod:`autopar.export.layout_flags`).
* MindSpeed-LLM: ``--use-ascend-mc2`` (MindSpeed sets ``tp_comm_overlap = False`` itself,
  ``mindspeed/arguments.py``), ``--context-parallel-algo`` megatron_cp_algo / ulysses_cp_algo /
  hybrid_cp_algo with ``--ulysses-degree-in-cp``; no all-gather algorithm.
* torchtitan: ``parallelism.enable_async_tensor_parallel`` with ``compile.enable`` (its
  ``parallelize`` raises without compile); CP is PyTorch's ring only.
* DeepSpeed (Megatron-DeepSpeed), Galvatron, SAPP (MindFormers arrays): neither knob.
"""

from __future__ import annotations

from autopar.errors import AutoparError
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


# What the search offers per target (autopar.space.SpaceOptions): TP overlap, and the CP algorithms.
TP_OVERLAP_TARGETS = frozenset({"megatron", "mindspeed", "torchtitan"})
CP_ALGORITHMS: dict[str, tuple[str, ...]] = {"megatron": ("p2p", "a2a", "allgather", "a2a+p2p"),
                                             "mindspeed": ("p2p", "a2a", "a2a+p2p")}
