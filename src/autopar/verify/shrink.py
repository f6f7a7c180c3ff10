"""Small runs that predict large ones: the same per-device shapes on fewer devices.

MindSpeed-LLM's auto-tuning verifies a large plan on a small budget ("以小仿大"): fewer layers and
smaller pp/dp, the same tp, cp, ep, etp, mbs and sequence. A run of :func:`shrink`'s layout
reproduces what one device does for one layer of one micro-batch (GEMMs, attention, the TP/CP/EP
collectives inside a node, a stage's activation memory per layer) and the pipeline and data-
parallel machinery on its smaller scale; the costs that grow with the full pp and dp (the
pipeline bubble of pp stages, inter-node point-to-point and data-parallel traffic, ZeRO shards
over dp ranks) come from the model (:meth:`Small.stands_for` says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autopar.errors import AutoparError
from autopar.estimate import Estimate
from autopar.export.layout_flags import stage_layers
from autopar.problem import Problem
from autopar.specs import TrainSpec, make_cluster
from autopar.strategy import Strategy


@dataclass(frozen=True)
class Small:
    """The small run: its problem (fewer layers, devices, sequences per step) and layout."""

    problem: Problem
    strategy: Strategy

    def stands_for(self, p: Problem, e: Estimate) -> dict[str, Any]:
        """The full plan this run stands for and which of its costs the run reproduces."""
        s, small = e.strategy, self.strategy
        zero_note = (f"; ZeRO-{s.zero} shards over {s.dp} ranks (the run's over {small.dp}: its optimizer/"
                     f"gradient memory per device is larger)") if s.zero and s.dp != small.dp else ""
        note = (f"reproduces per-device compute, tp{s.tp}/cp{s.cp}/ep{s.ep} collectives and a stage's memory per "
                f"layer ({self.problem.model.num_layers // small.pp} layers per stage, mbs {s.mbs}, seq "
                f"{p.train.seq_len}); from the model only: "
                f"{f'the bubble of {s.pp} stages (run: {small.pp}), ' if s.pp > small.pp else ''}"
                f"data-parallel gradient traffic over {s.dp} ranks on {p.cluster.num_nodes} nodes (run: {small.dp} "
                f"on {self.problem.cluster.num_nodes}){zero_note}")
        return {"layout": f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} ep{s.ep} on {p.world_size} devices",
                "predicted": {"step_time_s": e.step_time_s, "peak_memory_bytes": e.peak_memory_bytes,
                              "tokens_per_s": e.tokens_per_s_per_device * p.world_size},
                "note": note}


def _candidates(s: Strategy, max_devices: int) -> list[tuple[int, int]]:
    """(pp', dp') with pp' <= pp, dp' <= dp dividing them, tp*cp*pp'*dp' <= max_devices; the
    most pipeline stages first (the bubble and p2p are the hardest to model), then the most dp."""
    inner = s.tp * s.cp
    pairs = [(pp, dp) for pp in range(1, s.pp + 1) if s.pp % pp == 0 for dp in range(1, s.dp + 1)
             if s.dp % dp == 0 and inner * pp * dp <= max_devices and (dp * inner) % (s.ep * s.expert_tp) == 0]
    return sorted(pairs, key=lambda x: (-x[0], -x[1]))


def shrink(p: Problem, s: Strategy, max_devices: int) -> Small:
    """The layout ``s`` of ``p`` on at most ``max_devices`` devices (module docstring).

    Layers per stage stay as in the full plan (its first stage's count), so the model has
    ``layers_per_stage x pp'`` layers; the number of micro-batches per step stays too (global
    batch ``mbs x dp' x num_microbatches``).

    Raises:
        AutoparError: no smaller layout keeps tp x cp (x the expert grid) within ``max_devices``
            (names ``--max-devices``).
    """
    from autopar.rules import check_strategy

    per_stage = stage_layers(p, s)[0]
    m = s.num_microbatches(p.train.global_batch_size)
    for pp, dp in _candidates(s, max_devices):
        layers = per_stage * pp
        model = p.model.model_copy(update={"num_layers": layers, "moe_layers": tuple(
            i for i in p.model.moe_layers if i < layers), "mtp_num_layers": min(p.model.mtp_num_layers, layers)})
        world = s.tp * s.cp * pp * dp
        per_node = min(world, p.cluster.devices_per_node)
        cluster = make_cluster(p.cluster.device, math.ceil(world / per_node), per_node)
        train = TrainSpec(**{**p.train.model_dump(), "global_batch_size": s.mbs * dp * m})
        small_p = Problem(model, cluster, train)
        fields = s.model_dump()
        fields.update(dp=dp, pp=pp, layers_per_stage=None,
                      recompute_per_stage=(s.recompute_per_stage[:pp] if s.recompute_per_stage else None),
                      vpp=s.vpp if pp > 1 else 1, schedule=s.schedule if pp > 1 else "1f1b",
                      account_for_embedding=s.account_for_embedding and pp > 1,
                      account_for_loss=s.account_for_loss and pp > 1)
        try:
            small = Strategy(**fields)
            check_strategy(small_p, small)
        except (AutoparError, ValueError):
            continue
        return Small(small_p, small)
    raise AutoparError(f"--max-devices={max_devices}: layout tp{s.tp} cp{s.cp} ep{s.ep} needs at least "
                       f"{s.tp * s.cp} devices per pipeline stage; allow more devices")
