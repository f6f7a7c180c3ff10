"""Costs per layer kind and per chunk: the input of the chunk balancer (:mod:`autopar.pipeline.chunk_ilp`).

A :class:`~autopar.pipeline.layers.LayerTable` has one row per decoder layer. Real models have a
few runs of identical layers (Llama: one run; DeepSeek-V3: 3 dense layers, then 58 MoE layers),
so a chunk's cost is fixed by how many layers of each run (*kind*) it holds and with which
recompute option each is run: integer counts, as SAPP-PPB states its problem (MindSpore
hyper_parallel ``auto_parallel/sapp_ppb``: layers per virtual stage and recomputed layers per
stage are the integer variables). Layers are placed in order, so virtual stage ``j = v * pp + r``
(chunk ``v`` of rank ``r``, Megatron-LM's interleaved assignment) holds the layers after those of
stages ``< j``, and its kinds follow from the counts (:func:`kind_counts`).

Memory of rank ``r``: its layers' model states, plus ``in_flight[r, v]`` micro-batches of chunk
``v``'s activations (:func:`autopar.pipeline.layout.chunk_in_flight`: under interleaving chunk 0
holds the most, and rank 0 the most of all), plus the rank's fixed part for the heaviest option it
uses (the layer rebuilt under full recompute, embedding and loss).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autopar.pipeline.layers import LayerTable
from autopar.pipeline.layout import chunk_in_flight
from autopar.pipeline.schedules import in_flight_chunks
from autopar.pipeline.simulate import PipelineTimes

SAME_REL_TOL = 1e-9  # layers whose every cost agrees to this are one kind


@dataclass(frozen=True)
class ChunkCosts:
    """Costs of ``K`` layer kinds under ``R`` recompute options on ``pp x vpp`` chunks.

    Attributes:
        table: the layer table (its per-rank fixed parts ``stage_*`` ``(pp, R)``, memory limit and
            p2p time are used as they are).
        starts: ``(K + 1,)`` layer boundaries; kind ``k`` is layers ``[starts[k], starts[k+1])``.
        forward_s, backward_s, recompute_s: ``(K, R)`` seconds per micro-batch of one layer.
        activation_bytes: ``(K, R)`` bytes one micro-batch keeps per layer.
        static_bytes: ``(K,)`` model-state bytes per layer.
        holder: ``(pp,)`` chunk of each rank that runs its fixed part (chunk 0; the last chunk
            of the last rank, where the output layer and loss run).
        in_flight: ``(pp, vpp)`` micro-batches of each chunk held at the rank's peak.
    """

    table: LayerTable
    starts: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray
    activation_bytes: np.ndarray
    static_bytes: np.ndarray
    holder: np.ndarray
    in_flight: np.ndarray

    @property
    def pp(self) -> int:
        return int(self.in_flight.shape[0])

    @property
    def vpp(self) -> int:
        return int(self.in_flight.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.starts[-1])

    @property
    def kind_layers(self) -> np.ndarray:
        """``(K,)`` layers of each kind."""
        return np.diff(self.starts)

    @property
    def time_s(self) -> np.ndarray:
        """``(K, R)`` forward + backward + recompute seconds of one layer."""
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def stage_time_s(self) -> np.ndarray:
        """``(pp, R)`` fixed seconds per micro-batch of each rank."""
        return self.table.stage_time_s

    @property
    def stage_bytes(self) -> np.ndarray:
        """``(pp, R)`` fixed bytes of each rank."""
        return self.table.stage_bytes

    @property
    def memory_limit_bytes(self) -> float:
        return self.table.memory_limit_bytes

    def fixed_option(self, counts: np.ndarray) -> np.ndarray:
        """``(pp,)`` the option whose fixed part each rank pays: among those its layers use
        (``counts`` ``(pp, vpp, K, R)``), the one with the largest fixed bytes."""
        used = counts.sum(axis=(1, 2)) > 0
        return np.argmax(np.where(used, self.stage_bytes, -np.inf), axis=1)

    def rank_bytes(self, counts: np.ndarray) -> np.ndarray:
        """``(pp,)`` peak bytes per device of ``counts`` ``(pp, vpp, K, R)``."""
        per_layer = self.static_bytes[None, None, :, None] + self.in_flight[:, :, None, None] * self.activation_bytes
        fixed = self.stage_bytes[np.arange(self.pp), self.fixed_option(counts)]
        return (counts * per_layer).sum(axis=(1, 2, 3)) + fixed

    def times(self, counts: np.ndarray) -> PipelineTimes:
        """Per-(rank, chunk) seconds per micro-batch of ``counts`` ``(pp, vpp, K, R)``, each rank's
        fixed part on its :attr:`holder` chunk."""
        ranks, option = np.arange(self.pp), self.fixed_option(counts)
        out = []
        t = self.table
        for per_layer, fixed in ((self.forward_s, t.stage_forward_s), (self.backward_s, t.stage_backward_s),
                                 (self.recompute_s, t.stage_recompute_s)):
            values = (counts * per_layer[None, None]).sum(axis=(2, 3))
            values[ranks, self.holder] += fixed[ranks, option]
            out.append(values)
        return PipelineTimes(*out, p2p_s=t.p2p_s)

    def chunk_activation_bytes(self, counts: np.ndarray) -> np.ndarray:
        """``(pp, vpp)`` activation bytes one micro-batch keeps on each chunk."""
        return (counts * self.activation_bytes[None, None]).sum(axis=(2, 3))


def kind_alone(costs: ChunkCosts, kind: int) -> ChunkCosts:
    """``costs`` with the layers of ``kind`` only (one kind, ``kind_layers[kind]`` layers), for
    per-rank time floors of that kind (:func:`autopar.pipeline.warm_start.rank_time_floor_s`)."""
    pick = slice(kind, kind + 1)
    return replace(costs, starts=np.array([0, costs.kind_layers[kind]], dtype=np.int64),
                   forward_s=costs.forward_s[pick], backward_s=costs.backward_s[pick],
                   recompute_s=costs.recompute_s[pick], activation_bytes=costs.activation_bytes[pick],
                   static_bytes=costs.static_bytes[pick])


def _kind_starts(table: LayerTable) -> np.ndarray:
    rows = np.concatenate([table.forward_s, table.backward_s, table.recompute_s, table.activation_bytes,
                           table.static_bytes[:, None]], axis=1)
    same = np.all(np.isclose(rows[1:], rows[:-1], rtol=SAME_REL_TOL, atol=0.0), axis=1)
    return np.concatenate([[0], np.flatnonzero(~same) + 1, [table.num_layers]]).astype(np.int64)


def chunk_costs(table: LayerTable, vpp: int, schedule: str, num_microbatches: int) -> ChunkCosts:
    """The :class:`ChunkCosts` of ``table`` on ``table.pp x vpp`` chunks under ``schedule``.

    In flight: interleaved 1F1B per chunk (:func:`autopar.pipeline.layout.chunk_in_flight`),
    the other schedules per rank (:func:`autopar.pipeline.schedules.in_flight_chunks`).

    Raises:
        AutoparError: sizes the schedule cannot run (:func:`~autopar.pipeline.schedules.check_schedule`).
    """
    pp = table.pp
    if schedule == "interleaved":
        in_flight = np.stack([chunk_in_flight(pp, vpp, r, num_microbatches) for r in range(pp)])
    else:
        in_flight = in_flight_chunks(schedule, pp, vpp, num_microbatches).astype(np.float64)[:, None] / vpp
        in_flight = np.repeat(in_flight, vpp, axis=1)
    starts = _kind_starts(table)
    first = starts[:-1]
    holder = np.zeros(pp, dtype=np.int64)
    holder[-1] = vpp - 1 if pp > 1 else 0
    return ChunkCosts(table=table, starts=starts, forward_s=table.forward_s[first],
                      backward_s=table.backward_s[first], recompute_s=table.recompute_s[first],
                      activation_bytes=table.activation_bytes[first], static_bytes=table.static_bytes[first],
                      holder=holder, in_flight=in_flight)


def kind_counts(starts: np.ndarray, layers_per_chunk: np.ndarray) -> np.ndarray:
    """``(pp, vpp, K)`` layers of each kind per chunk for ``layers_per_chunk`` ``(pp, vpp)``, the
    virtual stages ``j = v * pp + r`` taking the layers in order."""
    chunks = np.asarray(layers_per_chunk, dtype=np.int64)
    pp, vpp = chunks.shape
    order = chunks.T.ravel()  # virtual stage order
    bounds = np.concatenate([[0], np.cumsum(order)])
    lo = np.clip(bounds[:-1, None], starts[None, :-1], starts[None, 1:])
    hi = np.clip(bounds[1:, None], starts[None, :-1], starts[None, 1:])
    return (hi - lo).reshape(vpp, pp, -1).transpose(1, 0, 2)
