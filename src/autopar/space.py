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
NVIDIA's recipe), for the two largest such vpp: the largest has the smallest bubble ``(pp - 1) / vpp``
and in-flight activations ``1 + (pp - 1) / (pp * vpp)``, the next is what NVIDIA's recipes often
run (Qwen3-235B-A22B, 94 layers: pp 8 x vpp 4, 3 slots per chunk, beside vpp 6), and offering every
divisor doubled the 405B search (0.5 s to 1.1 s; two values: 0.25 s to 0.32 s). With vpp 1 they are not offered: whenever ``(L + 2) % pp == 0`` and
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
from autopar.layout_batch import LayoutBatch
from autopar.problem import Problem
from autopar.strategy import CP_COMM_TYPES, DEFAULT_RECOMPUTE_MODULES, MOE_DISPATCHERS, module_mask

# Candidate layouts one search may hold (14 int64 columns plus the cost arrays): 22.8 million took
# 32 s and 5 GB (DeepSeek-V3 on 800,000 devices); the 2,048-GPU DeepSeek-V3 search holds about one million.
MAX_LAYOUTS = 10_000_000
# (tp, cp, pp, vpp) blocks one search may go through (:func:`blocks`): the search counts each block's
# layouts without building them, but goes through the blocks one by one in Python; 720,720 devices
# (240 divisors) have 135,770 blocks and took 30 s; 16,384 devices have about 1,400.
MAX_BLOCKS = 50_000


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
    and non-consecutive TP groups (:mod:`autopar.galvatron_space`; ``--target galvatron``).
    ``v_schedules``: also torchtitan's ZB-V and DualPipeV on vpp-2 rows (:mod:`autopar.v_space`;
    ``--target torchtitan``)."""

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
    moe_ep_overlap_both: bool = False
    galvatron_choices: bool = False
    v_schedules: bool = False


def _grid(p: Problem, opt: SpaceOptions) -> list[tuple[int, int, int, int, int]]:
    """(tp, cp, pp, vpp, accounted) combinations whose tp*cp*pp divides the world; accounted
    1 = the embedding and loss count as layers (see the module docstring)."""
    world, layers = p.world_size, p.model.num_layers
    out = []
    flexible: dict[int, list[int]] = {}  # by pp
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
                    out.extend((tp, cp, pp, v, 1) for v in accounted[-2:])
                if pp > 1 and len(vpps) == 1 and not accounted:
                    if pp not in flexible:
                        flexible[pp] = _flexible_vpps(p, pp, opt.max_vpp)
                    out.extend((tp, cp, pp, v, 0) for v in flexible[pp])
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
    others without it (each pairing would double the space); ``SpaceOptions.moe_ep_overlap_both``
    (``--explain``'s space) offers every dispatcher both ways. At ep 1 there is nothing to dispatch:
    alltoall alone."""
    if not p.model.is_moe:
        return [(1, tp, 0, 0)]
    out = []
    for ep in divisors(p.model.num_experts):
        for etp in sorted({tp, 1}):
            names = opt.moe_dispatchers if ep > 1 else ("alltoall",)
            for name in names:
                can = opt.moe_ep_overlap and ep > 1 and name != "allgather" and (pp == 1 or vpp > 1)
                variants = (0, 1) if opt.moe_ep_overlap_both and can else (int(can and name == names[-1]),)
                out.extend((ep, etp, MOE_DISPATCHERS.index(name), overlap) for overlap in variants)
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


# The per-block factors, in row order (the first varies slowest), and the LayoutBatch columns
# each one sets; the block sets dp, tp, pp, vpp, cp and the embedding/loss accounting.
FACTORS: tuple[str, ...] = ("experts", "recompute", "mbs", "zero", "tp_modes", "cp_modes")
FACTOR_COLUMNS: dict[str, tuple[str, ...]] = {
    "experts": ("ep", "etp", "moe_dispatcher", "moe_ep_overlap"), "recompute": ("recompute", "recompute_layers", "recompute_modules"),
    "mbs": ("mbs", "num_microbatches"), "zero": ("zero",), "tp_modes": ("sp", "tp_comm_overlap"),
    "cp_modes": ("cp_comm", "cp_a2a"),
}
_COLUMNS = 19  # dp tp pp vpp cp ep etp mbs sp zero recompute recompute_layers accounted modules overlap cp_comm cp_a2a
#               moe_dispatcher moe_ep_overlap


