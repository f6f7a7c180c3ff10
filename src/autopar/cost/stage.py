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

from autopar.problem import Problem
from autopar.strategy import (RECOMPUTE_CODES, LayoutBatch, Strategy, default_layers_per_stage,
                              split_first_middle_last)


@dataclass
class Stages:
    """Row-aligned stage descriptors (int/bool arrays of shape ``(n,)``).

    Attributes:
        index: pipeline rank of the stage (0-based).
        start: first decoder layer of the stage.
        layers: decoder layers on the stage (summed over its vpp model chunks).
    """

    index: np.ndarray
    start: np.ndarray
    layers: np.ndarray

    def is_first(self) -> np.ndarray:
        return self.index == 0

    def is_last(self, batch: LayoutBatch) -> np.ndarray:
        return self.index == batch.pp - 1


def bounding_stages(p: Problem, batch: LayoutBatch) -> list[Stages]:
    """Stages 0, 1 and pp-1 of each layout under the default split (for ``pp`` of 1 or 2 some
    coincide; the embedding/loss-aware split when the layout counts them as layers). For 1F1B
    and interleaved schedules every other stage holds no more memory and no
    more time than one of these: middle stages have equal layers and fewer micro-batches in
    flight than stage 1."""
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

    Raises:
        ValueError: the layout has no default split (callers check the rules first).
    """
    split = s.layers_per_stage or default_layers_per_stage(p.model.num_layers, s.pp, s.account_for_embedding,
                                                           s.account_for_loss)
    if split is None:
        raise ValueError(f"no layer split for pp={s.pp}")
    batch = LayoutBatch.from_strategy(s, p.train.global_batch_size).take(np.zeros(s.pp, dtype=np.int64))
    batch.recompute = np.array([RECOMPUTE_CODES[name] for name in s.stage_recompute], dtype=np.int64)
    layers = np.asarray(split, dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(layers)[:-1]])
    return batch, Stages(index=np.arange(s.pp), start=start, layers=layers)
