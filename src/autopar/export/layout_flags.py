"""The parallel, batch and recompute flags of a layout, for Megatron-LM and MindSpeed-LLM.

One table serves both the argument writers (:mod:`autopar.export.megatron`,
:mod:`autopar.export.mindspeed`) and the script rewriter (:mod:`autopar.export.rewrite`):
:func:`layout_flags` maps every flag autopar owns to its value for a layout: a string (flag
with that value), ``True`` (a switch that must be present), ``None`` (must be absent) or
:data:`KEEP` (the user's choice is kept; the writer omits it). Flag names: ecosystem.md 1.2
(Megatron-LM ``core_v0.15.0``/main) and 2 (MindSpeed-LLM). A renamed flag is a change here only.
"""

from __future__ import annotations

import shlex
from typing import Literal

from autopar.errors import AutoparError
from autopar.export.comm_knobs import require_cp_algorithms, te_a2a_heads_reason
from autopar.export.per_stage import require_default_modules, require_uniform_recompute
from autopar.pipeline.layout import layout_of
from autopar.problem import Problem
from autopar.strategy import DEFAULT_RECOMPUTE_MODULES, Strategy

Dialect = Literal["megatron", "mindspeed"]
FlagValue = str | bool | None
KEEP = "keep"  # a sentinel distinct from every real flag value

# Flags without a value (store_true switches); every other flag in the table takes one.
SWITCHES = frozenset({
    "--sequence-parallel", "--tp-comm-overlap", "--no-overlap-p2p-communication", "--use-distributed-optimizer",
    "--use-megatron-fsdp", "--overlap-grad-reduce", "--overlap-param-gather", "--recompute-activations",
    "--distribute-saved-activations", "--use-torch-fsdp2", "--overlap-param-gather-with-optimizer-step",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--recompute-activation-function", "--recompute-norm", "--no-gradient-accumulation-fusion",
    "--use-ascend-mc2", "--use-mc2",
})
# MindSpeed --context-parallel-algo per Strategy.cp_comm_type (mindspeed/arguments.py; no all-gather one).
MINDSPEED_CP_ALGO = {"p2p": "megatron_cp_algo", "a2a": "ulysses_cp_algo", "a2a+p2p": "hybrid_cp_algo"}
# Flags written on the line of their partner (the first/last stage pair reads as one setting).
_SAME_LINE_AS_PREVIOUS = {"--decoder-last-pipeline-num-layers": "--decoder-first-pipeline-num-layers"}
# Megatron FSDP sharding strategy per ZeRO stage (ecosystem.md 1.2, ``--data-parallel-sharding-strategy``).
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
# Recompute flags autopar does not model; MindSpeed-LLM's partial recompute (ecosystem.md 2).
_ALWAYS_ABSENT = ("--recompute-activations", "--distribute-saved-activations", "--use-torch-fsdp2",
                  "--overlap-param-gather-with-optimizer-step")
_MINDSPEED_RECOMPUTE = ("--recompute-activation-function", "--recompute-activation-function-num-layers",
                        "--recompute-norm", "--recompute-norm-num-layers")


def stage_layers(p: Problem, s: Strategy) -> tuple[int, ...]:
    """The layout's decoder layers per pipeline stage (:func:`autopar.pipeline.layout.layout_of`)."""
    return layout_of(p, s).layers_per_stage


