"""``LayerwisePlan``: one layout whose tensor-parallel degree, data-parallel type and
checkpointing may change from decoder layer to decoder layer.

The plan is Galvatron's hybrid-parallel strategy (Miao et al., VLDB 2023, sec. 3-4; the JSON that
``galvatron/core/runtime/hybrid_parallel_config.py`` reads): ``pp`` stages with a layer split, and
per layer ``tp`` with ``dp = world / (pp * tp)`` (the product dp x tp is the stage's devices, the
same for every layer), ZeRO-3 on or off (Galvatron's ``dp_types_enc``: 1 = sharded data parallel,
otherwise the global ``default_dp_type``: DDP = ZeRO-0 or ZeRO-2) and full checkpointing on or off.
Every layer runs ``num_microbatches`` micro-batches per step (Galvatron's ``chunks``), so a layer
with more tensor parallelism (fewer data-parallel replicas) has a larger micro-batch:
``mbs = global_batch / (dp * num_microbatches)``. The embedding and output layer have their own tp
(``vocab_tp``, Galvatron's ``vtp``) and ZeRO-3 switch (``embed_sdp``). ``sp`` is Megatron
sequence parallelism for every tp > 1 layer (Galvatron's runtime ``--sequence-parallel``).

A layer may split its ``tp`` ranks' work by sequence instead (``ulysses``, Galvatron's ``use_sp``:
DeepSpeed-Ulysses, Jacobs et al. 2023 sec. 3): the group of ``tp`` ranks holds whole weights and
1/tp of the sequence, exchanging heads by all-to-all around attention; its costs are those of the
uniform layout with tp 1, ``cp = tp`` and cp_comm_type ``a2a`` (:func:`candidate_strategy`; ZeRO
then shards over all ``dp x tp`` ranks, Galvatron's sdp group of such a layer). Galvatron runs
Ulysses layers with sequence-sharded activations between layers (its Llama layer offsets the rotary
positions by the sp rank under ``--sequence-parallel``: ``models/llama_hf/LlamaModel_tensor_parallel.py``),
so a plan with Ulysses layers needs ``sp``; a Ulysses layer and a Megatron-TP layer of the same size
then hand over activations unchanged (``core/runtime/comm_groups.py``: no re-distribution between
groups of equal size and placement).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from autopar.errors import AutoparError
from autopar.problem import Problem
from autopar.strategy import Strategy, default_layers_per_stage


class LayerwisePlan(BaseModel):
    """A layer-wise layout (module docstring). Per-layer tuples have one entry per decoder layer.

    Raises (construction):
        ValueError: per-layer tuples of different lengths, a split that does not sum to them,
            or ``default_zero`` other than 0 or 2.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    pp: int = Field(gt=0)
    num_microbatches: int = Field(gt=0)
    layers_per_stage: tuple[int, ...]
    tp: tuple[int, ...]
    zero3: tuple[bool, ...]
    recompute: tuple[bool, ...]
    default_zero: int = 0
    vocab_tp: int = Field(default=1, gt=0)
    vocab_zero3: bool = False
    sp: bool = False
    ulysses: tuple[bool, ...] = ()  # per layer; empty: no Ulysses layer

    @model_validator(mode="before")
    @classmethod
    def _no_ulysses(cls, data):
        """An empty or missing ``ulysses`` is every layer without it."""
        if isinstance(data, dict) and not data.get("ulysses") and "tp" in data:
            data = {**data, "ulysses": (False,) * len(data["tp"])}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> LayerwisePlan:
        """Per-layer tuples agree in length; the split has pp positive parts summing to it;
        Ulysses layers have tp > 1 and the plan has sp."""
        n = len(self.tp)
        if len(self.zero3) != n or len(self.recompute) != n or len(self.ulysses) != n:
            raise ValueError(f"per-layer tp, zero3, recompute and ulysses must have one entry per layer "
                             f"(got {n}, {len(self.zero3)}, {len(self.recompute)}, {len(self.ulysses)})")
        if any(u and t == 1 for u, t in zip(self.ulysses, self.tp)):
            raise ValueError("a Ulysses layer (use_sp 1) splits the sequence over its tp ranks: it needs tp > 1")
        if any(self.ulysses) and not self.sp:
            raise ValueError("Ulysses layers (use_sp 1) run with sequence-sharded activations between layers, "
                             "Galvatron's --sequence-parallel: the plan needs sp")
        if len(self.layers_per_stage) != self.pp or sum(self.layers_per_stage) != n or min(self.layers_per_stage) < 1:
            raise ValueError(f"layers_per_stage {list(self.layers_per_stage)} must be {self.pp} positive parts "
                             f"summing to the {n} layers")
        if self.default_zero not in (0, 2):
            raise ValueError(f"default_zero={self.default_zero}: Galvatron's default data-parallel types are "
                             "ddp (0) and zero2 (2)")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.tp)

    def stage_slices(self) -> list[slice]:
        """The layers of each stage as slices of the per-layer tuples."""
        return stage_slices(self.layers_per_stage)

    def layer_zero(self, i: int) -> int:
        """ZeRO stage of layer ``i``: 3 where sharded, else the default type."""
        return 3 if self.zero3[i] else self.default_zero

    def candidate(self, p: Problem, tp: int, zero: int, recompute: bool, ulysses: bool = False) -> Strategy:
        """The uniform layout whose per-layer costs a layer with (tp, zero, recompute, ulysses)
        has in this plan: the plan's pp, split and micro-batch count, ``dp = world / (pp * tp)`` and
        ``mbs = gbs / (dp * num_microbatches)`` (Ulysses: :func:`candidate_strategy`).

        Raises:
            AutoparError: tp does not divide the stage's devices, or dp x num_microbatches does
                not divide the global batch.
        """
        return candidate_strategy(p, self.pp, self.num_microbatches, self.layers_per_stage, tp, zero, recompute,
                                  self.sp, ulysses)

    def check(self, p: Problem) -> None:
        """Raise unless ``p``'s model, world and batch fit the plan.

        Raises:
            AutoparError: a layer count other than the model's, or a layer whose tp leaves no
                whole data-parallel degree or micro-batch (see :meth:`candidate`).
        """
        if self.num_layers != p.model.num_layers:
            raise AutoparError(f"layer-wise plan has {self.num_layers} layers; {p.model.name} has "
                               f"{p.model.num_layers}")
        for t, u in sorted(set(zip(self.tp, self.ulysses)) | {(self.vocab_tp, False)}):
            self.candidate(p, t, self.default_zero, False, u)

    @classmethod
    def uniform(cls, p: Problem, s: Strategy) -> LayerwisePlan:
        """The layer-wise form of one uniform layout ``s`` (every layer the same; its stage
        recompute options as per-layer flags; its vocabulary tp; ZeRO-1 is not a Galvatron type
        and is refused).

        Raises:
            AutoparError: ``s`` uses vpp, cp, ep, selective recompute, ZeRO-1, a sequence-split
                vocabulary (``vocab_sp``) or non-consecutive TP groups, which a plan has not.
        """
        if (s.vpp > 1 or s.cp > 1 or s.ep > 1 or s.zero == 1 or "selective" in s.stage_recompute or s.vocab_sp
                or not s.tp_consecutive):
            raise AutoparError("a layer-wise plan has no vpp, cp, ep, ZeRO-1, selective recompute, vocab_sp or "
                               f"non-consecutive TP (layout: vpp={s.vpp} cp={s.cp} ep={s.ep} zero={s.zero} "
                               f"recompute={s.recompute} vocab_sp={s.vocab_sp} tp_consecutive={s.tp_consecutive})")
        split = s.layers_per_stage or default_layers_per_stage(p.model.num_layers, s.pp)
        flags: list[bool] = []
        for n, option in zip(split, s.stage_recompute):
            k = min(n, s.recompute_layers or n) if option == "full" else 0
            flags += [True] * k + [False] * (n - k)
        n = p.model.num_layers
        return cls(pp=s.pp, num_microbatches=s.num_microbatches(p.train.global_batch_size),
                   layers_per_stage=tuple(split), tp=(s.tp,) * n, zero3=(s.zero == 3,) * n, recompute=tuple(flags),
                   default_zero=0 if s.zero == 0 else 2, vocab_tp=s.vocab_tp_size, vocab_zero3=s.zero == 3, sp=s.sp)


