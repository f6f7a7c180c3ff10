"""Per-layer costs of every layer-wise choice, read off autopar's cost model.

A choice is (tp, zero, recompute) for one decoder layer within a fixed ``pp``, stage split and
micro-batch count ``m`` (:class:`~autopar.layerwise.plan.LayerwisePlan`). Its costs are those of
the uniform layout :func:`~autopar.layerwise.plan.candidate_strategy` with that tp, zero and
recompute on every layer, taken layer by layer from :func:`autopar.pipeline.layers.layer_table`
(a stage with one layer minus the same stage with none; every stage term is linear in its
layers). The once-per-step terms, :func:`autopar.cost.stage_time.dp_exposed_s` and
:func:`~autopar.cost.stage_time.optimizer_time_s`, are not linear (the data-parallel traffic
hides behind the stage's backward, a max): each layer gets an equal share of its stage's under
that choice (the whole stage's less the empty stage's), so a plan's per-layer sums give back the
uniform layout's step exactly, and a mixed stage is costed by interpolating between uniform
ones (Galvatron's per-layer time model, Miao et al. VLDB 2023 sec. 4.2, likewise adds each
layer's data-parallel time with its compute under one overlap coefficient).

A Ulysses layer's group of ``tp`` ranks counts as its size here (its uniform layout has tp 1 and
``cp = tp``: :func:`~autopar.layerwise.plan.candidate_strategy`).

The re-sharding between two consecutive layers of different tp (VLDB 2023 sec. 4.1, the
"transformation cost" of Eq. 2; Galvatron's ``dynamic_programming.py`` "inter-layer timecost
model") is one all-gather per micro-batch: from tp ``a`` to tp ``b > a`` each new tp group of
``b`` ranks spans ``b / a`` old groups that held different samples, so the activation of the
larger micro-batch, ``mbs_b * seq * hidden`` elements of 2 bytes (4 in fp32), is gathered over
``g = b / a`` ranks at stride ``a`` (:func:`autopar.cost.comm.all_gather_s`); the backward pass
splits the gradient locally. Going from ``b`` down to ``a`` costs the same gather in the backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost import comm
from autopar.cost import flops as F
from autopar.cost.memory import stage_memory
from autopar.cost.params import stage_params
from autopar.cost.stage import Stages
from autopar.cost.stage_time import dp_exposed_s, optimizer_time_s, p2p_time_s, stage_time, tied_embedding_grad_s
from autopar.errors import AutoparError
from autopar.layerwise.plan import candidate_strategy, group_size
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layers import op_times_s
from autopar.problem import Problem
from autopar.rules import RULES
from autopar.strategy import Strategy

NONE, FULL = 0, 2  # columns of layer_table used: Galvatron checkpoints whole layers or nothing


@dataclass(frozen=True)
class PairTable:
    """Costs of one (tp, zero) pair on every layer and stage; ``R = 2`` columns (no recompute,
    full recompute). Seconds, bytes; ``(L, 2)`` per layer, ``(pp, 2)`` per stage fixed part.

    Attributes:
        strategy: the uniform layout the costs come from (recompute none).
        microbatch_s: forward + backward + recompute per micro-batch of each layer.
        compute_parts_s: ``(3, L, 2)`` the forward, backward and recompute compute of
            ``microbatch_s`` (its communication is the rest), for the pipeline simulation
            (:func:`autopar.layerwise.evaluate.stage_op_times_s`).
        activation_bytes: what one micro-batch keeps per layer until its backward.
        static_bytes: ``(L,)`` weights, gradients, optimizer state per layer per device.
        step_s: data-parallel exposed time plus optimizer step per layer, once per step (the
            layer's share of its stage's).
        stage_microbatch_s, stage_bytes: the fixed part of each stage (embedding, output layer,
            loss, framework overhead); stage_compute_parts_s: ``(3, pp, 2)`` its forward, backward
            and recompute compute.
        stage_step_s: ``(pp,)`` the fixed part's data-parallel and optimizer time per step.
        whole_step_s: ``(pp, 2)`` the whole stage's (its layers with the fixed part), per option.
        p2p_s: one activation send between stages; tied_grad_s: the tied-embedding all-reduce.
        in_flight: ``(pp,)`` micro-batches whose activations each stage holds at its peak (1F1B).
    """

    strategy: Strategy
    microbatch_s: np.ndarray
    compute_parts_s: np.ndarray
    activation_bytes: np.ndarray
    static_bytes: np.ndarray
    step_s: np.ndarray
    stage_microbatch_s: np.ndarray
    stage_compute_parts_s: np.ndarray
    stage_bytes: np.ndarray
    stage_step_s: np.ndarray
    whole_step_s: np.ndarray
    p2p_s: float
    tied_grad_s: float
    in_flight: np.ndarray


_EXPLICIT_SPLIT_RULES = {"uneven_layer_split", "interleaved_layer_split"}  # the plan's split is explicit


def pair_tables(p: Problem, strategies: list[Strategy]) -> list[PairTable | None]:
    """The :class:`PairTable` of each uniform layout (recompute none; its pp, split, micro-batch
    count, tp, zero and sp), or None for one that breaks a rule of :mod:`autopar.rules` (its
    explicit split exempts it from the default-split rules, as in ``check_strategy``).

    One vectorised pass over every layout: per layout and per option (none, full) the rows of
    :func:`autopar.pipeline.layers.layer_table` (each layer alone on stage 0, the same stage
    empty, every stage empty) and every stage whole; the per-layer part is a row minus its empty
    stage, the once-per-step part (exposed data-parallel traffic, optimizer) the whole stage's
    less the empty stage's, shared equally by the stage's layers.
    """
    gbs, num_layers = p.train.global_batch_size, p.model.num_layers
    if not strategies:
        return []
    base = LayoutBatch.concat([LayoutBatch.from_strategy(s, gbs) for s in strategies])
    ok = np.ones(len(base), dtype=bool)
    for rule in RULES:
        if rule.name not in _EXPLICIT_SPLIT_RULES:
            ok &= np.asarray(rule.check(p, base), dtype=bool)
    keep = [j for j in range(len(strategies)) if ok[j]]
    if not keep:
        return [None] * len(strategies)
    layer = np.arange(num_layers)
    who, option, index, start, count = [], [], [], [], []
    for j in keep:
        split = np.asarray(strategies[j].layers_per_stage, dtype=np.int64)
        pp, first = len(split), np.concatenate([[0], np.cumsum(split)[:-1]])
        per_option = 2 * num_layers + 2 * pp
        for code in (NONE, FULL):
            who.append(np.full(per_option, j))
            option.append(np.full(per_option, code))
            index.append(np.concatenate([np.zeros(2 * num_layers, dtype=np.int64), np.arange(pp), np.arange(pp)]))
            start.append(np.concatenate([layer, layer, np.zeros(pp, dtype=np.int64), first]))
            count.append(np.concatenate([np.ones(num_layers, dtype=np.int64), np.zeros(num_layers + pp, dtype=np.int64),
                                         split]))
    rows = base.take(np.concatenate(who))
    rows.recompute = np.concatenate(option)
    rows.recompute_layers = np.where(rows.recompute == FULL, num_layers, 0)
    stages = Stages(index=np.concatenate(index), start=np.concatenate(start), layers=np.concatenate(count))
    times = op_times_s(p, rows, stages).sum(axis=0)
    mem = stage_memory(p, rows, stages)
    static = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
    total_bytes = mem.total_bytes  # a property summing the parts: once, not per layout
    params = stage_params(p, rows, stages)
    t = stage_time(p, rows, stages)
    compute = np.stack([t.forward_s, t.backward_s, t.recompute_s])  # (3, rows): the parts of ``times`` less comm
    slack = stages.index * (t.backward_s + t.recompute_s)  # as autopar.cost.step: the pipeline drain hides DP traffic
    per_step = dp_exposed_s(p, rows, params, t, slack) + optimizer_time_s(p, rows, params)
    p2p = p2p_time_s(p, base)
    tied = tied_embedding_grad_s(p, base)
    out: list[PairTable | None] = [None] * len(strategies)
    at = 0
    for j in keep:
        s = strategies[j]
        split = np.asarray(s.layers_per_stage, dtype=np.int64)
        per_option = 2 * num_layers + 2 * s.pp
        t, act, st, total, step = (x[at:at + 2 * per_option].reshape(2, per_option)
                                   for x in (times, mem.activations_bytes, static, total_bytes, per_step))
        parts = compute[:, at:at + 2 * per_option].reshape(3, 2, per_option)
        with_layer, without = slice(0, num_layers), slice(num_layers, 2 * num_layers)
        empty, whole = slice(2 * num_layers, 2 * num_layers + s.pp), slice(2 * num_layers + s.pp, None)
        # Once-per-step terms overlap across a stage's layers (a max with the stage's compute), so each layer
        # gets its stage's share: (the whole stage - the empty stage) / its layers, per stage of the split.
        stage_of = np.repeat(np.arange(s.pp), split)
        share = ((step[:, whole] - step[:, empty]) / np.maximum(split, 1))[:, stage_of]
        in_flight = np.minimum(s.pp - np.arange(s.pp), s.num_microbatches(gbs)).astype(np.float64)
        out[j] = PairTable(strategy=s, microbatch_s=(t[:, with_layer] - t[:, without]).T,
                           compute_parts_s=(parts[:, :, with_layer] - parts[:, :, without]).transpose(0, 2, 1),
                           stage_compute_parts_s=parts[:, :, empty].transpose(0, 2, 1),
                           activation_bytes=((act[:, with_layer] - act[:, without]) / in_flight[0]).T,
                           static_bytes=st[0, with_layer] - st[0, without], step_s=share.T,
                           stage_microbatch_s=t[:, empty].T, stage_bytes=total[:, empty].T, stage_step_s=step[0, empty],
                           whole_step_s=step[:, whole].T,
                           p2p_s=float(p2p[j]) if s.pp > 1 else 0.0, tied_grad_s=float(tied[j]), in_flight=in_flight)
        at += 2 * per_option
    return out


def pair_table(p: Problem, pp: int, num_microbatches: int, layers_per_stage: tuple[int, ...], tp: int, zero: int,
               sp: bool, ulysses: bool = False, vocab_tp: int | None = None) -> PairTable | None:
    """The costs of (tp, zero, ulysses) in this pp / split / micro-batch count, or None where the
    uniform layout breaks a rule of :mod:`autopar.rules` or the batch does not divide; with
    ``vocab_tp``, that layout with the vocabulary layers on their own tp (its stage fixed parts:
    :func:`autopar.layerwise.evaluate.fixed_parts`)."""
    try:
        s = candidate_strategy(p, pp, num_microbatches, layers_per_stage, tp, zero, False, sp, ulysses, vocab_tp)
    except AutoparError:
        return None
    return pair_tables(p, [s])[0]


def reshard_s(p: Problem, a: PairTable, b: PairTable) -> float:
    """Seconds per micro-batch to move the activation from a layer of ``a`` to one of ``b``
    (and its gradient back): 0 for equal group sizes (tp, or cp for a Ulysses layer:
    :func:`~autopar.layerwise.plan.group_size`), else one all-gather (module docstring)."""
    ta, tb = group_size(a.strategy), group_size(b.strategy)
    if ta == tb:
        return 0.0
    big = a if ta > tb else b
    elem = 4 if p.train.precision == "fp32" else F.BF16
    num_bytes = elem * big.strategy.mbs * p.train.seq_len * p.model.hidden_size
    return float(comm.all_gather_s(p, num_bytes, max(ta, tb) // min(ta, tb), min(ta, tb)))


@dataclass(frozen=True)
class Choices:
    """The per-layer choices of one search cell, flattened: choice ``k`` is pair ``pair[k]`` with
    recompute column ``col[k]`` (0 none, 1 full). Arrays ``(K, L)`` per layer, ``(K, K)``
    transitions (seconds per micro-batch)."""

    pairs: list[PairTable]
    pair: np.ndarray
    col: np.ndarray
    microbatch_s: np.ndarray
    activation_bytes: np.ndarray
    static_bytes: np.ndarray
    step_s: np.ndarray
    transition_s: np.ndarray

    @classmethod
    def of(cls, p: Problem, pairs: list[PairTable], recompute: bool = True) -> Choices:
        """Every pair with no recompute and (``recompute``) full recompute."""
        cols = [0, 1] if recompute else [0]
        pair = np.repeat(np.arange(len(pairs)), len(cols))
        col = np.tile(np.array(cols), len(pairs))
        pick = lambda name: np.stack([getattr(pairs[i], name)[:, c] for i, c in zip(pair, col)])
        memo: dict[tuple[int, int, int, int], float] = {}  # reshard depends on the two tp and micro-batches only
        key = lambda a, b: (group_size(a.strategy), group_size(b.strategy), a.strategy.mbs, b.strategy.mbs)  # noqa: E731
        moves = np.array([[memo[key(a, b)] if key(a, b) in memo else memo.setdefault(key(a, b), reshard_s(p, a, b))
                           for b in pairs] for a in pairs]).reshape(len(pairs), len(pairs))
        return cls(pairs=pairs, pair=pair, col=col, microbatch_s=pick("microbatch_s"),
                   activation_bytes=pick("activation_bytes"),
                   static_bytes=np.stack([pairs[i].static_bytes for i in pair]), step_s=pick("step_s"),
                   transition_s=moves[np.ix_(pair, pair)])
