"""Enumerate the layout space as one :class:`LayoutBatch` (before the validity rules).

Every combination of: ``tp``, ``cp``, ``pp`` whose product divides the world (``dp`` is the
rest), ``vpp`` (1, or a divisor >= 2 of the layers per stage), ``mbs``, ZeRO stage, SP on/off
(and SP with TP communication overlap), the context-parallel algorithm (the ring, and where the
target runs them all-to-all, all-gather, hierarchical),
activation recompute (none, selective, full on every layer, or full on 1/4, 1/2, 3/4 of each
chunk's layers; selective with Megatron's default ``core_attn`` and, where the model has them,
with the memory-saving modules too: :func:`autopar.cost.recompute.memory_saving_modules`), and
for MoE models ``ep`` (divisors of the expert count) with ``etp`` = tp or 1, each offered token
dispatcher, and the EP all-to-all overlap where offered (``SpaceOptions.moe_dispatchers`` /
``moe_ep_overlap``; the search sets them by target, :mod:`autopar.export.comm_knobs`).

Embedding/loss-aware splits (Megatron's ``--account-for-embedding-in-pipeline-split`` and
``--account-for-loss-in-pipeline-split``, both on) are offered for a ``(pp, vpp > 1)`` exactly
when they make interleaving possible: ``L / pp`` is not a whole multiple of vpp but
``(L + 2) / (pp * vpp)`` is a whole number >= 2 (Llama-3.1-405B: 126 layers, pp 8, vpp 8,
NVIDIA's recipe), and only for the largest such vpp: its bubble ``(pp - 1) / vpp`` and the
in-flight activations ``1 + (pp - 1) / (pp * vpp)`` are the smallest, and offering every
divisor doubled the 405B search (0.5 s to 1.1 s). With vpp 1 they are not offered: whenever ``(L + 2) % pp == 0`` and
``L % pp != 0`` they give the same split as the default uneven one (first and last stage one
layer lighter), so they would only duplicate layouts.
Where neither interleaves (DeepSeek-V3's 61 layers on any pp), a flexible
``--pipeline-model-parallel-layout`` is offered for two vpp values (:func:`_flexible_vpps`).
The rules (:mod:`autopar.rules`) then reject what Megatron-LM would reject, by name.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace

import numpy as np

from autopar.cost.recompute import memory_saving_modules
from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.strategy import CP_COMM_TYPES, DEFAULT_RECOMPUTE_MODULES, MOE_DISPATCHERS, LayoutBatch, module_mask


# Candidate layouts one search may hold (14 int64 columns plus the cost arrays): 22.8 million took
# 32 s and 5 GB (DeepSeek-V3 on 800,000 devices); the 2,048-GPU DeepSeek-V3 search holds about one million.
MAX_LAYOUTS = 10_000_000


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order (trial division up to sqrt(n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True)
class SpaceOptions:
    """Which values of each knob to enumerate (``None`` = all sensible values).
    ``recompute_modules``: the one module set selective recompute uses (None: Megatron's default
    and the model's memory-saving set). ``tp_comm_overlap``: also offer TP overlap on every SP
    layout; ``cp_comm_types``: the context-parallel algorithms offered with cp > 1 (``a2a+p2p``
    with every all-to-all group size ``1 < a < cp`` dividing cp); ``moe_dispatchers``: the MoE
    token dispatchers offered (:data:`autopar.strategy.MOE_DISPATCHERS`), ``moe_ep_overlap``: also
    offer the EP all-to-all overlap with ep > 1. The search sets them by target
    (:mod:`autopar.export.comm_knobs`). ``galvatron_choices``: also Galvatron's vocabulary TP, GPipe
    and non-consecutive TP groups (:mod:`autopar.galvatron_space`; ``--target galvatron``)."""

    mbs: tuple[int, ...] = (1, 2, 4, 8)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    max_vpp: int = 16
    recompute_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    recompute_modules: tuple[str, ...] | None = None
    tp_comm_overlap: bool = False
    cp_comm_types: tuple[str, ...] = ("p2p",)
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    moe_ep_overlap: bool = False
    galvatron_choices: bool = False


def _grid(p: Problem, opt: SpaceOptions) -> list[tuple[int, int, int, int, int]]:
    """(tp, cp, pp, vpp, accounted) combinations whose tp*cp*pp divides the world; accounted
    1 = the embedding and loss count as layers (see the module docstring)."""
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
                out.extend((tp, cp, pp, v, 0) for v in vpps)
                accounted = []
                if pp > 1 and (layers + 2) % pp == 0:
                    accounted = [v for v in divisors((layers + 2) // pp)
                                 if 2 <= v <= opt.max_vpp and v not in vpps and (layers + 2) // (pp * v) >= 2]
                    out.extend((tp, cp, pp, v, 1) for v in accounted[-1:])
                if pp > 1 and len(vpps) == 1 and not accounted:
                    out.extend((tp, cp, pp, v, 0) for v in _flexible_vpps(p, pp, opt.max_vpp))
    return out


def _flexible_vpps(p: Problem, pp: int, max_vpp: int) -> list[int]:
    """The vpp values offered with a flexible layout (:func:`autopar.pipeline.layout.default_layout`)
    for a pp whose layers interleave neither evenly nor with the embedding/loss flags: the two
    largest powers of two with at least 2 slots per chunk, ``(L + mtp + 2) / (pp * vpp) >= 2``
    (the embedding, MTP layers and loss counted as slots), whose balanced layout exists. DeepSeek-V3
    (64 slots): pp 4 -> vpp 8, 4; pp 8 -> 4, 2; pp 16 -> 2 (NVIDIA's Megatron-Bridge recipes run
    pp 4 x vpp 4, pp 8 x vpp 4 and pp 16 x vpp 2)."""
    from autopar.pipeline.layout import PipelineLayout

    m = p.model
    slots = m.num_layers + m.mtp_num_layers + 2
    found = []
    v = 2
    while v <= max_vpp and slots // (pp * v) >= 2:
        try:
            PipelineLayout.balanced(m.num_layers, pp, v, m.mtp_num_layers)
            found.append(v)
        except AutoparError:
            pass
        v *= 2
    return found[-2:]


def _recompute_options(p: Problem, pp: int, vpp: int, opt: SpaceOptions) -> list[tuple[int, int, int]]:
    """(recompute code, recompute_layers, module mask) triples: none, selective with each module
    set, full-all, full-partial."""
    per_chunk = max(p.model.num_layers // (pp * vpp), 1)
    partial = sorted({int(per_chunk * f) for f in opt.recompute_fractions} - {0, per_chunk})
    default = module_mask(DEFAULT_RECOMPUTE_MODULES)
    sets = [opt.recompute_modules] if opt.recompute_modules else [DEFAULT_RECOMPUTE_MODULES, memory_saving_modules(p)]
    selective = [(1, 0, mask) for mask in dict.fromkeys(module_mask(m) for m in sets)]
    return [(0, 0, default)] + selective + [(2, 0, default)] + [(2, n, default) for n in partial]


def _expert_options(p: Problem, tp: int, pp: int, vpp: int, opt: SpaceOptions) -> list[tuple[int, int, int, int]]:
    """(ep, etp, dispatcher index, EP overlap) quadruples: for a MoE model every ep dividing the
    experts and etp = tp or 1; with ep > 1 each offered dispatcher, the last one (the target's
    preferred, :func:`autopar.export.comm_knobs.flex_backend`) with the EP overlap where offered
    and the rules allow it (not allgather, vpp with pp > 1: ``autopar.rules_moe``). The overlap
    never exposes more communication (:func:`autopar.cost.moe_dispatch.exposed_layer_comm_s`) and
    keeps no more memory in autopar's model, so it is offered with that dispatcher only, and the
    others without it (each pairing would double the space). At ep 1 there is nothing to dispatch:
    alltoall alone."""
    if not p.model.is_moe:
        return [(1, tp, 0, 0)]
    out = []
    for ep in divisors(p.model.num_experts):
        for etp in sorted({tp, 1}):
            names = opt.moe_dispatchers if ep > 1 else ("alltoall",)
            for name in names:
                overlap = name == names[-1] and opt.moe_ep_overlap and ep > 1 and name != "allgather" \
                    and (pp == 1 or vpp > 1)
                out.append((ep, etp, MOE_DISPATCHERS.index(name), int(overlap)))
    return out


def _tp_modes(tp: int, opt: SpaceOptions) -> np.ndarray:
    """(sp, tp_comm_overlap) pairs: no SP, SP, and SP with overlap where offered and tp > 1."""
    return np.asarray([(0, 0), (1, 0)] + ([(1, 1)] if opt.tp_comm_overlap and tp > 1 else []), dtype=np.int64)


def _cp_modes(cp: int, tp: int, fast_domain: int, opt: SpaceOptions) -> np.ndarray:
    """(cp_comm index, cp_a2a) pairs: the ring, and with cp > 1 the other offered algorithms;
    ``a2a+p2p`` with the largest all-to-all group that stays in the fast domain
    (``cp_a2a * tp <= fast_domain``, TE's intent: all-to-all over NVLink, the ring across nodes),
    when that group is neither 1 nor cp."""
    modes = [(0, 1)]
    if cp > 1:
        for name in opt.cp_comm_types:
            if name in ("a2a", "allgather"):
                modes.append((CP_COMM_TYPES.index(name), cp if name == "a2a" else 1))
            elif name == "a2a+p2p":
                inner = max(a for a in divisors(cp) if a * tp <= fast_domain or a == 1)
                if 1 < inner < cp:
                    modes.append((CP_COMM_TYPES.index(name), inner))
    return np.asarray(modes, dtype=np.int64)


def _product(*columns: np.ndarray) -> list[np.ndarray]:
    """Cartesian product of 1-D arrays (first varies slowest, as ``itertools.product``)."""
    grids = np.meshgrid(*columns, indexing="ij")
    return [g.ravel() for g in grids]


def enumerate_layouts(p: Problem, opt: SpaceOptions | None = None) -> LayoutBatch:
    """Every candidate layout of the space, valid or not, as one batch.

    Built with numpy per (tp, cp, pp, vpp) block so a million-row space (DeepSeek-V3 on 2,048
    GPUs) takes a fraction of a second. A space over :data:`MAX_LAYOUTS` with several MoE
    dispatchers offered keeps the target's preferred one only (the last); the row order is that of ``itertools.product`` over
    (ep/etp/dispatcher/EP overlap, recompute, mbs, zero, sp/overlap, CP algorithm).
    """
    opt = opt or SpaceOptions()
    blocks = []
    mbs, zero = np.asarray(opt.mbs), np.asarray(opt.zero)
    grid = [(g, np.asarray(_expert_options(p, g[0], g[2], g[3], opt), dtype=np.int64),
             np.asarray(_recompute_options(p, g[2], g[3], opt), dtype=np.int64)) for g in _grid(p, opt)]
    rows = sum(len(e) * len(r) * len(_tp_modes(g[0], opt)) * len(_cp_modes(g[1], g[0], p.cluster.fast_domain_size, opt))
               for g, e, r in grid) * len(mbs) * len(zero)
    if rows > MAX_LAYOUTS and len(opt.moe_dispatchers) > 1:  # keep the preferred dispatcher (with its overlap) only
        return enumerate_layouts(p, replace(opt, moe_dispatchers=opt.moe_dispatchers[-1:]))
    if rows > MAX_LAYOUTS:  # 720,720 devices (240 divisors) asked numpy for 22.8 GiB and crashed
        raise AutoparError(
            f"--nodes x --devices-per-node = {p.world_size} devices: {p.model.name}'s layout space there has "
            f"{rows:,} candidate layouts, more than the {MAX_LAYOUTS:,} autopar enumerates in memory; plan fewer "
            "devices or a count with fewer divisors (e.g. a power of two)")
    for (tp, cp, pp, vpp, accounted), experts, recompute in grid:
        dp = p.world_size // (tp * cp * pp)
        tp_modes, cp_modes = _tp_modes(tp, opt), _cp_modes(cp, tp, p.cluster.fast_domain_size, opt)
        ie, ir, m, z, it, ic = _product(np.arange(len(experts)), np.arange(len(recompute)), mbs, zero,
                                        np.arange(len(tp_modes)), np.arange(len(cp_modes)))
        block = np.empty((len(ie), 19), dtype=np.int64)
        block[:, :5] = (dp, tp, pp, vpp, cp)
        block[:, 5:7] = experts[ie, :2]
        block[:, 17:19] = experts[ie, 2:]
        block[:, 7], block[:, 8], block[:, 9] = m, tp_modes[it, 0], z
        block[:, 14], block[:, 15:17] = tp_modes[it, 1], cp_modes[ic]
        block[:, 10:12] = recompute[ir, :2]
        block[:, 12] = accounted
        block[:, 13] = recompute[ir, 2]
        blocks.append(block)
    a = np.concatenate(blocks) if blocks else np.zeros((0, 19), dtype=np.int64)
    gbs = p.train.global_batch_size
    batch = LayoutBatch(
        dp=a[:, 0], tp=a[:, 1], pp=a[:, 2], vpp=a[:, 3], cp=a[:, 4], ep=a[:, 5], etp=a[:, 6],
        mbs=a[:, 7], sp=a[:, 8].astype(bool), zero=a[:, 9], recompute=a[:, 10],
        recompute_layers=a[:, 11], num_microbatches=gbs // (a[:, 7] * a[:, 0]),
        account_embedding=a[:, 12].astype(bool), account_loss=a[:, 12].astype(bool), recompute_modules=a[:, 13],
        tp_comm_overlap=a[:, 14].astype(bool), cp_comm=a[:, 15], cp_a2a=a[:, 16],
        moe_dispatcher=a[:, 17], moe_ep_overlap=a[:, 18].astype(bool),
    )
    if opt.galvatron_choices:
        from autopar.galvatron_space import add_variants

        batch = add_variants(p, batch)
    return batch
