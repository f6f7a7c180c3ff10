"""Which virtual stage each model chunk of each pipeline rank holds, per schedule.

A :class:`Placement` is a table ``stage[rank, chunk]`` of virtual-stage indices plus the number
of independent stage chains (pipelines) they form; the simulator (:mod:`autopar.pipeline.simulate`)
takes a forward's input from the previous stage of its chain and a backward's gradient from the
next one, and pays a p2p transfer only where those stages sit on different ranks.

* Interleaved placement (Megatron-LM, Narayanan et al., SC'21, sec. 2.2.2; also 1F1B, GPipe and
  ZB-H1 with ``vpp = 1``): chunk ``c`` of rank ``r`` is virtual stage ``c * pp + r``.
* V placement (ZB-V, Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, sec. 6; DualPipeV,
  github.com/deepseek-ai/DualPipe ``dualpipev.py``; PyTorch
  ``torch.distributed.pipelining.schedules.generate_stage_to_rank_mapping(style="v")``): chunk 0 of
  rank ``r`` is virtual stage ``r``, chunk 1 is ``2 * pp - 1 - r``; the last rank holds the two
  middle stages and rank 0 the first and the last (the loss).
* Bidirectional placement (DualPipe, DeepSeek-V3 technical report, sec. 3.2.1; ``dualpipe.py``):
  two pipelines of ``pp`` stages run in opposite directions over the same ranks. Chain 0 (stages
  ``0 .. pp-1``) puts its stage ``s`` on rank ``s``, chain 1 (stages ``pp .. 2pp-1``) its stage
  ``s`` on rank ``pp - 1 - s``; rank ``r`` of the first half holds chain 0 as its chunk 0, ranks
  of the second half hold chain 1 as their chunk 0 (``phase ^= is_in_second_half`` in
  ``dualpipe.py``). Each rank holds two stages' parameters (2x, the report's table).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

V_SCHEDULES: tuple[str, ...] = ("zbv", "dualpipev")
BIDIRECTIONAL_SCHEDULES: tuple[str, ...] = ("dualpipe",)


@dataclass(frozen=True)
class Placement:
    """Virtual stage of each (rank, chunk) and the chains they form.

    Attributes:
        stage: ``(pp, vpp)`` int array; every index ``0 .. pp*vpp-1`` once.
        chains: independent pipelines; chain ``k`` is stages ``k*L .. (k+1)*L - 1`` with
            ``L = pp * vpp / chains``, its first stage takes the micro-batch input and its last
            computes the loss.
    """

    stage: np.ndarray
    chains: int = 1

    @property
    def chain_length(self) -> int:
        """Stages per chain, ``pp * vpp / chains``."""
        return self.stage.size // self.chains

    def owner(self) -> tuple[list[int], list[int]]:
        """``(rank_of, chunk_of)``: lists indexed by virtual stage."""
        pp, vpp = self.stage.shape
        rank_of, chunk_of = [0] * self.stage.size, [0] * self.stage.size
        for r in range(pp):
            for c in range(vpp):
                rank_of[int(self.stage[r, c])], chunk_of[int(self.stage[r, c])] = r, c
        return rank_of, chunk_of

    def previous(self, j: int) -> int | None:
        """The stage feeding ``j``'s forward, None at the start of its chain."""
        return None if j % self.chain_length == 0 else j - 1

    def next(self, j: int) -> int | None:
        """The stage feeding ``j``'s backward, None at the end of its chain (the loss)."""
        return None if (j + 1) % self.chain_length == 0 else j + 1


def placement(schedule: str, pp: int, vpp: int) -> Placement:
    """The placement ``schedule`` runs (see the module docstring); sizes are checked by
    :func:`autopar.pipeline.schedules.check_schedule`."""
    rank = np.arange(pp)
    if schedule in V_SCHEDULES:
        return Placement(np.stack([rank, 2 * pp - 1 - rank], axis=1))
    if schedule in BIDIRECTIONAL_SCHEDULES:
        forward, reverse = rank, pp + (pp - 1 - rank)
        second_half = rank >= pp // 2
        return Placement(np.stack([np.where(second_half, reverse, forward), np.where(second_half, forward, reverse)],
                                  axis=1), chains=2)
    return Placement(np.arange(vpp)[None, :] * pp + rank[:, None])


def chunk_order_in_model(schedule: str, pp: int, vpp: int) -> np.ndarray:
    """``(pp, vpp)`` position of each chunk's layers in the model: the chunk holding layers first
    is 0. Equal to the virtual stage for one chain; DualPipe's two chains hold the same model
    twice, so chain 1's stage ``pp + s`` holds the layers of stage ``s``."""
    table = placement(schedule, pp, vpp)
    return table.stage % table.chain_length
