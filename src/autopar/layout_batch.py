"""``LayoutBatch``: many layouts as numpy columns, one per :class:`~autopar.strategy.Strategy` field.

The cost model works on a batch: the search costs every candidate at once and ``autopar estimate``
costs a batch of one, so both share one implementation of every formula.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from autopar.strategy import (CP_COMM_TYPES, DEFAULT_MODULE_MASK, DEFAULT_RECOMPUTE_MODULES, MOE_DISPATCHERS,
                              RECOMPUTE_CODES, RECOMPUTE_MODULES, RECOMPUTE_NAMES, V_SCHEDULE_NAMES, Strategy,
                              default_layers_per_stage, module_mask, module_names)


@dataclass
class LayoutBatch:
    """Columns of ``n`` layouts (each an int/bool numpy array of shape ``(n,)``).

    ``recompute`` holds :data:`RECOMPUTE_CODES`; ``recompute_layers`` 0 means "all layers";
    ``etp`` is already resolved (never None). ``num_microbatches`` is gbs / (mbs * dp).
    ``account_embedding`` / ``account_loss`` (bool) are :attr:`Strategy.account_for_embedding`
    / ``account_for_loss``; omitted, they are all False. ``recompute_modules`` is the bit mask
    (:func:`module_mask`) of :attr:`Strategy.recompute_modules`; omitted, ``core_attn``.
    ``tp_comm_overlap`` (bool), ``cp_comm`` (index into :data:`CP_COMM_TYPES`) and ``cp_a2a`` (the
    all-to-all group size, :attr:`Strategy.cp_a2a_size`); omitted: off, p2p, 1. ``moe_dispatcher``
    (index into :data:`MOE_DISPATCHERS`) and ``moe_ep_overlap`` (bool); omitted: alltoall, off. Galvatron's knobs
    (:class:`Strategy`): ``gpipe`` (bool, the GPipe schedule), ``vocab_tp`` (int, resolved),
    ``vocab_sp`` (bool), ``tp_consecutive`` (bool); omitted: 1F1B, tp, off, on. ``v_schedule``
    (int): 0, or 1 + the index into :data:`V_SCHEDULE_NAMES` (torchtitan's ZB-V / DualPipeV on
    vpp 2); omitted: 0.
    """

    dp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    mbs: np.ndarray
    sp: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    recompute_layers: np.ndarray
    num_microbatches: np.ndarray
    account_embedding: np.ndarray | None = None
    account_loss: np.ndarray | None = None
    recompute_modules: np.ndarray | None = None
    tp_comm_overlap: np.ndarray | None = None
    cp_comm: np.ndarray | None = None
    cp_a2a: np.ndarray | None = None
    moe_dispatcher: np.ndarray | None = None
    moe_ep_overlap: np.ndarray | None = None
    gpipe: np.ndarray | None = None
    vocab_tp: np.ndarray | None = None
    vocab_sp: np.ndarray | None = None
    tp_consecutive: np.ndarray | None = None
    v_schedule: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.dp.shape[0]
        for name in ("account_embedding", "account_loss", "tp_comm_overlap", "moe_ep_overlap", "gpipe", "vocab_sp"):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(n, dtype=bool))
        if self.vocab_tp is None:
            self.vocab_tp = self.tp.copy()
        if self.tp_consecutive is None:
            self.tp_consecutive = np.ones(n, dtype=bool)
        if self.recompute_modules is None:
            self.recompute_modules = np.full(n, DEFAULT_MODULE_MASK, dtype=np.int64)
        if self.cp_comm is None:
            self.cp_comm = np.zeros(n, dtype=np.int64)
        if self.cp_a2a is None:
            self.cp_a2a = np.ones(n, dtype=np.int64)
        if self.moe_dispatcher is None:
            self.moe_dispatcher = np.zeros(n, dtype=np.int64)
        if self.v_schedule is None:
            self.v_schedule = np.zeros(n, dtype=np.int64)

    def dispatcher_is(self, name: str) -> np.ndarray:
        """Where the MoE token dispatcher is ``name`` (one of :data:`MOE_DISPATCHERS`; bool ``(n,)``)."""
        return self.moe_dispatcher == MOE_DISPATCHERS.index(name)

    def cp_comm_is(self, name: str) -> np.ndarray:
        """Where the context-parallel algorithm is ``name`` (one of :data:`CP_COMM_TYPES`; bool ``(n,)``)."""
        return self.cp_comm == CP_COMM_TYPES.index(name)

    def module_on(self, name: str) -> np.ndarray:
        """Where selective recompute re-runs module ``name`` (bool, ``(n,)``; whether a row
        recomputes selectively at all is ``recompute == 1``)."""
        return (self.recompute_modules >> RECOMPUTE_MODULES.index(name) & 1).astype(bool)

    @property
    def accounted(self) -> np.ndarray:
        """Where the split counts the embedding or the loss as a layer (bool, ``(n,)``)."""
        return self.account_embedding | self.account_loss

    def __len__(self) -> int:
        return int(self.dp.shape[0])

    @property
    def interleaved(self) -> np.ndarray:
        """Where the row runs Megatron's interleaved 1F1B (vpp > 1 and no V schedule)."""
        return (self.vpp > 1) & (self.v_schedule == 0)

    @property
    def v_shaped(self) -> np.ndarray:
        """Where the row runs a V schedule (ZB-V or DualPipeV; bool ``(n,)``)."""
        return self.v_schedule > 0

    def v_schedule_is(self, name: str) -> np.ndarray:
        """Where the row runs V schedule ``name`` (one of :data:`V_SCHEDULE_NAMES`; bool ``(n,)``)."""
        return self.v_schedule == 1 + V_SCHEDULE_NAMES.index(name)

    @property
    def schedule_code(self) -> np.ndarray:
        """The schedule of each row as a code: 0 1F1B, 1 interleaved, 2 GPipe, 3 ZB-V, 4 DualPipeV
        (``--schedule``)."""
        return np.where(self.v_schedule > 0, 2 + self.v_schedule,
                        np.where(self.vpp > 1, 1, np.where(self.gpipe, 2, 0)))

    def schedule_name(self, i: int) -> str:
        """Row ``i``'s :attr:`Strategy.schedule`."""
        if self.v_schedule[i] > 0:
            return V_SCHEDULE_NAMES[int(self.v_schedule[i]) - 1]
        return "interleaved" if self.vpp[i] > 1 else "gpipe" if self.gpipe[i] else "1f1b"

    def take(self, index: np.ndarray) -> "LayoutBatch":
        """The sub-batch at ``index`` (boolean mask or integer indices)."""
        return LayoutBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @classmethod
    def concat(cls, batches: list["LayoutBatch"]) -> "LayoutBatch":
        """The rows of ``batches`` one after the other (the batch itself when there is one)."""
        if len(batches) == 1:
            return batches[0]
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in batches]) for f in fields(cls)})

    @classmethod
    def from_strategy(cls, s: Strategy, global_batch_size: int) -> "LayoutBatch":
        """A batch of one (``schedule`` and ``layers_per_stage`` are checked by the rules)."""
        col = lambda v, dtype=np.int64: np.asarray([v], dtype=dtype)  # noqa: E731
        return cls(
            dp=col(s.dp), tp=col(s.tp), pp=col(s.pp), vpp=col(s.vpp), cp=col(s.cp), ep=col(s.ep),
            etp=col(s.expert_tp), mbs=col(s.mbs), sp=col(s.sp, bool), zero=col(s.zero),
            recompute=col(RECOMPUTE_CODES[s.recompute]),
            recompute_layers=col(s.recompute_layers or 0),
            num_microbatches=col(global_batch_size // (s.mbs * s.dp)),
            account_embedding=col(s.account_for_embedding, bool), account_loss=col(s.account_for_loss, bool),
            recompute_modules=col(module_mask(s.recompute_modules)),
            tp_comm_overlap=col(s.tp_comm_overlap, bool), cp_comm=col(CP_COMM_TYPES.index(s.cp_comm_type)),
            cp_a2a=col(s.cp_a2a_size), moe_dispatcher=col(MOE_DISPATCHERS.index(s.moe_dispatcher)),
            moe_ep_overlap=col(s.moe_ep_overlap, bool), gpipe=col(s.schedule == "gpipe", bool), vocab_tp=col(s.vocab_tp_size),
            vocab_sp=col(s.vocab_sp, bool), tp_consecutive=col(s.tp_consecutive, bool),
            v_schedule=col(1 + V_SCHEDULE_NAMES.index(s.schedule) if s.schedule in V_SCHEDULE_NAMES else 0),
        )

    def strategy(self, i: int, num_layers: int, mtp_num_layers: int = 0) -> Strategy:
        """Row ``i`` as a :class:`Strategy` with its default stage split written out (a flexible
        ``pipeline_layout`` where the default split cannot interleave:
        :func:`autopar.pipeline.layout.default_layout`)."""
        from autopar.pipeline.layout import default_layout, split_fields

        pp, vpp = int(self.pp[i]), int(self.vpp[i])
        recompute = RECOMPUTE_NAMES[int(self.recompute[i])]
        embedding, loss = bool(self.account_embedding[i]), bool(self.account_loss[i])
        split = ({"layers_per_stage": default_layers_per_stage(num_layers, pp, embedding, loss)} if embedding or loss
                 else split_fields(default_layout(num_layers, pp, vpp, mtp_num_layers)))
        return Strategy(
            dp=int(self.dp[i]), tp=int(self.tp[i]), pp=pp, vpp=vpp, cp=int(self.cp[i]),
            ep=int(self.ep[i]), etp=int(self.etp[i]), mbs=int(self.mbs[i]), sp=bool(self.sp[i]),
            zero=int(self.zero[i]), recompute=recompute,
            recompute_layers=int(self.recompute_layers[i]) or None,
            schedule=self.schedule_name(i),
            **split,
            recompute_modules=module_names(int(self.recompute_modules[i])) if recompute == "selective"
            else DEFAULT_RECOMPUTE_MODULES,
            account_for_embedding=embedding, account_for_loss=loss,
            tp_comm_overlap=bool(self.tp_comm_overlap[i]), cp_comm_type=CP_COMM_TYPES[int(self.cp_comm[i])],
            cp_a2a=int(self.cp_a2a[i]) if CP_COMM_TYPES[int(self.cp_comm[i])] == "a2a+p2p" else None,
            moe_dispatcher=MOE_DISPATCHERS[int(self.moe_dispatcher[i])], moe_ep_overlap=bool(self.moe_ep_overlap[i]),
            vocab_tp=None if self.vocab_tp[i] == self.tp[i] else int(self.vocab_tp[i]), vocab_sp=bool(self.vocab_sp[i]),
            tp_consecutive=bool(self.tp_consecutive[i]),
        )
