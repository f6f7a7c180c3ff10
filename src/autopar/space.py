"""Enumerate the layout space as one :class:`LayoutBatch` (before the validity rules).

Every combination of: ``tp``, ``cp``, ``pp`` whose product divides the world (``dp`` is the
rest), ``vpp`` (1, or a divisor >= 2 of the layers per stage), ``mbs``, ZeRO stage, SP on/off,
activation recompute (none, selective, full on every layer, or full on 1/4, 1/2, 3/4 of each
chunk's layers), and for MoE models ``ep`` (divisors of the expert count) with ``etp`` = tp or 1.
The rules (:mod:`autopar.rules`) then reject what Megatron-LM would reject, by name.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from autopar.problem import Problem
from autopar.strategy import LayoutBatch


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SpaceOptions:
    """Which values of each knob to enumerate (``None`` = all sensible values)."""

    mbs: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    max_vpp: int = 16
    recompute_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None


def _grid(p: Problem, opt: SpaceOptions) -> list[tuple[int, int, int, int]]:
    """(tp, cp, pp, vpp) combinations whose tp*cp*pp divides the world."""
    world, layers = p.world_size, p.model.num_layers
    out = []
    for tp in opt.tp or divisors(world):
        for cp in opt.cp or divisors(world // tp):
            if (world // tp) % cp:
                continue
            for pp in opt.pp or divisors(world // (tp * cp)):
                if (world // (tp * cp)) % pp:
                    continue
                vpps = [1]
                if pp > 1 and layers % pp == 0:
                    vpps += [v for v in divisors(layers // pp) if 2 <= v <= opt.max_vpp]
                out.extend((tp, cp, pp, v) for v in vpps)
    return out


def _recompute_options(p: Problem, pp: int, vpp: int, opt: SpaceOptions) -> list[tuple[int, int]]:
    """(recompute code, recompute_layers) pairs: none, selective, full-all, full-partial."""
    per_chunk = max(p.model.num_layers // (pp * vpp), 1)
    partial = sorted({int(per_chunk * f) for f in opt.recompute_fractions} - {0, per_chunk})
    return [(0, 0), (1, 0), (2, 0)] + [(2, n) for n in partial]


def _expert_options(p: Problem, tp: int) -> list[tuple[int, int]]:
    if not p.model.is_moe:
        return [(1, tp)]
    return [(ep, etp) for ep in divisors(p.model.num_experts) for etp in sorted({tp, 1})]


def enumerate_layouts(p: Problem, opt: SpaceOptions | None = None) -> LayoutBatch:
    """Every candidate layout of the space, valid or not, as one batch."""
    opt = opt or SpaceOptions()
    rows = []
    for tp, cp, pp, vpp in _grid(p, opt):
        dp = p.world_size // (tp * cp * pp)
        for (ep, etp), (rc, rl), mbs, zero, sp in itertools.product(
            _expert_options(p, tp), _recompute_options(p, pp, vpp, opt), opt.mbs, opt.zero, (False, True)
        ):
            rows.append((dp, tp, pp, vpp, cp, ep, etp, mbs, sp, zero, rc, rl))
    a = np.asarray(rows, dtype=np.int64).reshape(-1, 12)
    gbs = p.train.global_batch_size
    return LayoutBatch(
        dp=a[:, 0], tp=a[:, 1], pp=a[:, 2], vpp=a[:, 3], cp=a[:, 4], ep=a[:, 5], etp=a[:, 6],
        mbs=a[:, 7], sp=a[:, 8].astype(bool), zero=a[:, 9], recompute=a[:, 10],
        recompute_layers=a[:, 11], num_microbatches=gbs // (a[:, 7] * a[:, 0]),
    )
