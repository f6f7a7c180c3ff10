"""``autopar search``'s constraint, ``--explain`` and ``--gbs-range`` options (typer ``Annotated``
types), kept out of :mod:`autopar.cli` so the command's signature stays short.

Field options take the names ``estimate`` uses (``--tp``, ``--zero``, ``--recompute``...) but a
set of values (``--pp 1,2,4``); see :mod:`autopar.search.constraints`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from autopar.errors import AutoparError
from autopar.export.rewrite_checks import MIN_GAIN_PCT
from autopar.search.constraints import Constraint, parse_constraints

if TYPE_CHECKING:
    from autopar.problem import Problem


def _set(option: str, what: str, example: str = "1,2,4") -> object:
    """A constraint option's ``typer.Option``; ``example``: a set of values it takes."""
    return typer.Option(option, help=f"keep only layouts with this {what} (one value or a set, e.g. {example})",
                        rich_help_panel="Constraints")


def _off(option: str, what: str) -> object:
    return typer.Option(option, help=f"switch {what} off", rich_help_panel="Constraints")


Tp = Annotated[Optional[str], _set("--tp", "tensor-parallel size")]
Pp = Annotated[Optional[str], _set("--pp", "number of pipeline stages")]
Dp = Annotated[Optional[str], _set("--dp", "data-parallel size")]
Cp = Annotated[Optional[str], _set("--cp", "context-parallel size")]
Vpp = Annotated[Optional[str], _set("--vpp", "virtual stages per pipeline rank")]
Ep = Annotated[Optional[str], _set("--ep", "expert-parallel size")]
Etp = Annotated[Optional[str], _set("--etp", "expert tensor-parallel size")]
Mbs = Annotated[Optional[str], _set("--mbs", "micro-batch size")]
Microbatches = Annotated[Optional[str], _set("--num-microbatches", "micro-batch count (gbs / (mbs x dp))")]
Zero = Annotated[Optional[str], _set("--zero", "ZeRO stage, 0-3 (3: FSDP)", "1,2")]
Recompute = Annotated[Optional[str], _set("--recompute", "recompute: none | selective | full", "none,selective")]
Schedule = Annotated[Optional[str], _set("--schedule", "pipeline schedule: 1f1b | interleaved | gpipe",
                                         "1f1b,interleaved")]
VocabTp = Annotated[Optional[str], _set("--vocab-tp", "embedding/output-layer TP degree (Galvatron's vtp; "
                                        "--target galvatron searches it)")]
VocabSp = Annotated[Optional[bool], typer.Option(
    "--vocab-sp/--no-vocab-sp", help="keep only layouts with (without) sequence-split vocabulary layers (Galvatron's "
    "vsp)", rich_help_panel="Constraints")]
TpConsecutive = Annotated[Optional[bool], typer.Option(
    "--tp-consecutive/--no-tp-consecutive", help="keep only layouts with consecutive (strided) TP groups "
    "(Galvatron's tp_consecutive_flags)", rich_help_panel="Constraints")]
Sp = Annotated[Optional[bool], typer.Option("--sp/--no-sp", help="keep only layouts with (without) Megatron "
                                            "sequence parallelism", rich_help_panel="Constraints")]
TpCommOverlap = Annotated[Optional[bool], typer.Option(
    "--tp-comm-overlap/--no-tp-comm-overlap", help="keep only layouts with (without) TP communication overlap",
    rich_help_panel="Constraints")]
CpCommType = Annotated[Optional[str], _set("--cp-comm-type", "context-parallel algorithm: p2p | a2a | allgather | "
                                           "a2a+p2p", "p2p,a2a")]
MoeDispatcher = Annotated[Optional[str], _set("--moe-dispatcher", "MoE token dispatcher: alltoall | allgather | deepep "
                                              "| hybridep (as estimate's; deepep/hybridep run Megatron's flex "
                                              "dispatcher and need those libraries)", "alltoall,allgather")]
MoeEpOverlap = Annotated[Optional[bool], typer.Option(
    "--moe-ep-overlap/--no-moe-ep-overlap", help="keep only layouts with (without) the EP all-to-all overlapped with "
    "another micro-batch (Megatron --overlap-moe-expert-parallel-comm)", rich_help_panel="Constraints")]
NoTp = Annotated[bool, _off("--no-tp", "tensor parallelism (tp 1)")]
NoPp = Annotated[bool, _off("--no-pp", "pipeline parallelism (pp 1)")]
NoCp = Annotated[bool, _off("--no-cp", "context parallelism (cp 1)")]
NoEp = Annotated[bool, _off("--no-ep", "expert parallelism (ep 1)")]
NoVpp = Annotated[bool, _off("--no-vpp", "interleaving (vpp 1)")]
NoFsdp = Annotated[bool, _off("--no-fsdp", "FSDP (ZeRO-3)")]
NoRecompute = Annotated[bool, _off("--no-recompute", "activation recompute (recompute none)")]
MIN_GAIN_HELP = ("--write-script: least predicted gain over the script's own layout, % [default: autopar's "
                 "step-time MAPE on the validation rows of the problem's kind: " + ", ".join(
                     f"{pct:g} {kind}" for kind, pct in MIN_GAIN_PCT.items()) + "]")
