"""Per-layer time and memory table of a layout, taken from the analytic cost model.

The balancer needs, for every decoder layer and every recompute option (none / selective /
full), the per-micro-batch forward, backward and recompute seconds, the activation bytes kept
per micro-batch and the model-state bytes, plus what each pipeline stage carries whatever its
layers (embedding on the first, output layer, loss and logits on the last, framework overhead,
the rebuilt layer under full recompute). Every term of :func:`autopar.cost.stage_time.stage_time`
and :func:`autopar.cost.memory.stage_memory` is linear in the stage's layers apart from these
fixed parts, so the table is read off the cost model itself: a stage with one layer minus the
same stage with none gives the layer's share, and a stage with no layer gives the fixed part.

Communication (TP, CP, EP) is shared out over forward, backward and recompute in proportion to
their compute, so each op's time includes its collectives and their sum is the stage total.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopar.cost.memory import in_flight_microbatches, stage_memory
from autopar.cost.stage import Stages
from autopar.cost.stage_time import p2p_time_s, stage_time
from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.pipeline.layout import layout_of
from autopar.problem import Problem
from autopar.strategy import RECOMPUTE_NAMES, V_SCHEDULE_NAMES, Strategy, module_mask


@dataclass(frozen=True)
class LayerTable:
    """Costs of ``L`` layers under ``R = len(options)`` recompute options on ``pp`` stages.

    Attributes:
        options: recompute option names, columns of the ``(., R)`` arrays.
        forward_s, backward_s, recompute_s: ``(L, R)`` seconds per micro-batch per layer.
        activation_bytes: ``(L, R)`` bytes one micro-batch keeps per layer until its backward.
        static_bytes: ``(L,)`` weights, gradients and optimizer state per layer per device.
        stage_forward_s, stage_backward_s, stage_recompute_s: ``(pp, R)`` fixed seconds per
            micro-batch of each stage (embedding on stage 0, output layer and loss on the last).
        stage_bytes: ``(pp, R)`` fixed bytes of each stage (embedding/output weights and their
            states, token ids and logits, overhead, the layer rebuilt under full recompute).
        p2p_s: one activation transfer between adjacent stages (seconds).
        memory_limit_bytes: usable memory per device.
    """

    options: tuple[str, ...]
    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray
    activation_bytes: np.ndarray
    static_bytes: np.ndarray
    stage_forward_s: np.ndarray
    stage_backward_s: np.ndarray
    stage_recompute_s: np.ndarray
    stage_bytes: np.ndarray
    p2p_s: float
    memory_limit_bytes: float

    @property
    def num_layers(self) -> int:
        return int(self.forward_s.shape[0])

    @property
    def pp(self) -> int:
        return int(self.stage_bytes.shape[0])

    @property
    def layer_time_s(self) -> np.ndarray:
        """``(L, R)`` forward + backward + recompute seconds per micro-batch."""
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def stage_time_s(self) -> np.ndarray:
        """``(pp, R)`` fixed seconds per micro-batch of each stage."""
        return self.stage_forward_s + self.stage_backward_s + self.stage_recompute_s

    def option_index(self, name: str) -> int:
        """Column of recompute option ``name``.

        Raises:
            AutoparError: ``name`` is not one of :attr:`options`.
        """
        if name not in self.options:
            raise AutoparError(f"recompute={name!r}: this layer table has {', '.join(self.options)}")
        return self.options.index(name)


def op_times_s(p: Problem, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """``(3, n)`` forward, backward, recompute seconds with communication shared out."""
    t = stage_time(p, batch, stages)
    compute = np.stack([t.forward_s, t.backward_s, t.recompute_s])
    total_compute = compute.sum(axis=0)
    comm = t.total_s - total_compute
    share = np.divide(compute, total_compute, out=np.zeros_like(compute), where=total_compute > 0)
    share[0] = np.where(total_compute > 0, share[0], 1.0)  # no compute: collectives count as forward
    return compute + share * comm


def _without_layers(stages: Stages) -> Stages:
    """``stages`` with no decoder layer: each stage's fixed part (embedding, output layer, loss)."""
    return Stages(index=stages.index, start=stages.start, layers=np.zeros_like(stages.layers), mtp=stages.mtp)


def _concat_stages(parts: list[Stages]) -> Stages:
    """The rows of ``parts`` one after another (``mtp`` kept only where every part has it,
    ``in_flight`` left out)."""
    mtp = None if any(x.mtp is None for x in parts) else np.concatenate([x.mtp for x in parts])
    return Stages(index=np.concatenate([x.index for x in parts]), start=np.concatenate([x.start for x in parts]),
                  layers=np.concatenate([x.layers for x in parts]), mtp=mtp)


