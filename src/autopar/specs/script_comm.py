"""Launch-script flags of TP communication overlap and the context-parallel algorithm, read into
``Strategy.tp_comm_overlap``, ``cp_comm_type`` and ``cp_a2a`` (costs: :mod:`autopar.cost.tp_overlap`,
:mod:`autopar.cost.cp_comm`).

Megatron-LM (``megatron/training/arguments.py``): ``--tp-comm-overlap`` (asserts
``--sequence-parallel``); ``--cp-comm-type`` one value or one per layer, choices ``p2p`` (default),
``a2a``, ``allgather``, ``a2a+p2p``, the last with ``--hierarchical-context-parallel-sizes A P``
(``A * P = cp``, asserted; A is the all-to-all group).

MindSpeed-LLM (``mindspeed/arguments.py``): ``--tp-comm-overlap`` is switched off
(``args.tp_comm_overlap = False``), so a MindSpeed script that gives it is refused with that reason; its TP overlap is MC2, ``--use-ascend-mc2`` (``--use-mc2`` in
older MindSpeed-LLM scripts), which needs tp > 1 and SP (``features_manager/tensor_parallel/mc2.py``).
``--context-parallel-algo`` ``megatron_cp_algo`` (default; the ring), ``ulysses_cp_algo``
(all-to-all over cp), ``hybrid_cp_algo`` (all-to-all over ``--ulysses-degree-in-cp`` U, ring over
cp / U > 1); the adaptive algorithms are refused (not modelled).
"""

from __future__ import annotations

from typing import Any

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args
from autopar.strategy import CP_COMM_TYPES

# MindSpeed --context-parallel-algo -> Strategy.cp_comm_type.
MINDSPEED_CP_ALGOS = {"megatron_cp_algo": "p2p", "ulysses_cp_algo": "a2a", "hybrid_cp_algo": "a2a+p2p"}
MC2_FLAGS = ("--use-ascend-mc2", "--use-mc2")


def comm_fields(a: Args, framework: str, num_layers: int, layout: dict[str, Any]) -> dict[str, Any]:
    """``tp_comm_overlap``, ``cp_comm_type`` and ``cp_a2a`` of a script (see the module docstring).

    Args:
        framework: ``megatron`` or ``mindspeed`` (the script's dialect).
        num_layers: ``--num-layers`` (positions; a per-layer ``--cp-comm-type`` has one entry each).
        layout: the fields read so far (``tp``, ``cp``, ``sp``).
    Raises:
        AutoparError: ``--tp-comm-overlap`` in a MindSpeed-LLM script (switched off there); TP overlap
            without SP and tp > 1; a ``--cp-comm-type`` value outside Megatron's
            choices, a list of the wrong length or of several algorithms; ``a2a+p2p`` or
            ``hybrid_cp_algo`` without or with inconsistent group sizes; an adaptive MindSpeed algorithm.
    """
    if framework == "mindspeed" and a.has("--tp-comm-overlap"):  # was read and costed as no overlap, silently
        raise AutoparError(f"{a.source}: --tp-comm-overlap in a MindSpeed-LLM script: MindSpeed switches it off "
                           "(mindspeed/arguments.py validate_args: 'if args.tp_comm_overlap: args.tp_comm_overlap = "
                           "False'), so the overlap it asks for never runs; drop it, or use --use-ascend-mc2 "
                           "(MindSpeed's TP overlap on Ascend, modelled)")
    overlap_flags = MC2_FLAGS if framework == "mindspeed" else ("--tp-comm-overlap",)
    given = next((f for f in overlap_flags if a.has(f)), None)
    if given and not (layout["sp"] and layout["tp"] > 1):
        raise AutoparError(f"{a.source}: {given} needs --sequence-parallel with --tensor-model-parallel-size > 1 "
                           f"(got tp={layout['tp']}); {framework} refuses it otherwise")
    cp = layout["cp"]
    if framework == "mindspeed":
        cp_comm_type, a2a = _mindspeed_cp(a, cp)
    else:
        cp_comm_type, a2a = _megatron_cp(a, num_layers, cp)
    return dict(tp_comm_overlap=given is not None, cp_comm_type=cp_comm_type, cp_a2a=a2a)


def _megatron_cp(a: Args, num_layers: int, cp: int) -> tuple[str, int | None]:
    """Megatron-LM's ``--cp-comm-type`` and ``--hierarchical-context-parallel-sizes``."""
    values = (a.text("--cp-comm-type") or "p2p").split()
    if cp > 1 and len(values) not in (1, num_layers):
        raise AutoparError(f"{a.source}: --cp-comm-type={' '.join(values)!r}: {len(values)} values; Megatron-LM "
                           f"takes one value or one per layer ({num_layers} for --num-layers={num_layers})")
    unknown = sorted({v for v in values if v not in CP_COMM_TYPES})
    if unknown:
        raise AutoparError(f"{a.source}: --cp-comm-type={' '.join(values)!r}: {', '.join(unknown)} not allowed; "
                           f"Megatron-LM accepts {', '.join(CP_COMM_TYPES)} (one value, or one per layer)")
    kinds = sorted(set(values))
    if len(kinds) > 1:
        raise AutoparError(f"{a.source}: --cp-comm-type mixes {', '.join(kinds)} across layers; autopar costs one "
                           "algorithm for every layer: give one value")
    kind = kinds[0]
    sizes_text = a.text("--hierarchical-context-parallel-sizes")
    if kind != "a2a+p2p":
        return kind, None
    if sizes_text is None:
        raise AutoparError(f"{a.source}: --cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P "
                           "(Megatron-LM asserts it)")
    words = sizes_text.split()
    if len(words) != 2 or not all(w.isascii() and w.isdigit() and int(w) > 0 for w in words) \
            or int(words[0]) * int(words[1]) != cp:
        raise AutoparError(f"{a.source}: --hierarchical-context-parallel-sizes={sizes_text!r}: give two sizes "
                           f"(all-to-all, p2p) whose product is --context-parallel-size={cp}")
    return kind, int(words[0])


def _mindspeed_cp(a: Args, cp: int) -> tuple[str, int | None]:
    """MindSpeed's ``--context-parallel-algo`` and ``--ulysses-degree-in-cp``."""
    algo = a.text("--context-parallel-algo", "megatron_cp_algo") or ""
    if algo not in MINDSPEED_CP_ALGOS:
        raise AutoparError(f"{a.source}: --context-parallel-algo={algo!r}: autopar models "
                           f"{', '.join(MINDSPEED_CP_ALGOS)} (the adaptive algorithms are not modelled)")
    kind = MINDSPEED_CP_ALGOS[algo]
    if cp == 1 or kind != "a2a+p2p":  # MindSpeed resets ulysses_cp_algo to megatron_cp_algo at cp 1
        return ("p2p" if cp == 1 else kind), None
    degree = a.size("--ulysses-degree-in-cp", None)
    if degree is None or cp % degree or cp // degree < 2:
        raise AutoparError(f"{a.source}: --context-parallel-algo hybrid_cp_algo needs --ulysses-degree-in-cp U "
                           f"dividing --context-parallel-size={cp} with cp/U >= 2 (got {degree}); MindSpeed "
                           "asserts it")
    return kind, degree
