"""Prefix sums of a layer table folded over the vpp model chunks, for O(1) stage costs.

With interleaving every rank runs ``vpp`` chunks of equal size (Megatron-LM builds
``layers_on_rank / vpp`` layers per chunk), so rank ``i`` owning positions ``[a, b)`` of the
``K = L / vpp`` positions of a chunk holds layers ``c * K + [a, b)`` for every chunk ``c``
(Narayanan et al., SC'21, sec. 2.2.2). Folding the table (summing layer ``c * K + q`` over
``c``) turns every rank's cost into a contiguous range of positions, so the same split
algorithms serve vpp = 1 and vpp > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.errors import AutoparError
from autopar.pipeline.layers import LayerTable


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])


@dataclass(frozen=True)
class FoldedTable:
    """Prefix sums over the ``K`` positions of a chunk.

    Attributes:
        time_s: ``(K+1, R)`` seconds per micro-batch (forward + backward + recompute).
        static_bytes: ``(K+1,)`` model-state bytes.
        activation_bytes: ``(K+1, R)`` activation bytes per micro-batch.
        stage_time_s, stage_bytes: ``(pp, R)`` fixed per-rank parts (from the table).
        in_flight: ``(pp,)`` micro-batches' worth of activations each rank holds at its peak.
        memory_limit_bytes: usable bytes per device.
    """

    time_s: np.ndarray
    static_bytes: np.ndarray
    activation_bytes: np.ndarray
    stage_time_s: np.ndarray
    stage_bytes: np.ndarray
    in_flight: np.ndarray
    memory_limit_bytes: float

    @property
    def positions(self) -> int:
        return int(self.static_bytes.shape[0] - 1)

    @property
    def pp(self) -> int:
        return int(self.stage_bytes.shape[0])

    def rank_time_s(self, rank, start, end, option) -> np.ndarray:
        """Seconds per micro-batch of ``rank`` owning positions ``[start, end)`` (broadcasts)."""
        return self.time_s[end, option] - self.time_s[start, option] + self.stage_time_s[rank, option]

    def rank_bytes(self, rank, start, end, option) -> np.ndarray:
        """Peak bytes of ``rank`` owning positions ``[start, end)`` (broadcasts)."""
        act = self.activation_bytes[end, option] - self.activation_bytes[start, option]
        return (self.static_bytes[end] - self.static_bytes[start] + self.in_flight[rank] * act
                + self.stage_bytes[rank, option])


def fold(table: LayerTable, vpp: int, in_flight: np.ndarray) -> FoldedTable:
    """Fold ``table`` over ``vpp`` chunks.

    Args:
        in_flight: ``(pp,)`` micro-batches' worth of activations held per rank (chunks in flight
            divided by vpp, see :func:`autopar.pipeline.schedules.in_flight_chunks`).

    Raises:
        AutoparError: ``vpp`` does not divide the layer count, or fewer positions than stages.
    """
    num_layers = table.num_layers
    if num_layers % vpp:
        raise AutoparError(f"vpp={vpp} must divide num_layers={num_layers} (every rank runs vpp equal chunks)")
    positions = num_layers // vpp
    if positions < table.pp:
        raise AutoparError(f"pp={table.pp} exceeds num_layers/vpp = {positions}: some stage would be empty")

    def folded(x: np.ndarray) -> np.ndarray:
        return x.reshape((vpp, positions) + x.shape[1:]).sum(axis=0)

    return FoldedTable(
        time_s=_prefix(folded(table.layer_time_s)),
        static_bytes=_prefix(folded(table.static_bytes)),
        activation_bytes=_prefix(folded(table.activation_bytes)),
        stage_time_s=table.stage_time_s,
        stage_bytes=table.stage_bytes,
        in_flight=np.asarray(in_flight, dtype=np.float64),
        memory_limit_bytes=table.memory_limit_bytes,
    )


def surrogate_s(rank_times_s: np.ndarray, num_microbatches: int, vpp: int) -> np.ndarray:
    """Step-time objective of per-rank times ``(..., pp)``: ``(m - 1) * max_i t_i + sum_i t_i / vpp``.

    For 1F1B this is the makespan ``sum_i t_i + (m - 1) * max_i t_i`` (Narayanan et al., SC'21,
    sec. 2.2.1, generalised to uneven stages); for interleaving it has the shape of
    ``(m + (pp - 1) / vpp) * t`` up to a constant. Linear in a bottleneck variable, so the
    integer program can use it.
    """
    return (num_microbatches - 1) * rank_times_s.max(axis=-1) + rank_times_s.sum(axis=-1) / vpp