def chunk_op_times_s(p: Problem, s: Strategy, batch: LayoutBatch, stages: Stages) -> np.ndarray:
    """``(3, pp, vpp)`` forward, backward, recompute seconds per micro-batch of each model chunk.

    ``batch``/``stages``: every stage of ``s`` (:func:`autopar.cost.stage.all_stages`). A
    stage's time is its fixed part (the stage with no layer: embedding, output layer and loss)
    plus its layers' share, linear in the layers (module docstring). The layers' share goes to
    the chunks in proportion to their decoder layers (:func:`autopar.pipeline.layout.layout_of`:
    equal, accounted, or any flexible layout); the fixed part to the chunk that holds it: chunk 0
    of each rank, chunk vpp-1 of the last rank (output layer and loss) and of the rank holding
    the MTP layers, as in :mod:`autopar.pipeline.balance`. Under a V schedule (ZB-V, DualPipeV)
    rank 0 holds the first and the last virtual stage, and its fixed part (embedding, output
    layer, loss) goes to its chunk 1 (:mod:`autopar.pipeline.placement`).
    """
    return chunk_op_times_many_s(p, [(s, batch, stages)])[0]


def chunk_op_times_many_s(p: Problem, layouts: list[tuple[Strategy, LayoutBatch, Stages]]) -> list[np.ndarray]:
    """:func:`chunk_op_times_s` of each ``(s, batch, stages)``, ``(3, pp, vpp)`` each: the stages
    of all layouts, with and without their layers, costed in one :func:`op_times_s` pass (every
    cost term is row-wise, so each layout gets exactly what it gets alone). Layouts whose stages
    differ in having ``mtp`` are costed in separate passes; ``in_flight`` is left out (it enters
    memory, not time)."""
    out: list[np.ndarray | None] = [None] * len(layouts)
    kinds: dict[bool, list[int]] = {}
    for i, (_, _, stages) in enumerate(layouts):
        kinds.setdefault(stages.mtp is None, []).append(i)
    for members in kinds.values():
        batches = [layouts[i][1] for i in members]
        views = [layouts[i][2] for i in members]
        op = op_times_s(p, LayoutBatch.concat(batches + batches),
                        _concat_stages(views + [_without_layers(v) for v in views]))
        bounds = np.cumsum([0] + [len(b) for b in batches] * 2)
        k = len(members)
        for j, i in enumerate(members):
            out[i] = _chunk_times(p, layouts[i][0], layouts[i][2], op[:, bounds[j]:bounds[j + 1]],
                                  op[:, bounds[k + j]:bounds[k + j + 1]])
    return out  # type: ignore[return-value]