Explain = Annotated[Optional[str], typer.Option(
    "--explain", help="where this layout ranks and why, or what drops it: 'tp=4,pp=4,vpp=5,cp=2,mbs=1' "
    "(keys: tp pp dp cp vpp ep etp mbs zero recompute schedule sp num_microbatches tp_comm_overlap "
    "cp_comm_type vocab_tp vocab_sp tp_consecutive moe_dispatcher moe_ep_overlap; a key left out is free) or a "
    "table label (exact: a part without +ov is TP overlap off, cp without :a2a the ring) "
    "such as 'tp4+sp pp4x5 cp2 dp2'")]
GbsRange = Annotated[Optional[str], typer.Option(
    "--gbs-range", help="batch-size search instead of one search: FIRST:LAST (FIRST doubled up to LAST: "
    "100:400 is 100, 200, 400), FIRST:LAST:STEP "
    "or a list 256,512,1024; the best layout per gbs, the gbs with the most tokens/s per device and the "
    "largest that fits")]
Plot = Annotated[Optional[str], typer.Option("--plot", help="with --gbs-range: write a PNG of tokens/s per device "
                                             "and peak memory against gbs")]


def constraints_from_options(tp: str | None, pp: str | None, dp: str | None, cp: str | None, vpp: str | None,
                             ep: str | None, etp: str | None, mbs: str | None, num_microbatches: str | None,
                             zero: str | None, recompute: str | None, schedule: str | None, sp: bool | None,
                             switches: dict[str, bool], tp_comm_overlap: bool | None = None,
                             cp_comm_type: str | None = None,
                             galvatron: tuple[str | None, bool | None, bool | None] = (None, None, None),
                             moe: tuple[str | None, bool | None] = (None, None)) -> list[Constraint]:
    """The :class:`Constraint` list of ``search``'s options (None / False = not given);
    ``galvatron``: ``--vocab-tp``, ``--vocab-sp``, ``--tp-consecutive``; ``moe``:
    ``--moe-dispatcher``, ``--moe-ep-overlap``.

    Raises:
        AutoparError: a bad value or a contradicting switch (:func:`parse_constraints`).
    """
    pinned = {"--tp": tp, "--pp": pp, "--dp": dp, "--cp": cp, "--vpp": vpp, "--ep": ep, "--etp": etp, "--mbs": mbs,
              "--num-microbatches": num_microbatches, "--zero": zero, "--recompute": recompute,
              "--schedule": schedule, "--sp": _on_off(sp), "--tp-comm-overlap": _on_off(tp_comm_overlap),
              "--cp-comm-type": cp_comm_type, "--vocab-tp": galvatron[0], "--vocab-sp": _on_off(galvatron[1]),
              "--tp-consecutive": _on_off(galvatron[2]), "--moe-dispatcher": moe[0],
              "--moe-ep-overlap": _on_off(moe[1])}
    return parse_constraints(pinned, switches)


def _on_off(flag: bool | None) -> str | None:
    """An on/off option's value as its constraint text (None: not given)."""
    return None if flag is None else ("on" if flag else "off")


def refuse_gbs_with_range(gbs_range: str | None, gbs: int | None) -> None:
    """Refuse ``--gbs-range`` with ``--gbs`` (on the command line or in a ``--config`` file): the
    range runs one search per gbs of its own and ignored ``--gbs`` without a word.

    Raises:
        AutoparError: ``--gbs-range='16:256' searches each gbs of its range; --gbs=64 is one gbs: ...``.
    """
    if gbs_range and gbs is not None:
        raise AutoparError(f"--gbs-range={gbs_range!r} searches each gbs of its range; --gbs={gbs} is one gbs: drop "
                           "one of them")


def check_modes(gbs_range: str | None, plot: str | None, explain: str | None, write_script: str | None,
                report: str | None) -> None:
    """Refuse option combinations before any search runs: ``--plot`` without ``--gbs-range``,
    ``--gbs-range`` (one search per gbs) with an option that takes one search, or a bad ``--explain``.

    Raises:
        AutoparError: one line naming the options.
    """
    from autopar.search.explain import parse_layout

    if plot and not gbs_range:
        raise AutoparError(f"--plot={plot!r} draws the batch-size search; add --gbs-range")
    if gbs_range and (explain or write_script or report):
        raise AutoparError(f"--gbs-range={gbs_range!r} runs one search per gbs; --explain, --write-script and "
                           "--report take one search: drop them or --gbs-range")
    if explain:
        parse_layout(explain)


def refuse_moe_on_dense(p: Problem, moe_dispatcher: str | None, moe_ep_overlap: bool | None) -> None:
    """Refuse ``--moe-dispatcher`` / ``--moe-ep-overlap`` for a model without routed experts (a
    dense layout has no dispatcher: the constraint would keep or drop everything silently).

    Raises:
        AutoparError: ``--moe-dispatcher=deepep: model llama3-8b has no routed experts; ...``.
    """
    given = {"--moe-dispatcher": moe_dispatcher, "--moe-ep-overlap": None if moe_ep_overlap is None
             else "on" if moe_ep_overlap else "off"}
    for option, value in given.items():
        if value is not None and p.model.num_experts == 0:
            raise AutoparError(f"{option}={value}: model {p.model.name} has no routed experts; the MoE dispatcher "
                               f"and EP overlap apply to MoE models only (leave {option} unset)")