@dataclass(frozen=True)
class Block:
    """One (tp, cp, pp, vpp, accounted) combination of the space and its factors: ``values``
    maps each name of :data:`FACTORS` to its values, one row each (``(k, c)`` int64; experts
    ``(ep, etp, dispatcher, EP overlap)``, recompute ``(code, layers, module mask)``, mbs ``(mbs,)``, zero ``(zero,)``,
    tp_modes ``(sp, overlap)``, cp_modes ``(cp_comm, cp_a2a)``). Its layouts are the product of
    the factors, in :data:`FACTORS` order."""

    dp: int
    tp: int
    cp: int
    pp: int
    vpp: int
    accounted: int
    values: dict[str, np.ndarray]

    @property
    def size(self) -> int:
        """How many layouts the block holds (the product of its factor lengths)."""
        return math.prod(len(v) for v in self.values.values())

    def rows(self, index: dict[str, np.ndarray]) -> np.ndarray:
        """The block's layouts at the factor indices ``index`` (name -> ``(n,)`` int arrays, one
        per factor), as an ``(n, 19)`` int64 array of :func:`batch_of` columns."""
        n = len(index["mbs"])
        return assemble(np.broadcast_to(self.scalars, (n, 6)), {f: self.values[f][index[f]] for f in FACTORS})

    @property
    def scalars(self) -> np.ndarray:
        """``(dp, tp, pp, vpp, cp, accounted)`` as a ``(6,)`` int64 array."""
        return np.asarray((self.dp, self.tp, self.pp, self.vpp, self.cp, self.accounted), dtype=np.int64)

    def all_rows(self) -> np.ndarray:
        """Every layout of the block (:meth:`rows` over the full product)."""
        return self.rows(dict(zip(FACTORS, _product(*(np.arange(len(self.values[f])) for f in FACTORS)))))


