"""``Problem``: the three specs every cost function needs, bundled."""

from __future__ import annotations

from dataclasses import dataclass

from autopar.specs import ClusterSpec, ModelSpec, TrainSpec


@dataclass(frozen=True)
class Problem:
    """A model to train on a cluster with a batch: the fixed part of every estimate."""

    model: ModelSpec
    cluster: ClusterSpec
    train: TrainSpec

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def padded_vocab(self, tp):
        """Megatron's padded vocabulary: ``ceil(V / (d * tp)) * d * tp`` with ``d`` =
        ``--make-vocab-size-divisible-by`` (``megatron/training/tokenizer``,
        ``_vocab_size_with_padding``). Works on ints and numpy arrays."""
        unit = self.train.make_vocab_size_divisible_by * tp
        return -(-self.model.vocab_size // unit) * unit
