"""Launch-script flags that change how a script's layers map onto autopar's model:
``--noop-layers`` (MindSpeed; ``--cp-comm-type`` is read by :mod:`autopar.specs.script_comm`).

``--noop-layers "61,62,63"`` (MindSpeed ``features_manager`` ``NoopLayersFeature``; ecosystem.md
section 2): ``--num-layers`` counts layer *positions*; the listed positions (0-based, each in
``[0, num_layers)``) are built as ``NoopTransformerLayer``, an identity without parameters, so the
pipeline split runs over the positions and MindSpeed ignores ``--num-layer-list``. DeepSeek-V3's
recipe: ``--num-layers 64 --noop-layers 61,62,63``, pp 8: eight stages of 8 positions, the last
holding 5 real layers. autopar models it as ``num_layers`` = the real layers and, with pp > 1,
``layers_per_stage`` = the real layers in each stage's positions (with virtual pipeline stages a
``pipeline_layout`` of the real layers in each chunk's positions, Megatron's even split of the
positions over pp * vpp chunks); MoE layer indices are renumbered over the real layers. Not
modelled (refused): noop layers with virtual pipeline stages over positions pp * vpp does not
divide, or with the embedding/loss counted in the split.

"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from autopar.errors import AutoparError
from autopar.specs.script_launch import Args


def noop_layers(a: Args, positions: int) -> frozenset[int]:
    """The ``--noop-layers`` positions (empty without the flag).

    Raises:
        AutoparError: an entry that is not a non-negative integer, or outside ``[0, positions)``
            (MindSpeed's own checks), or every position a noop layer.
    """
    if not a.has("--noop-layers"):
        return frozenset()
    text = a.text("--noop-layers") or ""
    words = text.replace(" ", "").split(",")
    if not all(w.isascii() and w.isdigit() for w in words):  # str.isdigit alone passes '³', which int() refuses
        raise AutoparError(f"{a.source}: --noop-layers={text!r}: expected layer indices like 61,62,63")
    noop = frozenset(int(w) for w in words)
    if max(noop) >= positions:
        raise AutoparError(f"{a.source}: --noop-layers={text!r}: each index must be in 0..{positions - 1} "
                           f"(--num-layers={positions})")
    if len(noop) == positions:
        raise AutoparError(f"{a.source}: --noop-layers={text!r} makes every one of the {positions} layers a noop")
    return noop


def apply_noop_layers(a: Args, model: dict[str, Any], layout: dict[str, Any],
                      split: Callable[[Args, int, int], tuple[int, ...] | None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and layout fields with the ``--noop-layers`` positions removed (see the module
    docstring); unchanged without the flag.

    Args:
        a: the training script's arguments.
        model: ModelSpec fields read with ``num_layers`` = ``--num-layers`` (positions).
        layout: Strategy fields read over the positions.
        split: ``stage_split(args, num_layers, pp)`` of :mod:`autopar.specs.script` (explicit
            layers per stage from the first/last-stage flags, or None).
    Returns:
        ``(model, layout)``: ``num_layers`` the real layers, ``moe_layers`` renumbered over them,
        ``layers_per_stage`` the real layers per stage (pp > 1; with vpp > 1 ``pipeline_layout``
            of the real layers per chunk); a full-recompute ``block`` of
        every position of a stage (``--recompute-num-layers`` = positions/pp, which Megatron
        allows) becomes ``recompute_layers=None``, every real layer of the stage.
    Raises:
        AutoparError: noop layers with vpp > 1 over positions pp * vpp does not divide, or with
            the embedding/loss split flags, positions that pp does not divide (Megatron's even
            split), or a stage of noop layers only.
    """
    positions = model["num_layers"]
    noop = noop_layers(a, positions)
    if not noop:
        return model, layout
    pp, vpp = layout["pp"], layout["vpp"]
    why = None
    if vpp > 1 and (positions % (pp * vpp) or split(a, positions, pp) is not None):
        why = (f"with virtual pipeline stages (vpp={vpp}) over {positions} positions that pp*vpp = {pp * vpp} does not "
               "divide evenly (or an uneven first/last split)")
    elif layout["account_for_embedding"] or layout["account_for_loss"]:
        why = "with --account-for-embedding/loss-in-pipeline-split"
    elif layout.get("pipeline_layout"):
        why = "with --pipeline-model-parallel-layout"
    if why:
        raise AutoparError(f"{a.source}: --noop-layers {why} is not modelled by autopar; drop the noop layers "
                           "(give --num-layers the real count)")
    real = [i for i in range(positions) if i not in noop]
    model = dict(model, num_layers=len(real))
    block = layout.get("recompute_layers")
    if block is not None and block == positions // pp:  # every position of each stage: all its real layers
        layout = dict(layout, recompute_layers=None)
    if "moe_layers" in model:
        moe = set(model["moe_layers"])
        model["moe_layers"] = tuple(j for j, i in enumerate(real) if i in moe)
    if pp == 1:
        return model, dict(layout, layers_per_stage=None)
    if vpp > 1:  # chunk v of rank r holds positions [(v*pp + r)*k, (v*pp + r + 1)*k): a flexible layout
        from autopar.pipeline.layout import PipelineLayout

        k = positions // (pp * vpp)
        decoder = np.array([[sum(1 for i in range((v * pp + r) * k, (v * pp + r + 1) * k) if i not in noop)
                             for v in range(vpp)] for r in range(pp)], dtype=np.int64)
        if decoder.sum(axis=1).min() < 1:
            raise AutoparError(f"{a.source}: --noop-layers leaves pipeline stage {int(decoder.sum(axis=1).argmin())} "
                               "without a real layer; autopar costs every stage with >= 1 layer")
        text = PipelineLayout.from_chunks(decoder, model.get("mtp_num_layers", 0)).megatron()
        return model, dict(layout, layers_per_stage=None, pipeline_layout=text)
    stages = split(Args({k: v for k, v in a.values.items() if k != "--num-layer-list"}, a.source), positions, pp)
    if stages is None:
        if positions % pp:
            raise AutoparError(f"{a.source}: --num-layers={positions} (noop layers included) is not divisible by "
                               f"pp={pp}; Megatron splits the layer positions evenly")
        stages = (positions // pp,) * pp
    per_stage, start = [], 0
    for n in stages:
        per_stage.append(sum(1 for i in range(start, start + n) if i not in noop))
        start += n
    if min(per_stage) < 1:
        raise AutoparError(f"{a.source}: --noop-layers leaves pipeline stage {per_stage.index(0)} without a real "
                           f"layer (real layers per stage {','.join(map(str, per_stage))}); autopar costs every "
                           "stage with >= 1 layer")
    return model, dict(layout, layers_per_stage=tuple(per_stage))