def assemble(scalars: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    """``(n, 19)`` rows of :func:`batch_of` columns from the blocks' ``(n, 6)`` ``scalars``
    (:attr:`Block.scalars`) and each factor's ``(n, c)`` values (see :class:`Block`)."""
    a = np.empty((_COLUMNS, len(scalars)), dtype=np.int64).T  # column-major: each column contiguous, as the costs read them
    a[:, :5], a[:, 12] = scalars[:, :5], scalars[:, 5]
    a[:, 5:7], a[:, 17:19] = values["experts"][:, :2], values["experts"][:, 2:]
    a[:, 7], a[:, 9] = values["mbs"][:, 0], values["zero"][:, 0]
    a[:, 8], a[:, 14], a[:, 15:17] = values["tp_modes"][:, 0], values["tp_modes"][:, 1], values["cp_modes"]
    a[:, 10:12], a[:, 13] = values["recompute"][:, :2], values["recompute"][:, 2]
    return a


def blocks(p: Problem, opt: SpaceOptions | None = None) -> list[Block]:
    """The blocks of the space of ``p`` (see :class:`Block`), in enumeration order.

    Raises:
        AutoparError: more than :data:`MAX_BLOCKS` blocks (a device count with very many divisors).
    """
    opt = opt or SpaceOptions()
    grid = _grid(p, opt)
    if len(grid) > MAX_BLOCKS:
        raise AutoparError(
            f"--nodes x --devices-per-node = {p.world_size} devices: {p.model.name}'s layout space there has "
            f"{len(grid):,} (tp, cp, pp, vpp) blocks, more than the {MAX_BLOCKS:,} autopar searches; plan fewer "
            "devices or a count with fewer divisors (e.g. a power of two)")
    out = _blocks_of(p, grid, opt)
    if sum(b.size for b in out) > MAX_LAYOUTS and len(opt.moe_dispatchers) > 1:
        # too many with every MoE dispatcher: keep the target's preferred one (the last) with its overlap
        return _blocks_of(p, grid, replace(opt, moe_dispatchers=opt.moe_dispatchers[-1:]))
    return out


def _blocks_of(p: Problem, grid: list[tuple[int, int, int, int, int]], opt: SpaceOptions) -> list[Block]:
    """The :class:`Block` of each (tp, cp, pp, vpp, accounted) of ``grid`` (:func:`_grid`) under ``opt``."""
    mbs, zero = np.asarray(opt.mbs, dtype=np.int64)[:, None], np.asarray(opt.zero, dtype=np.int64)[:, None]
    out = []
    experts, recompute, modes = {}, {}, {}  # by (tp, pp, vpp); by (pp, vpp); by (tp, cp)
    for tp, cp, pp, vpp, accounted in grid:
        if (tp, pp, vpp) not in experts:
            experts[tp, pp, vpp] = np.asarray(_expert_options(p, tp, pp, vpp, opt), dtype=np.int64)
        if (pp, vpp) not in recompute:
            recompute[pp, vpp] = np.asarray(_recompute_options(p, pp, vpp, opt), dtype=np.int64)
        if (tp, cp) not in modes:
            modes[tp, cp] = (_tp_modes(tp, opt), _cp_modes(cp, tp, p.cluster.fast_domain_size, opt))
        values = {"experts": experts[tp, pp, vpp], "recompute": recompute[pp, vpp], "mbs": mbs, "zero": zero,
                  "tp_modes": modes[tp, cp][0], "cp_modes": modes[tp, cp][1]}
        out.append(Block(p.world_size // (tp * cp * pp), tp, cp, pp, vpp, accounted, values))
    return out


def check_size(p: Problem, rows: int, what: str = "candidate") -> None:
    """Refuse a space of more than :data:`MAX_LAYOUTS` layouts held in memory.

    Raises:
        AutoparError: naming the device count (--nodes x --devices-per-node) and the layouts.
    """
    if rows > MAX_LAYOUTS:  # 720,720 devices (240 divisors) asked numpy for 22.8 GiB and crashed
        raise AutoparError(
            f"--nodes x --devices-per-node = {p.world_size} devices: {p.model.name}'s layout space there has "
            f"{rows:,} {what} layouts, more than the {MAX_LAYOUTS:,} autopar holds in memory; plan fewer "
            "devices or a count with fewer divisors (e.g. a power of two)")


def batch_of(p: Problem, a: np.ndarray) -> LayoutBatch:
    """The :class:`LayoutBatch` of the ``(n, 19)`` rows ``a`` (:meth:`Block.rows`); its columns
    are contiguous (copied column-major where ``a`` is not): the costs read them column by
    column, about twice as fast as through a row-major array's strides."""
    a = np.asfortranarray(a)
    gbs = p.train.global_batch_size
    return LayoutBatch(
        dp=a[:, 0], tp=a[:, 1], pp=a[:, 2], vpp=a[:, 3], cp=a[:, 4], ep=a[:, 5], etp=a[:, 6],
        mbs=a[:, 7], sp=a[:, 8].astype(bool), zero=a[:, 9], recompute=a[:, 10],
        recompute_layers=a[:, 11], num_microbatches=gbs // (a[:, 7] * a[:, 0]),
        account_embedding=a[:, 12].astype(bool), account_loss=a[:, 12].astype(bool), recompute_modules=a[:, 13],
        tp_comm_overlap=a[:, 14].astype(bool), cp_comm=a[:, 15], cp_a2a=a[:, 16],
        moe_dispatcher=a[:, 17], moe_ep_overlap=a[:, 18].astype(bool),
    )


def enumerate_layouts(p: Problem, opt: SpaceOptions | None = None) -> LayoutBatch:
    """Every candidate layout of the space, valid or not, as one batch.

    Built with numpy per (tp, cp, pp, vpp) block (:func:`blocks`); the row order is that of
    ``itertools.product`` over (ep/etp/dispatcher/EP overlap, recompute, mbs, zero, sp/overlap, CP
    algorithm), followed
    with ``galvatron_choices`` by Galvatron's variants (:func:`autopar.galvatron_space.add_variants`)
    and with ``v_schedules`` by the V-schedule copies (:func:`autopar.v_space.add_v_variants`).
    Without them the search enumerates only the valid layouts (:mod:`autopar.search.valid_space`);
    this full batch serves ``--explain``, ``--target galvatron`` and the tests.

    Raises:
        AutoparError: more than :data:`MAX_LAYOUTS` candidates (:func:`check_size`).
    """
    opt = opt or SpaceOptions()
    space = blocks(p, opt)
    check_size(p, sum(b.size for b in space))
    a = np.concatenate([b.all_rows() for b in space]) if space else np.zeros((0, _COLUMNS), dtype=np.int64)
    batch = batch_of(p, a)
    if opt.galvatron_choices:
        from autopar.galvatron_space import add_variants

        batch = add_variants(p, batch)
    if opt.v_schedules:
        from autopar.v_space import add_v_variants

        batch = add_v_variants(batch)
    return batch
