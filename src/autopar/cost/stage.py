"""``Stages``: which layers a pipeline stage holds, as arrays aligned with a ``LayoutBatch``.

Every cost function works on (layout, stage) pairs: row ``i`` of a :class:`Stages` describes one
pipeline stage of layout ``i`` of the batch. The search looks at three stages per layout (the
first, the second and the last, which together bound the peak: the first holds the most
micro-batches in flight and the embedding, the last the output layer and logits); ``estimate``
looks at every stage of one layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layout import chunk_in_flight, layout_of
from autopar.pipeline.v_cost import v_in_flight_microbatches
from autopar.problem import Problem
from autopar.strategy import RECOMPUTE_CODES, Strategy, split_first_middle_last


@dataclass
class Stages:
    """Row-aligned stage descriptors (int/bool arrays of shape ``(n,)``).

    Attributes:
        index: pipeline rank of the stage (0-based).
        start: first decoder layer of the stage.
        layers: decoder layers on the stage (summed over its vpp model chunks).
        mtp: True where the stage holds the MTP layers (None: the last stage, Megatron's default).
        in_flight: micro-batches' worth of the stage's layer activations at its peak (None: the
            schedule's count for equal chunks, :func:`autopar.cost.memory.in_flight_microbatches`);
            set for layouts with unequal chunks, whose chunks hold different counts.
    """

    index: np.ndarray
    start: np.ndarray
    layers: np.ndarray
    mtp: np.ndarray | None = None
    in_flight: np.ndarray | None = None

    def holds_mtp(self, batch: LayoutBatch) -> np.ndarray:
        """Where the stage holds the MTP layers (bool, ``(n,)``)."""
        return self.is_last(batch) if self.mtp is None else self.mtp

    def take(self, index: np.ndarray) -> "Stages":
        """The rows at ``index`` (boolean mask or integer indices)."""
        pick = lambda a: None if a is None else a[index]  # noqa: E731
        return Stages(self.index[index], self.start[index], self.layers[index], pick(self.mtp), pick(self.in_flight))

    def is_first(self) -> np.ndarray:
        return self.index == 0

    def is_last(self, batch: LayoutBatch) -> np.ndarray:
        """Where the stage computes the loss (bool, ``(n,)``): rank pp-1, or rank 0 under a V
        schedule (its chunk 1 is the last virtual stage, :mod:`autopar.pipeline.placement`)."""
        return np.where(batch.v_shaped, self.index == 0, self.index == batch.pp - 1)


def bounding_stages(p: Problem, batch: LayoutBatch) -> list[Stages]:
    """Stages 0, 1 and pp-1 of each layout under the default split (for ``pp`` of 1 or 2 some
    coincide; the embedding/loss-aware split when the layout counts them as layers). For 1F1B
    and interleaved schedules every other stage holds no more memory and no
    more time than one of these: middle stages have equal layers and fewer micro-batches in
    flight than stage 1. Where the default split cannot interleave, the flexible
    :meth:`~autopar.pipeline.layout.PipelineLayout.balanced` layout keeps its stage sums (its
    chunks differ; the single-layout estimate costs them chunk by chunk)."""
    num_layers = p.model.num_layers
    first, middle, last = split_first_middle_last(np.full(len(batch), num_layers), batch.pp,
                                                  batch.account_embedding, batch.account_loss)
    second_index = np.minimum(1, batch.pp - 1)
    second_layers = np.where(batch.pp == 2, last, middle)
    second_layers = np.where(batch.pp == 1, first, second_layers)
    return [
        Stages(index=np.zeros(len(batch), dtype=np.int64), start=np.zeros(len(batch), dtype=np.int64), layers=first),
        Stages(index=second_index, start=np.where(batch.pp == 1, 0, first), layers=second_layers),
        Stages(index=batch.pp - 1, start=num_layers - last, layers=last),
    ]


def all_stages(p: Problem, s: Strategy) -> tuple[LayoutBatch, Stages]:
    """Every stage of one layout: the layout repeated ``pp`` times and its stage rows (row ``i``
    carries stage ``i``'s recompute option, :attr:`Strategy.stage_recompute`).

    The stages come from the layout's :class:`~autopar.pipeline.layout.PipelineLayout`: decoder
    layers per rank, the rank holding the MTP layers, and each rank's activation peak with its
    own chunks (:func:`~autopar.pipeline.layout.chunk_in_flight` weighted by the chunks' layers;
    with equal chunks the schedule's usual count).

    Raises:
        AutoparError: the layout's split is invalid (callers check the rules first).
    """
    layout = layout_of(p, s)
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size).take(np.zeros(s.pp, dtype=np.int64))
    batch.recompute = np.array([RECOMPUTE_CODES[name] for name in s.stage_recompute], dtype=np.int64)
    decoder = layout.decoder
    layers = decoder.sum(axis=1)
    start = np.concatenate([[0], np.cumsum(layers)[:-1]])
    m = s.num_microbatches(p.train.global_batch_size)
    in_flight = np.array([chunk_in_flight(s.pp, s.vpp, r, m) @ decoder[r] / max(int(layers[r]), 1)
                          for r in range(s.pp)])
    if s.schedule == "gpipe":  # every forward before the first backward (autopar.cost.memory)
        in_flight = np.full(s.pp, float(m))
    mtp = np.arange(s.pp) == layout.mtp_rank
    if batch.v_shaped[0]:  # equal chunks (autopar.rules); the loss and MTP sit on rank 0's chunk 1
        in_flight = v_in_flight_microbatches(batch.v_schedule, batch.pp, batch.num_microbatches, np.arange(s.pp))
        mtp = np.arange(s.pp) == 0
    return batch, Stages(index=np.arange(s.pp), start=start, layers=layers, mtp=mtp, in_flight=in_flight)