def stage_slices(layers_per_stage: tuple[int, ...]) -> list[slice]:
    """Each stage's layers as a slice of the per-layer tuples (``layers_per_stage``: layers per stage)."""
    ends = np.cumsum(layers_per_stage)
    return [slice(int(e - n), int(e)) for n, e in zip(layers_per_stage, ends)]


def candidate_strategy(p: Problem, pp: int, num_microbatches: int, layers_per_stage: tuple[int, ...], tp: int,
                       zero: int, recompute: bool, sp: bool, ulysses: bool = False,
                       vocab_tp: int | None = None) -> Strategy:
    """The uniform layout of one per-layer choice (see :meth:`LayerwisePlan.candidate`); for a
    Ulysses layer (``ulysses``, tp > 1) tp 1 with ``cp = tp`` and cp_comm_type ``a2a`` (module
    docstring), the same dp and micro-batch. ``vocab_tp``: the embedding's and output layer's
    own tp (Galvatron's ``vtp``; None: the layers' tp), for a Megatron-TP layer only.

    Raises:
        AutoparError: ``pp * tp`` does not divide the world, or ``dp * num_microbatches`` does
            not divide the global batch.
    """
    world, gbs = p.world_size, p.train.global_batch_size
    if world % (pp * tp):
        raise AutoparError(f"tp={tp} with pp={pp}: pp*tp must divide the {world} devices")
    dp = world // (pp * tp)
    if gbs % (dp * num_microbatches):
        raise AutoparError(f"tp={tp}: dp={dp} x num_microbatches={num_microbatches} does not divide the global "
                           f"batch {gbs}")
    mbs, rec = gbs // (dp * num_microbatches), "full" if recompute else "none"
    if ulysses and tp > 1:
        return Strategy(dp=dp, tp=1, cp=tp, cp_comm_type="a2a", pp=pp, mbs=mbs, zero=zero, recompute=rec,
                        layers_per_stage=layers_per_stage)
    return Strategy(dp=dp, tp=tp, pp=pp, mbs=mbs, zero=zero, sp=sp and tp > 1, recompute=rec,
                    layers_per_stage=layers_per_stage, vocab_tp=vocab_tp)


def group_size(s: Strategy) -> int:
    """The ranks a layer of uniform layout ``s`` splits its work over: tp, or cp for a Ulysses layer."""
    return s.tp * s.cp