def _split_flags(p: Problem, s: Strategy, dialect: Dialect) -> dict[str, FlagValue]:
    """Pipeline split: Megatron first/last stage counts (ecosystem.md 1.3 rules 18, 21), its
    embedding/loss switches (rules 21-22: instead of first/last), or, for any other layout
    (unequal middle stages or chunks, MTP off the last rank), ``--pipeline-model-parallel-layout``
    (shell-quoted; it sets vpp, so no vpp flag beside it: arguments.py); MindSpeed
    ``--num-layer-list`` (section 2), and the VPP flag each accepts. MindSpeed-LLM gets an
    embedding/loss-aware split without vpp as the same ``--num-layer-list``.

    Raises:
        AutoparError: a split the dialect cannot express (MindSpeed-LLM: an uneven split or
            unequal chunks with vpp > 1, the MTP layers off the last stage).
    """
    layout = layout_of(p, s)
    split = layout.layers_per_stage
    uneven = len(set(split)) > 1
    accounted = s.account_for_embedding or s.account_for_loss
    flags: dict[str, FlagValue] = {"--decoder-first-pipeline-num-layers": None,
                                   "--decoder-last-pipeline-num-layers": None, "--num-layer-list": None,
                                   "--num-virtual-stages-per-pipeline-rank": None,
                                   "--num-layers-per-virtual-pipeline-stage": None,
                                   "--account-for-embedding-in-pipeline-split": None,
                                   "--account-for-loss-in-pipeline-split": None,
                                   "--pipeline-model-parallel-layout": None}
    if dialect == "mindspeed" and accounted and s.vpp > 1:
        raise AutoparError(f"MindSpeed-LLM: the embedding/loss-aware split (vpp={s.vpp}) has no flag there "
                           "(--num-layer-list cannot be combined with virtual pipeline stages); use vpp=1 or "
                           "a layer count divisible by pp*vpp")
    if dialect == "megatron" and accounted:
        flags["--account-for-embedding-in-pipeline-split"] = s.account_for_embedding or None
        flags["--account-for-loss-in-pipeline-split"] = s.account_for_loss or None
        if s.vpp > 1:
            flags["--num-virtual-stages-per-pipeline-rank"] = str(s.vpp)
        return flags
    if dialect == "mindspeed":
        if layout.mtp_rank != s.pp - 1:
            raise AutoparError(f"MindSpeed-LLM: layout {layout.megatron()} puts the MTP layers on stage "
                               f"{layout.mtp_rank}; MindSpeed places them on the last stage")
        if (uneven or layout.first_last() is None) and s.vpp > 1:
            raise AutoparError(f"MindSpeed-LLM: --num-layer-list cannot be combined with virtual pipeline stages "
                               f"(vpp={s.vpp}); layout {layout.megatron()} (split {','.join(map(str, split))}) "
                               "is uneven")
        if uneven:
            flags["--num-layer-list"] = ",".join(map(str, split))
        elif s.vpp > 1:
            flags["--num-layers-per-virtual-pipeline-stage"] = str(split[0] // s.vpp)
        return flags
    first_last = layout.first_last() if s.pp > 1 else (None, None)
    if first_last is None:  # only the layout string says it
        flags["--pipeline-model-parallel-layout"] = shlex.quote(layout.megatron())
        return flags
    if uneven:
        flags["--decoder-first-pipeline-num-layers"] = str(split[0])
        flags["--decoder-last-pipeline-num-layers"] = str(split[-1])
    if s.vpp > 1:
        flags["--num-virtual-stages-per-pipeline-rank"] = str(s.vpp)
    return flags


def _zero_flags(s: Strategy, dialect: Dialect, overlap: bool = True, wgrad_fusion: bool = True) -> dict[str, FlagValue]:
    """Optimizer sharding and DP overlap (ecosystem.md 1.2; rule 28: param-gather overlap needs
    the distributed optimizer and grad-reduce overlap). ``overlap``: ``TrainSpec.overlap_grad_reduce``,
    which the costs follow (:func:`autopar.cost.stage_time.dp_exposed_s`): the gradient reduce
    overlap for any ZeRO stage (Megatron's DDP overlaps with or without the distributed optimizer),
    the parameter-gather overlap with it where the optimizer is sharded. ``wgrad_fusion``:
    ``TrainSpec.grad_accumulation_fusion``; off, ``--no-gradient-accumulation-fusion`` is written.

    Raises:
        AutoparError: ZeRO-2/3 for MindSpeed-LLM (no Megatron FSDP there).
    """
    if s.zero >= 2 and dialect == "mindspeed":
        raise AutoparError(f"MindSpeed-LLM: zero={s.zero} needs Megatron FSDP, which MindSpeed-LLM does not offer; "
                           "use zero 0 or 1 (--use-distributed-optimizer)")
    sharded, fsdp = s.zero >= 1, s.zero >= 2
    return {
        # Megatron FSDP's required flags (Megatron-LM docs/discussions/megatron-fsdp-user-guide,
        # "Required Configurations"; ecosystem.md 1.3 rule 31): the distributed optimizer, the
        # fsdp_dtensor checkpoint format and no gradient-accumulation fusion.
        "--use-distributed-optimizer": sharded or None,
        "--use-megatron-fsdp": fsdp or None,
        "--data-parallel-sharding-strategy": FSDP_STRATEGY.get(s.zero),
        # also whenever the plan is costed without the fusion (TrainSpec.grad_accumulation_fusion,
        # autopar.cost.wgrad_accumulation)
        "--no-gradient-accumulation-fusion": True if fsdp or not wgrad_fusion else KEEP,
        "--ckpt-format": "fsdp_dtensor" if fsdp else KEEP,
        "--overlap-grad-reduce": overlap or None,
        "--overlap-param-gather": (sharded and overlap) or None,
    }


def _recompute_flags(s: Strategy, dialect: Dialect) -> dict[str, FlagValue]:
    """Recompute (ecosystem.md 1.3 rule 24: ``full`` needs method and num-layers, ``selective``
    forbids both). ``full`` with ``recompute_layers`` N is ``block`` N, else ``uniform`` 1.
    Selective recompute writes the layout's ``recompute_modules`` as ``--recompute-modules``
    when they differ from Megatron's default ``core_attn`` (else the script's own choice is kept).

    Raises:
        AutoparError: other modules than ``core_attn`` for MindSpeed-LLM, whose selective
            recompute is its own flags (``--recompute-activation-function``, ``--recompute-norm``;
            :func:`~autopar.export.per_stage.require_default_modules`).
    """
    full = s.recompute == "full"
    modules = s.recompute_modules
    default = modules == DEFAULT_RECOMPUTE_MODULES
    if dialect == "mindspeed":  # its --recompute-activation-function / --recompute-norm are not modelled
        require_default_modules("MindSpeed-LLM", s)
    flags: dict[str, FlagValue] = {
        "--recompute-granularity": None if s.recompute == "none" else s.recompute,
        "--recompute-method": ("block" if s.recompute_layers else "uniform") if full else None,
        "--recompute-num-layers": str(s.recompute_layers or 1) if full else None,
        "--recompute-modules": (KEEP if default else " ".join(modules)) if s.recompute == "selective" else None,
    }
    if dialect == "mindspeed":
        flags.update(dict.fromkeys(_MINDSPEED_RECOMPUTE))
    return flags


def _moe_flags(p: Problem, s: Strategy, dialect: Dialect) -> dict[str, FlagValue]:
    """The MoE dispatcher and EP overlap of ``s`` (:mod:`autopar.cost.moe_dispatch`): Megatron-LM's
    ``--moe-token-dispatcher-type`` alltoall/allgather/flex with ``--moe-flex-dispatcher-backend``
    deepep/hybridep, ``--overlap-moe-expert-parallel-comm``; the older ``--moe-enable-deepep`` is
    never written.

    The dispatcher is always written, since Megatron-LM's default (``allgather``,
    ``transformer_config.py``) is not the one every layout uses. MindSpeed-LLM runs Megatron-Core's
    ``alltoall`` and ``allgather`` dispatchers (its examples pass both, e.g.
    ``examples/mcore/deepseek2_lite``).

    Raises:
        AutoparError: a flex dispatcher, or the EP overlap, in MindSpeed-LLM's dialect
            (its MoE overlap and dispatch flags are other mechanisms, not modelled).
    """
    if not p.model.is_moe:
        return dict.fromkeys(("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-enable-deepep",
                              "--overlap-moe-expert-parallel-comm"))
    if dialect == "mindspeed" and (s.moe_dispatcher not in ("alltoall", "allgather") or s.moe_ep_overlap):
        raise AutoparError(f"MindSpeed-LLM cannot express this layout: moe_dispatcher={s.moe_dispatcher}, "
                           f"moe_ep_overlap={s.moe_ep_overlap} (its MoE dispatch/overlap flags are other mechanisms "
                           "autopar does not model); use the alltoall or allgather dispatcher without EP overlap")
    flex = s.moe_dispatcher in ("deepep", "hybridep")
    return {"--moe-token-dispatcher-type": "flex" if flex else s.moe_dispatcher,
            "--moe-flex-dispatcher-backend": s.moe_dispatcher if flex else None, "--moe-enable-deepep": None,
            "--overlap-moe-expert-parallel-comm": s.moe_ep_overlap or None}


def layout_flags(p: Problem, s: Strategy, dialect: Dialect = "megatron") -> dict[str, FlagValue]:
    """Every parallel / batch / recompute flag for layout ``s`` (see the module docstring).

    Raises:
        AutoparError: the layout cannot be expressed in ``dialect`` (the reason is named), e.g.
            recompute per stage (one ``--recompute-granularity`` for all stages).
    """
    require_uniform_recompute("MindSpeed-LLM" if dialect == "mindspeed" else "Megatron-LM", s)
    if dialect == "mindspeed" and p.train.precision == "fp8":
        raise AutoparError("MindSpeed-LLM: fp8 training is not available on Ascend; use bf16 or fp16")
    if dialect == "mindspeed" and p.train.cuda_graph_impl != "none":
        raise AutoparError("MindSpeed-LLM: CUDA graphs are NVIDIA's; Ascend has no --cuda-graph-impl (plan with "
                           "--cuda-graph-impl none)")
    moe = p.model.is_moe
    flags: dict[str, FlagValue] = {
        "--tensor-model-parallel-size": str(s.tp),
        "--pipeline-model-parallel-size": str(s.pp),
        "--context-parallel-size": str(s.cp),
        "--expert-model-parallel-size": str(s.ep) if moe else None,
        "--expert-tensor-parallel-size": str(s.expert_tp) if moe else None,
        "--sequence-parallel": s.sp or None,
        # TP overlap (autopar.cost.tp_overlap): TE userbuffers; MindSpeed turns --tp-comm-overlap off
        # (mindspeed/arguments.py) and overlaps with MC2 instead.
        "--tp-comm-overlap": (s.tp_comm_overlap and dialect == "megatron") or None,
        "--use-ascend-mc2": (s.tp_comm_overlap and dialect == "mindspeed") or None,
        "--use-mc2": None,
        "--no-overlap-p2p-communication": KEEP if s.vpp == 1 or s.pp > 2 else None,
        "--micro-batch-size": str(s.mbs),
        "--global-batch-size": str(p.train.global_batch_size),
    }
    a2a = s.cp_a2a_size
    hierarchical = s.cp > 1 and s.cp_comm_type == "a2a+p2p"
    if dialect == "mindspeed":
        require_cp_algorithms("MindSpeed-LLM", s, tuple(MINDSPEED_CP_ALGO))
        flags["--context-parallel-algo"] = MINDSPEED_CP_ALGO[s.cp_comm_type] if s.cp > 1 else KEEP
        flags["--ulysses-degree-in-cp"] = str(a2a) if hierarchical else None
        flags["--cp-comm-type"] = None
    else:
        why = te_a2a_heads_reason(p, s)
        if why:
            raise AutoparError(f"Megatron-LM: {why}")
        flags["--cp-comm-type"] = s.cp_comm_type if s.cp > 1 and s.cp_comm_type != "p2p" else None
        flags["--hierarchical-context-parallel-sizes"] = f"{a2a} {s.cp // a2a}" if hierarchical else None
    flags.update(_moe_flags(p, s, dialect))
    flags.update(_split_flags(p, s, dialect))
    flags.update(_zero_flags(s, dialect, p.train.overlap_grad_reduce, p.train.grad_accumulation_fusion))
    flags.update(_recompute_flags(s, dialect))
    flags.update(dict.fromkeys(_ALWAYS_ABSENT))
    return flags


def flag_words(flags: dict[str, FlagValue]) -> list[str]:
    """The flags that are written out, each as ``--flag`` or ``--flag value`` (table order)."""
    out: list[str] = []
    for name, value in flags.items():
        word = name if value is True else f"{name} {value}" if isinstance(value, str) and value != KEEP else None
        if word and name in _SAME_LINE_AS_PREVIOUS and out and out[-1].startswith(_SAME_LINE_AS_PREVIOUS[name]):
            out[-1] += " " + word
        elif word:
            out.append(word)
    return out


def needs_max_connections_env(s: Strategy) -> bool:
    """Whether Megatron-LM asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for layout ``s``: tp > 1 or
    cp > 1 on GPUs before Blackwell, unless Megatron-FSDP shards (zero >= 2), which asserts the
    opposite (:func:`forbids_max_connections_one`). Source: Megatron-LM
    ``megatron/training/arguments.py`` ``validate_args``: "Using tensor model parallelism or context
    parallelism require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" is
    asserted only in the branch without ``use_torch_fsdp2`` / ``use_megatron_fsdp`` (ecosystem.md
    1.3 rule 10)."""
    return (s.tp > 1 or s.cp > 1) and not forbids_max_connections_one(s)


def forbids_max_connections_one(s: Strategy) -> bool:
    """Whether Megatron-LM refuses ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for layout ``s``: ZeRO-2/3 is
    written as ``--use-megatron-fsdp`` and ``validate_args`` asserts "FSDP requires
    CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset." (``megatron/training/arguments.py``)."""
    return s.zero >= 2
