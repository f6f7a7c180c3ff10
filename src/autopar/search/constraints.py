"""Search constraints: layout fields pinned to a value or a set, and dimensions switched off.

A constraint is generic: an option name (``--tp``), a :class:`autopar.layout_batch.LayoutBatch`
column (or property, e.g. ``schedule_code`` for ``--schedule``) and the set of allowed codes. Adding a
layout dimension to the search means adding one row to :data:`FIELDS` (and, for an on/off switch,
to :data:`SWITCHES`); nothing else here changes.

Constraints are applied to the enumerated batch before the rules and before costing
(:func:`autopar.search.grid.costed_grid`), so a constrained search costs only what is left. Each
removed layout is counted once, under the first constraint it fails in :data:`FIELDS` order, then
switches (the counts add up to the layouts removed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from autopar.errors import AutoparError
from autopar.layout_batch import LayoutBatch
from autopar.space import SpaceOptions
from autopar.strategy import CP_COMM_TYPES, MOE_DISPATCHERS, RECOMPUTE_CODES

MAX_VALUE = 2**20  # no layout degree is larger (a pinned value above it is a typo)


@dataclass(frozen=True)
class FieldSpec:
    """One constrainable layout field: the ``search`` option, the batch column and, for named
    values, the name -> code map (None: positive integers; ``lowest`` 0 allows 0, as ZeRO)."""

    option: str
    column: str
    names: dict[str, int] | None = None
    lowest: int = 1
    highest: int = MAX_VALUE


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("--tp", "tp"), FieldSpec("--pp", "pp"), FieldSpec("--dp", "dp"), FieldSpec("--cp", "cp"),
    FieldSpec("--vpp", "vpp"), FieldSpec("--ep", "ep"), FieldSpec("--etp", "etp"), FieldSpec("--mbs", "mbs"),
    FieldSpec("--num-microbatches", "num_microbatches"), FieldSpec("--zero", "zero", lowest=0, highest=3),
    FieldSpec("--recompute", "recompute", names=RECOMPUTE_CODES),
    FieldSpec("--schedule", "schedule_code", names={"1f1b": 0, "interleaved": 1, "gpipe": 2, "zbv": 3, "dualpipev": 4}),
    FieldSpec("--sp", "sp", names={"off": 0, "on": 1}),
    FieldSpec("--tp-comm-overlap", "tp_comm_overlap", names={"off": 0, "on": 1}),
    FieldSpec("--cp-comm-type", "cp_comm", names={name: i for i, name in enumerate(CP_COMM_TYPES)}),
    FieldSpec("--vocab-tp", "vocab_tp"), FieldSpec("--vocab-sp", "vocab_sp", names={"off": 0, "on": 1}),
    FieldSpec("--tp-consecutive", "tp_consecutive", names={"off": 0, "on": 1}),
    FieldSpec("--moe-dispatcher", "moe_dispatcher", names={name: i for i, name in enumerate(MOE_DISPATCHERS)}),
    FieldSpec("--moe-ep-overlap", "moe_ep_overlap", names={"off": 0, "on": 1}),
)
FIELD_BY_OPTION = {f.option: f for f in FIELDS}

# Dimension switches: option -> (field option, the codes left). --no-fsdp forbids ZeRO-3 (FSDP).
SWITCHES: dict[str, tuple[str, frozenset[int]]] = {
    "--no-tp": ("--tp", frozenset({1})), "--no-pp": ("--pp", frozenset({1})), "--no-cp": ("--cp", frozenset({1})),
    "--no-ep": ("--ep", frozenset({1})), "--no-vpp": ("--vpp", frozenset({1})),
    "--no-fsdp": ("--zero", frozenset({0, 1, 2})), "--no-recompute": ("--recompute", frozenset({0})),
}


@dataclass(frozen=True)
class Constraint:
    """Layouts whose ``column`` holds a code outside ``allowed`` are removed; ``text`` is how the
    user wrote it (``--pp 1,2,4``, ``--no-cp``)."""

    text: str
    column: str
    allowed: frozenset[int]

    def passes(self, batch: LayoutBatch) -> np.ndarray:
        """Where each row of ``batch`` satisfies the constraint (bool, ``(n,)``)."""
        values = np.asarray(getattr(batch, self.column)).astype(np.int64)
        return np.isin(values, sorted(self.allowed))


def parse_values(spec: FieldSpec, text: str) -> frozenset[int]:
    """``text`` (one value or a comma-separated set, e.g. ``1,2,4`` or ``none,selective``) as codes.

    Raises:
        AutoparError: an empty item, a non-integer, a value outside ``lowest..highest`` or a name
            outside ``names``; the message names ``spec.option`` and what is allowed.
    """
    items = [t.strip() for t in str(text).split(",")]
    if spec.names is not None:
        bad = [t for t in items if t not in spec.names]
        if bad:
            raise AutoparError(f"{spec.option}={text!r}: allowed {', '.join(spec.names)} (one or a comma-separated set)")
        return frozenset(spec.names[t] for t in items)
    from autopar.integers import INTEGER_RULE, read_integer

    read = [read_integer(t) for t in items]
    example = ",".join(str(v) for v in (1, 2, 4) if spec.lowest <= v <= spec.highest)  # 1,2 for ZeRO's 0..3
    if None in read and all(t.strip() for t in items):
        raise AutoparError(f"{spec.option}={text!r}: expected {INTEGER_RULE} in {spec.lowest}..{spec.highest}, or a "
                           f"comma-separated set of them, e.g. {example}")
    values = [] if None in read else [v for v in read if v is not None]
    if not values or any(not spec.lowest <= v <= spec.highest for v in values):
        raise AutoparError(f"{spec.option}={text!r}: must be an integer in {spec.lowest}..{spec.highest} or a "
                           f"comma-separated set of them, e.g. {example}")
    return frozenset(values)


# The on/off fields, shown as their flag pair (``--sp`` / ``--no-sp``).
_ON_OFF = ("--sp", "--tp-comm-overlap", "--vocab-sp", "--tp-consecutive", "--moe-ep-overlap")


def _field_option(c: Constraint) -> str:
    """The :data:`FIELDS` option a pinned constraint came from (``--no-sp`` is ``--sp``)."""
    option = c.text.split()[0]
    return option.replace("--no-", "--", 1) if option.replace("--no-", "--", 1) in _ON_OFF else option


def parse_constraints(pinned: dict[str, str | None], switches: dict[str, bool]) -> list[Constraint]:
    """The constraints of ``search``'s options.

    Args:
        pinned: field option (a key of :data:`FIELD_BY_OPTION`) -> its text, None when not given.
        switches: switch option (a key of :data:`SWITCHES`) -> whether it was given.
    Returns:
        One :class:`Constraint` per given option, fields first (:data:`FIELDS` order), then switches.
    Raises:
        AutoparError: a bad value (:func:`parse_values`), an unknown option, or a switch that
            contradicts a pinned value (``--cp 2 --no-cp``).
    """
    out = []
    for option, text in pinned.items():
        if option not in FIELD_BY_OPTION:
            raise AutoparError(f"{option}: not a search constraint; allowed {', '.join(FIELD_BY_OPTION)}")
        if text is not None:
            spec = FIELD_BY_OPTION[option]
            shown = f"{option} {text}"
            if option in _ON_OFF:
                shown = option if text == "on" else option.replace("--", "--no-", 1)
            out.append(Constraint(shown, spec.column, parse_values(spec, text)))
    out.sort(key=lambda c: list(FIELD_BY_OPTION).index(_field_option(c)))
    for option, on in switches.items():
        if option not in SWITCHES:
            raise AutoparError(f"{option}: not a search switch; allowed {', '.join(SWITCHES)}")
        if not on:
            continue
        field_option, allowed = SWITCHES[option]
        given = next((c for c in out if _field_option(c) == field_option), None)
        if given is not None and not given.allowed & allowed:
            raise AutoparError(f"{given.text} with {option}: the switch leaves no value of {field_option}")
        out.append(Constraint(option, FIELD_BY_OPTION[field_option].column, allowed))
    return out


def widen_space(options: SpaceOptions, constraints: list[Constraint], narrow: bool = True) -> SpaceOptions:
    """``options`` widened so the enumeration holds every pinned ``--mbs`` and ``--vpp`` value
    (the default space has mbs 1, 2, 4, 8 and vpp up to 16); other fields are enumerated in full.

    A pinned ``--moe-dispatcher`` set replaces the dispatchers offered where the target offers a
    choice (``SpaceOptions.moe_dispatchers`` longer than alltoall alone, or the EP overlap on;
    :mod:`autopar.export.comm_knobs`): the pinned ones only, the target's preferred last (the space
    offers the EP overlap with the last one, :func:`autopar.space._expert_options`), so
    ``--moe-dispatcher alltoall`` is searched with and without the overlap, and ``hybridep`` on an
    8-GPU node is enumerated though the target would offer ``deepep`` there. A target without MoE
    choices keeps alltoall; the constraint then removes what it does not allow. A pinned
    ``--no-moe-ep-overlap`` offers every dispatcher without the overlap (the preferred one had been
    enumerated only with it, so ``deepep`` without the overlap was never searched).

    ``narrow`` False (``--explain``'s pins, which must be ranked among the whole space the search
    ranks): pinned dispatchers are added to the offered ones, not put in their place, and a pinned
    dispatcher or EP overlap offers every dispatcher with and without the overlap
    (``SpaceOptions.moe_ep_overlap_both``), so a recipe's pairing is found whatever the search pairs."""
    mbs = set(options.mbs)
    max_vpp = options.max_vpp
    dispatchers = options.moe_dispatchers
    ep_overlap = options.moe_ep_overlap
    for c in constraints:
        if narrow and c.column == "moe_ep_overlap" and c.allowed == frozenset({0}):
            ep_overlap = False  # every dispatcher without it (the space pairs it with the last one only)
        if c.column == "mbs":
            mbs |= c.allowed
        elif c.column == "vpp":
            max_vpp = max(max_vpp, *c.allowed)
        elif c.column == "moe_dispatcher" and (len(dispatchers) > 1 or options.moe_ep_overlap):
            pinned = [MOE_DISPATCHERS[code] for code in sorted(c.allowed)]
            dispatchers = tuple(d for d in pinned if d not in dispatchers) + tuple(d for d in dispatchers
                                                                                  if d in pinned or not narrow)
    moe_pinned = any(c.column in ("moe_dispatcher", "moe_ep_overlap") for c in constraints)
    both = options.moe_ep_overlap_both or (moe_pinned and not narrow)
    return replace(options, mbs=tuple(sorted(mbs)), max_vpp=max_vpp, moe_dispatchers=dispatchers,
                   moe_ep_overlap=ep_overlap, moe_ep_overlap_both=both)


def apply_constraints(batch: LayoutBatch, constraints: list[Constraint]) -> tuple[np.ndarray, dict[str, int]]:
    """Which rows of ``batch`` every constraint allows, and how many each constraint removed.

    Returns:
        ``(kept, removed)``: ``kept`` bool ``(n,)``; ``removed`` constraint text -> rows removed,
        each row counted under the first constraint it fails (so the counts add up to ``~kept``).
    """
    kept = np.ones(len(batch), dtype=bool)
    removed = {}
    for c in constraints:
        out = kept & ~c.passes(batch)
        removed[c.text] = int(np.sum(out))
        kept &= ~out
    return kept, removed
