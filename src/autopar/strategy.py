"""``Strategy``: one parallel layout (many of them as numpy arrays: :class:`autopar.layout_batch.LayoutBatch`).

The search costs tens of thousands of layouts at once, so the cost model works on arrays:
every field of :class:`Strategy` is a column of :class:`~autopar.layout_batch.LayoutBatch`. A single layout is a
batch of one, so the search and ``autopar estimate`` share one implementation of every formula.

Terms follow Megatron-LM: ``dp`` data parallel, ``tp`` tensor parallel (``sp`` = Megatron
sequence parallel), ``pp`` pipeline stages, ``vpp`` model chunks per pipeline rank (1 = no
interleaving), ``cp`` context parallel, ``ep``/``etp`` expert parallel and expert tensor
parallel, ``mbs`` micro-batch size, ``zero`` 0-3 (1 = Megatron distributed optimizer), and
activation recompute ``none``/``selective`` (Megatron's ``--recompute-modules``, core attention by
default)/``full`` (whole layers).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autopar.errors import AutoparError

# Layout fields are bounded like model sizes: the rules multiply them in int64 (etp*ep*pp,
# recompute_layers*vpp*pp), and a search result edited to 2^63 overflowed.
from autopar.specs.model import MAX_SIZE

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["1f1b", "interleaved", "gpipe", "zbv", "dualpipev"]
# The V-shape schedules torchtitan runs (``pipeline_parallel_schedule`` ZBVZeroBubble / DualPipeV):
# two chunks per rank on the V placement (:mod:`autopar.pipeline.placement`). A LayoutBatch holds
# 0 (none) or 1 + the index into this tuple.
V_SCHEDULE_NAMES: tuple[str, ...] = ("zbv", "dualpipev")
# Context-parallel attention algorithms, Megatron-LM's ``--cp-comm-type`` choices (TransformerEngine
# ``DotProductAttention`` ``cp_comm_type``): costs in :mod:`autopar.cost.cp_comm`. A LayoutBatch holds
# the index into this tuple.
CpCommType = Literal["p2p", "a2a", "allgather", "a2a+p2p"]
CP_COMM_TYPES: tuple[str, ...] = get_args(CpCommType)
# MoE token dispatchers, Megatron-LM's ``--moe-token-dispatcher-type alltoall|allgather`` and ``flex``
# with ``--moe-flex-dispatcher-backend deepep|hybridep``: costs in :mod:`autopar.cost.moe_dispatch`.
# A LayoutBatch holds the index into this tuple.
MoeDispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
MOE_DISPATCHERS: tuple[str, ...] = get_args(MoeDispatcher)
RECOMPUTE_CODES: dict[str, int] = {"none": 0, "selective": 1, "full": 2}
RECOMPUTE_NAMES: tuple[str, ...] = ("none", "selective", "full")
# Megatron-LM ``--recompute-modules`` values (arguments.py; ecosystem.md 1.2), in its order; what
# each frees and re-runs: autopar.cost.recompute. A LayoutBatch holds a set as a bit mask.
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"]
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)


def module_mask(names: tuple[str, ...]) -> int:
    """Bit mask of recompute module ``names`` (bit i = :data:`RECOMPUTE_MODULES` [i])."""
    return sum(1 << RECOMPUTE_MODULES.index(n) for n in set(names))


def module_names(mask: int) -> tuple[str, ...]:
    """The recompute modules of bit ``mask``, in :data:`RECOMPUTE_MODULES` order."""
    return tuple(n for i, n in enumerate(RECOMPUTE_MODULES) if mask >> i & 1)


DEFAULT_MODULE_MASK = module_mask(DEFAULT_RECOMPUTE_MODULES)


def parse_recompute_modules(text: str, option: str) -> tuple[str, ...]:
    """Megatron's ``--recompute-modules`` value (names separated by spaces or commas) as a tuple.

    Raises:
        AutoparError: no name, or a name outside :data:`RECOMPUTE_MODULES` (``option`` names the
            source in the message).
    """
    names = tuple(dict.fromkeys(text.replace(",", " ").split()))  # in order, duplicates dropped
    if not names or any(n not in RECOMPUTE_MODULES for n in names):
        raise AutoparError(f"{option}={text!r}: allowed {', '.join(RECOMPUTE_MODULES)} (one or more)")
    return names


class Strategy(BaseModel):
    """One parallel layout of a training job.

    ``etp=None`` means "same as tp", exactly as Megatron-Core's ``--expert-tensor-parallel-size``
    default. ``recompute_layers`` only applies to ``full`` recompute: the number of layers per
    pipeline stage (per model chunk) recomputed, Megatron's ``--recompute-method block
    --recompute-num-layers N``; ``None`` recomputes every layer (``uniform``, 1).
    ``layers_per_stage=None`` uses the default split (:func:`default_layers_per_stage`).

    ``recompute_per_stage``: one recompute option per pipeline stage (length ``pp``; with vpp
    a stage's chunks share it), as MindFormers/SAPP's per-stage ``recompute`` arrays and
    Galvatron's per-layer ``checkpoint`` flags express; ``None`` = ``recompute`` on every stage.
    When given, ``recompute`` is its heaviest entry (filled in when omitted: what a framework
    with one setting for all stages would need for the fullest stage), ``recompute_layers``
    must be None, and a tuple with one distinct value is stored as ``None`` with that
    ``recompute``. Megatron-LM, MindSpeed-LLM, torchtitan and DeepSpeed have one setting for
    all stages, so their writers refuse such a layout (:mod:`autopar.export.per_stage`).

    ``recompute_modules``: what ``selective`` recompute re-runs, Megatron's
    ``--recompute-modules`` (default ``core_attn``); other sets only with a selective stage.

    ``tp_comm_overlap``: the TP collectives run chunk by chunk under their GEMMs (Megatron
    ``--tp-comm-overlap``, Transformer Engine userbuffers; torchtitan
    ``parallelism.enable_async_tensor_parallel``; MindSpeed ``--use-ascend-mc2``): needs sequence
    parallelism (rule ``tp_comm_overlap_needs_sp``); time and memory in :mod:`autopar.cost.tp_overlap`.

    ``cp_comm_type`` / ``cp_a2a``: the context-parallel algorithm (:data:`CP_COMM_TYPES`, Megatron
    ``--cp-comm-type``; MindSpeed ``--context-parallel-algo``) and, for ``a2a+p2p``, the size of the
    inner all-to-all group (Megatron ``--hierarchical-context-parallel-sizes A P`` with ``A * P = cp``;
    MindSpeed ``--ulysses-degree-in-cp``); ``None`` = ``cp`` for ``a2a``, 1 for ``p2p``/``allgather``
    (:attr:`cp_a2a_size`). Costs: :mod:`autopar.cost.cp_comm`.

    ``moe_dispatcher`` / ``moe_ep_overlap``: the MoE token dispatcher (:data:`MOE_DISPATCHERS`) and
    the all-to-all of one micro-batch overlapped with another micro-batch's compute (Megatron
    ``--overlap-moe-expert-parallel-comm``); costs in :mod:`autopar.cost.moe_dispatch`, validity in
    :mod:`autopar.rules` (overlap needs ep > 1, alltoall or flex, no full recompute, vpp with pp > 1).

    ``schedule``: ``1f1b`` (vpp 1), ``interleaved`` (vpp > 1), Galvatron's ``gpipe`` (below), or
    torchtitan's V-shape zero-bubble schedules ``zbv`` (``ZBVZeroBubble``) and ``dualpipev``
    (``DualPipeV``), two chunks per rank with chunk 1 of rank ``r`` holding virtual stage
    ``2 pp - 1 - r`` (:mod:`autopar.pipeline.placement`; the other writers refuse them).

    ``pipeline_layout``: Megatron-LM's ``--pipeline-model-parallel-layout`` string (embedding,
    decoder, MTP layers and loss of every virtual stage; :mod:`autopar.pipeline.layout`), any
    split including unequal and empty chunks; it sets vpp and excludes ``layers_per_stage`` and
    the account flags. Every split form resolves to one
    :class:`~autopar.pipeline.layout.PipelineLayout` (:func:`autopar.pipeline.layout.layout_of`).

    Galvatron's own knobs (``hetu-galvatron`` 2.4.0 JSON strategy, :mod:`autopar.export.galvatron`;
    the other writers refuse anything but their defaults, :mod:`autopar.export.galvatron_only`):
    ``schedule='gpipe'`` (its ``pipeline_type`` gpipe: all forwards, then all backwards, so every
    stage holds all micro-batches' activations; Huang et al., NeurIPS 2019), ``vocab_tp`` (its
    ``vtp``: the tensor-parallel degree of the embedding and output layer, ``None`` = tp; their
    data-parallel group is then ``tp*dp*cp / vocab_tp`` ranks of the stage), ``vocab_sp`` (its
    ``vsp``: the vocabulary layers split the sequence over the ``vocab_tp`` ranks, DeepSpeed-Ulysses
    style, and keep whole weights) and ``tp_consecutive`` (its ``tp_consecutive_flags``: False puts
    the members of a TP group ``dp`` ranks apart and the DP group on consecutive ranks, so TP crosses
    nodes and DP stays inside one where ``tp*dp`` spans nodes). Costs: :mod:`autopar.cost.vocab`,
    :mod:`autopar.cost.placement`.

    ``account_for_embedding`` / ``account_for_loss``: Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
    (two flags, as there: either can be set alone). Each counts the input embedding (output
    layer + loss) as one more layer, ``L' = L + e + l``; every model chunk gets
    ``L' / (pp * vpp)`` slots and the first chunk of stage 0 (last chunk of stage pp-1) gives
    one slot to the embedding (loss). Source: Megatron-Core ``TransformerConfig.__post_init__``
    and ``transformer_block.get_num_layers_to_build``; ecosystem.md 1.3 rules 21-22 (not
    combinable with an uneven ``layers_per_stage``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    dp: int = Field(gt=0, le=MAX_SIZE)
    tp: int = Field(default=1, gt=0, le=MAX_SIZE)
    pp: int = Field(default=1, gt=0, le=MAX_SIZE)
    vpp: int = Field(default=1, gt=0, le=MAX_SIZE)
    cp: int = Field(default=1, gt=0, le=MAX_SIZE)
    ep: int = Field(default=1, gt=0, le=MAX_SIZE)
    etp: int | None = Field(default=None, gt=0, le=MAX_SIZE)
    mbs: int = Field(default=1, gt=0, le=MAX_SIZE)
    sp: bool = False
    zero: int = Field(default=1, ge=0, le=3)
    recompute: Recompute = "none"
    recompute_layers: int | None = Field(default=None, gt=0, le=MAX_SIZE)
    schedule: Schedule = "1f1b"
    layers_per_stage: tuple[int, ...] | None = None
    recompute_per_stage: tuple[Recompute, ...] | None = None
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=DEFAULT_RECOMPUTE_MODULES, min_length=1)
    account_for_embedding: bool = False
    account_for_loss: bool = False
    tp_comm_overlap: bool = False
    cp_comm_type: CpCommType = "p2p"
    cp_a2a: int | None = Field(default=None, gt=0, le=MAX_SIZE)
    pipeline_layout: str | None = Field(default=None, min_length=1, max_length=100_000)
    moe_dispatcher: MoeDispatcher = "alltoall"
    moe_ep_overlap: bool = False
    vocab_tp: int | None = Field(default=None, gt=0, le=MAX_SIZE)
    vocab_sp: bool = False
    tp_consecutive: bool = True

    @model_validator(mode="after")
    def _gpipe_without_chunks(self) -> "Strategy":
        """GPipe runs one model chunk per rank.

        Raises:
            ValueError: ``schedule='gpipe'`` with vpp > 1 (GPipe has no interleaving; Galvatron's
                ``pipeline_type`` gpipe, Huang et al. 2019).
        """
        if self.schedule == "gpipe" and self.vpp > 1:
            raise ValueError(f"schedule gpipe with vpp={self.vpp}: GPipe runs one model chunk per pipeline rank "
                             "(use vpp 1, or the interleaved schedule)")
        return self

    @model_validator(mode="after")
    def _v_schedules_two_chunks(self) -> "Strategy":
        """ZB-V and DualPipeV run exactly two chunks per rank.

        Raises:
            ValueError: ``schedule`` zbv or dualpipev with vpp other than 2 (PyTorch
                ``ScheduleZBVZeroBubble``: "ZBV requires exactly 2 stages per rank").
        """
        if self.schedule in V_SCHEDULE_NAMES and self.vpp != 2:
            raise ValueError(f"schedule {self.schedule} with vpp={self.vpp}: the V schedules run exactly 2 model chunks "
                             "per pipeline rank (PyTorch: 'requires exactly 2 stages per rank'); use vpp 2")
        return self

    @model_validator(mode="after")
    def _one_split_form(self) -> "Strategy":
        """``pipeline_layout`` replaces the other split fields, as in Megatron-LM.

        Raises:
            ValueError: ``pipeline_layout`` with ``layers_per_stage`` or the account flags
                (TransformerConfig: 'pipeline_model_parallel_layout cannot be set with other
                pipeline layout arguments').
        """
        if self.pipeline_layout is not None and (self.layers_per_stage is not None or self.account_for_embedding
                                                 or self.account_for_loss):
            raise ValueError("pipeline_layout cannot be combined with layers_per_stage or the embedding/loss split "
                             "(Megatron-LM: 'pipeline_model_parallel_layout cannot be set with other pipeline "
                             "layout arguments')")
        return self

    @model_validator(mode="before")
    @classmethod
    def _normalise_per_stage(cls, data: Any) -> Any:
        """Check ``recompute_per_stage`` against pp and recompute_layers; fill ``recompute``.

        Raises:
            ValueError: wrong length, an unknown option, ``recompute_layers`` given, or a
                ``recompute`` other than the heaviest per-stage option.
        """
        if not isinstance(data, dict) or data.get("recompute_per_stage") is None:
            return data
        per_stage = tuple(data["recompute_per_stage"])
        for name in per_stage:
            if name not in RECOMPUTE_CODES:
                raise ValueError(f"recompute_per_stage: {name!r} is not one of {', '.join(RECOMPUTE_NAMES)}")
        pp = data.get("pp", 1)
        if isinstance(pp, int) and len(per_stage) != pp:
            raise ValueError(f"recompute_per_stage has {len(per_stage)} entries; give one per pipeline stage (pp={pp})")
        if data.get("recompute_layers") is not None:
            raise ValueError("recompute_per_stage with recompute_layers: partial full recompute is one setting for "
                             "all stages; give one or the other")
        heaviest = max(per_stage, key=RECOMPUTE_CODES.__getitem__)
        if data.get("recompute") not in (None, heaviest):
            raise ValueError(f"recompute={data['recompute']!r} with recompute_per_stage: recompute must be the "
                             f"heaviest per-stage option {heaviest!r} (or omitted)")
        return dict(data, recompute=heaviest, recompute_per_stage=per_stage if len(set(per_stage)) > 1 else None)

    @field_validator("recompute_modules")
    @classmethod
    def _ordered_modules(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        """A module set in Megatron's order, without repeats."""
        return module_names(module_mask(names))

    @model_validator(mode="after")
    def _modules_need_selective(self) -> "Strategy":
        """Modules other than the default only where a stage recomputes selectively.

        Raises:
            ValueError: non-default modules with no selective stage.
        """
        options = set(self.recompute_per_stage or (self.recompute,))  # not stage_recompute: pp may be huge
        if self.recompute_modules != DEFAULT_RECOMPUTE_MODULES and "selective" not in options:
            raise ValueError(f"recompute_modules={','.join(self.recompute_modules)} applies to selective recompute; "
                             f"this layout recomputes {'/'.join(sorted(options))} (make recompute, or "
                             "a recompute_per_stage entry, selective, or leave the default core_attn)")
        return self

    @model_validator(mode="after")
    def _cp_a2a_for_hierarchical(self) -> "Strategy":
        """``cp_a2a`` only with ``a2a+p2p``, and there a divisor of cp.

        Raises:
            ValueError: ``cp_a2a`` with another algorithm, or missing / not dividing cp with a2a+p2p
                (Megatron-LM ``arguments.py``: the hierarchical sizes multiply to cp).
        """
        if self.cp_comm_type != "a2a+p2p":
            if self.cp_a2a is not None and self.cp_a2a != self.cp_a2a_size:
                raise ValueError(f"cp_a2a={self.cp_a2a} applies to cp_comm_type a2a+p2p, not {self.cp_comm_type}")
            return self
        if self.cp_a2a is None or self.cp % self.cp_a2a:
            raise ValueError(f"cp_comm_type a2a+p2p needs cp_a2a, the all-to-all group size, dividing cp={self.cp} "
                             f"(got {self.cp_a2a}); Megatron: --hierarchical-context-parallel-sizes A P with A*P = cp")
        return self

    @property
    def cp_a2a_size(self) -> int:
        """Ranks of the all-to-all (Ulysses) group inside cp: cp for ``a2a``, ``cp_a2a`` for
        ``a2a+p2p``, 1 for ``p2p`` and ``allgather``."""
        return {"a2a": self.cp, "a2a+p2p": self.cp_a2a or 1}.get(self.cp_comm_type, 1)

    @property
    def vocab_tp_size(self) -> int:
        """Tensor-parallel degree of the embedding and output layer: ``vocab_tp``, else tp."""
        return self.tp if self.vocab_tp is None else self.vocab_tp

    @property
    def stage_recompute(self) -> tuple[str, ...]:
        """Recompute option of each pipeline stage, length ``pp``."""
        return self.recompute_per_stage or (self.recompute,) * self.pp

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def expert_tp(self) -> int:
        """Expert tensor-parallel size, defaulting to tp as Megatron-Core does."""
        return self.tp if self.etp is None else self.etp

    def num_microbatches(self, global_batch_size: int) -> int:
        """Micro-batches per step per DP rank: gbs / (mbs * dp) (Megatron's calculator)."""
        return global_batch_size // (self.mbs * self.dp)


# Among layouts of equal predicted step time (to the microsecond) the simpler one ranks first:
# less recompute, then fewer context-parallel ranks, a lower ZeRO stage, fewer pipeline stages,
# less tensor parallelism. Each name is a Strategy field and a LayoutBatch column.
SIMPLICITY_ORDER: tuple[str, ...] = ("recompute", "cp", "zero", "pp", "tp")


def simplicity_key(s: Strategy) -> tuple[int, ...]:
    """``s``'s fields in :data:`SIMPLICITY_ORDER` (recompute as its code): the tie-break of the
    ranking, lower is simpler."""
    return tuple(RECOMPUTE_CODES[s.recompute] if name == "recompute" else getattr(s, name)
                 for name in SIMPLICITY_ORDER)


def default_layers_per_stage(num_layers: int, pp: int, embedding: bool = False,
                             loss: bool = False) -> tuple[int, ...] | None:
    """Megatron-style split of ``num_layers`` decoder layers over ``pp`` stages, or ``None``.

    Without ``embedding``/``loss``: even when ``pp`` divides the layers. Otherwise middle
    stages get ``ceil(L/pp)`` layers and the remainder goes to the first and last stages (the
    last one lighter, since it also runs the output layer and loss), i.e.
    ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``.

    With ``embedding`` (``loss``), Megatron's ``--account-for-embedding-in-pipeline-split``
    (``--account-for-loss-in-pipeline-split``): every stage gets ``(L + e + l) / pp`` slots and
    stage 0 (pp-1) one decoder layer fewer; e.g. 126 layers, pp 8, both: 15, 16 x 6, 15
    (Megatron-Core ``get_num_layers_to_build``). Divisibility is the rules' job
    (:mod:`autopar.rules`); this floors.

    Returns ``None`` when the split leaves the first or last stage without a decoder layer.
    """
    first, middle, last = split_first_middle_last(np.asarray(num_layers), np.asarray(pp),
                                                  np.asarray(embedding), np.asarray(loss))
    if first < 1 or last < 1:
        return None
    if pp == 1:
        return (num_layers,)
    return (int(first),) + (int(middle),) * (pp - 2) + (int(last),)


def split_first_middle_last(num_layers: np.ndarray, pp: np.ndarray, embedding: np.ndarray | bool = False,
                            loss: np.ndarray | bool = False) -> tuple[np.ndarray, ...]:
    """Vectorised :func:`default_layers_per_stage`: decoder layers on stage 0, each middle
    stage, and the last stage (arrays broadcast to one shape). Invalid splits show up as first
    or last < 1. Where ``embedding`` or ``loss`` is set, stage ``i`` holds
    ``(L + e + l) // pp`` slots less the embedding on stage 0 and the loss on stage pp-1."""
    num_layers, pp = np.asarray(num_layers), np.asarray(pp)
    e, l = np.asarray(embedding, dtype=np.int64), np.asarray(loss, dtype=np.int64)
    even = num_layers % pp == 0
    middle = -(-num_layers // pp)  # ceil
    rest = num_layers - (pp - 2) * middle  # what first + last share (pp >= 2)
    last = np.where(pp == 2, num_layers // 2, rest // 2)
    first = np.where(pp == 2, num_layers - num_layers // 2, rest - rest // 2)
    first = np.where(even, num_layers // pp, first)
    last = np.where(even, num_layers // pp, last)
    middle = np.where(even, num_layers // pp, middle)
    accounted = (e + l) > 0
    slots = (num_layers + e + l) // pp
    first = np.where(accounted, np.where(pp == 1, num_layers, slots - e), first)
    last = np.where(accounted, np.where(pp == 1, num_layers, slots - l), last)
    middle = np.where(accounted, slots, middle)
    return first, middle, last