def _chunk_times(p: Problem, s: Strategy, stages: Stages, op: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """``(3, pp, vpp)`` chunk times of ``s`` from its stages' op times ``op`` and those of the
    same stages without layers ``fixed`` (``(3, pp)`` each; see :func:`chunk_op_times_s`)."""
    per_layer = (op - fixed) / np.maximum(stages.layers, 1)
    layout = layout_of(p, s)
    out = per_layer[:, :, None] * layout.decoder[None].astype(np.float64)
    holder = np.zeros(s.pp, dtype=np.int64)
    holder[-1] = s.vpp - 1 if s.pp > 1 else 0
    holder[layout.mtp_rank] = s.vpp - 1 if s.pp > 1 else 0
    if s.schedule in V_SCHEDULE_NAMES:  # V placement: the last virtual stage is rank 0's chunk 1
        holder[:] = 0
        holder[0] = 1
    out[:, np.arange(s.pp), holder] += fixed
    return out


def module_set_option(modules: tuple[str, ...]) -> str:
    """The option name of selective recompute of ``modules``, e.g. ``selective:core_attn+mlp``."""
    return "selective:" + "+".join(modules)


def layer_table(p: Problem, s: Strategy, memory_limit_bytes: float | None = None,
                module_sets: tuple[tuple[str, ...], ...] = ()) -> LayerTable:
    """The per-layer table of layout ``s`` (its pp, vpp, tp, ... ; its recompute is replaced by
    each of none / selective / full-on-every-layer in turn, then by selective recompute of each
    of ``module_sets``, Megatron-LM's ``--recompute-modules``, as options named by
    :func:`module_set_option`; ``selective`` re-runs ``s.recompute_modules``).

    Args:
        memory_limit_bytes: usable bytes per device (default: the device's memory).

    Raises:
        AutoparError: ``memory_limit_bytes`` is not positive.
    """
    return layer_tables(p, [s], [memory_limit_bytes], module_sets)[0]


def layer_tables(p: Problem, shapes: list[Strategy], memory_limits_bytes: list[float | None],
                 module_sets: tuple[tuple[str, ...], ...] = ()) -> list[LayerTable]:
    """:func:`layer_table` of each of ``shapes`` with its memory limit (None: the device's
    memory): the rows of all tables are costed in one :func:`op_times_s` and one
    :func:`~autopar.cost.memory.stage_memory` pass (every cost term is row-wise, so each table
    equals the one built alone).

    Raises:
        AutoparError: a memory limit is not positive.
    """
    limits = [p.cluster.device.memory_bytes if x is None else float(x) for x in memory_limits_bytes]
    for limit in limits:
        if not limit > 0:
            raise AutoparError(f"memory_limit_bytes={limit}: must be positive")
    if not shapes:
        return []
    names = RECOMPUTE_NAMES + tuple(module_set_option(m) for m in module_sets)
    num_layers, num_options = p.model.num_layers, len(names)
    ones = [LayoutBatch.from_strategy(s, p.train.global_batch_size) for s in shapes]
    parts = [_table_rows(p, s, one, module_sets) for s, one in zip(shapes, ones)]
    batch = LayoutBatch.concat([b for b, _ in parts])
    stages = _concat_stages([v for _, v in parts])
    times_all = op_times_s(p, batch, stages)
    mem_all = stage_memory(p, batch, stages)
    k = len(shapes)
    in_flight_all = in_flight_microbatches(LayoutBatch.concat(ones), Stages(
        np.zeros(k, np.int64), np.zeros(k, np.int64), np.ones(k, np.int64)))
    bounds = np.cumsum([0] + [len(b) for b, _ in parts])
    with_layer, without = slice(0, num_layers), slice(num_layers, 2 * num_layers)
    out = []
    for j, (s, one, limit) in enumerate(zip(shapes, ones, limits)):
        rows = slice(bounds[j], bounds[j + 1])
        per_option = 2 * num_layers + s.pp
        times = times_all[:, rows].reshape(3, num_options, per_option)
        pick = lambda x: x[rows].reshape(num_options, per_option)  # noqa: E731
        static = pick(mem_all.weights_bytes + mem_all.grads_bytes + mem_all.optimizer_bytes)
        total, act = pick(mem_all.total_bytes), pick(mem_all.activations_bytes)
        layer_times = times[:, :, with_layer] - times[:, :, without]  # (3, R, L)
        stage_times = times[:, :, 2 * num_layers:]  # (3, R, pp)
        out.append(LayerTable(
            options=names,
            forward_s=layer_times[0].T, backward_s=layer_times[1].T, recompute_s=layer_times[2].T,
            activation_bytes=((act[:, with_layer] - act[:, without]) / in_flight_all[j]).T,
            static_bytes=static[0, with_layer] - static[0, without],
            stage_forward_s=stage_times[0].T, stage_backward_s=stage_times[1].T,
            stage_recompute_s=stage_times[2].T,
            stage_bytes=total[:, 2 * num_layers:].T,
            p2p_s=float(p2p_time_s(p, one)[0]) if s.pp > 1 else 0.0,
            memory_limit_bytes=limit,
        ))
    return out


def _table_rows(p: Problem, s: Strategy, one: LayoutBatch, module_sets: tuple[tuple[str, ...], ...]
                ) -> tuple[LayoutBatch, Stages]:
    """The rows :func:`layer_table` costs for ``s`` (``one``: ``s`` as a one-row batch): per
    option, L layer rows (stage 0 with one layer), L empty stage-0 rows, pp empty stages."""
    num_layers, pp = p.model.num_layers, s.pp
    num_options = len(RECOMPUTE_NAMES) + len(module_sets)
    per_option = 2 * num_layers + pp
    batch = one.take(np.zeros(num_options * per_option, dtype=np.int64))
    codes = np.concatenate([np.arange(len(RECOMPUTE_NAMES)), np.ones(len(module_sets), dtype=np.int64)])
    masks = [int(one.recompute_modules[0])] * len(RECOMPUTE_NAMES) + [module_mask(m) for m in module_sets]
    batch.recompute = np.repeat(codes, per_option)
    batch.recompute_modules = np.repeat(np.array(masks, dtype=np.int64), per_option)
    batch.recompute_layers = np.where(batch.recompute == 2, num_layers, 0)
    layer = np.arange(num_layers)
    index = np.tile(np.concatenate([np.zeros(2 * num_layers, dtype=np.int64), np.arange(pp)]), num_options)
    start = np.tile(np.concatenate([layer, layer, np.zeros(pp, dtype=np.int64)]), num_options)
    count = np.tile(np.concatenate([np.ones(num_layers, dtype=np.int64), np.zeros(num_layers + pp, dtype=np.int64)]),
                    num_options)
    return batch, Stages(index=index, start=start, layers=count)
