"""``autopar search --explain LAYOUT``: where a given layout ranks and why, or what drops it.

A layout is given as ``key=value`` pairs (``tp=4,pp=4,vpp=5,cp=2,mbs=1``; keys are the constraint
fields of :data:`autopar.search.constraints.FIELDS` without dashes) or as the table's layout label
(``tp4+sp pp4x5 cp2 dp2``, ``ep8/etp1``). Fields left out are free: the explanation is about the
best enumerated layout that has the given ones. It walks the search's own stages
(:func:`autopar.search.grid.costed_grid`): not enumerated, removed by a constraint, rejected by a
rule (its name and reason, :mod:`autopar.rules`), over the memory limit (the memory breakdown of
the fullest stage against the device), or ranked (its rank as the table would list it, and its
step time against #1's, part by part).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from autopar.errors import AutoparError
from autopar.estimate import Estimate, estimate
from autopar.problem import Problem
from autopar.report.table import layout_label
from autopar.rules import RULES
from autopar.search.constraints import FIELDS, Constraint, FieldSpec, apply_constraints, parse_values
from autopar.search.grid import GIB, SearchResult, costed_grid, for_search, refusal, undominated
from autopar.space import SpaceOptions
from autopar.strategy import Strategy
from autopar.validate.bands import Band, sharded_rows_note

KEYS: dict[str, FieldSpec] = {f.option[2:].replace("-", "_"): f for f in FIELDS}
MAX_RANK = 2000  # the rank walk checks the target's writer per layout; deeper ranks are reported as "below"
_LABEL = re.compile(r"^(?:tp(?P<tp>\d+)(?P<sp>\+sp)?(?P<ov>\+ov)?|pp(?P<pp>\d+)(?:x(?P<vpp>\d+))?(?:\+e?l?)?~?"
                    r"|cp(?P<cp>\d+)(?::(?P<cp_algo>a2a|allgather|a2a\d+\+p2p))?"
                    r"|dp(?P<dp>\d+)|ep(?P<ep>\d+)(?:/etp(?P<etp>\d+))?"
                    r"(?::(?P<disp>allgather|deepep|hybridep))?(?P<a2a>\+a2a)?"
                    r"|mbs(?P<mbs>\d+)"
                    r"|vtp(?P<vocab_tp>\d+)|vsp(?P<vsp>\d+)|(?P<gpipe>gpipe)|(?P<nc>tp-nc)|(?P<v>zbv|dualpipev))$",
                    re.ASCII)  # \d: the digits 0-9 only (autopar.integers)


def parse_layout(text: str) -> dict[str, int]:
    """``--explain``'s value as field key -> code (:data:`KEYS`; ``sp``/``schedule``/``recompute``/
    ``tp_comm_overlap``/``cp_comm_type`` as their codes; a label's ``+ov`` and ``cp8:a2a`` marks
    as the table writes them, a label's tp part without ``+ov`` meaning no overlap, its cp part
    without a mark the ring).

    Raises:
        AutoparError: an unknown key or label part, a bad or repeated value (one ``--explain`` line).
    """
    wanted: dict[str, int] = {}
    if "=" in text:
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep:  # tp=1,2: a set is no layout
                raise AutoparError(f"--explain={text!r}: {item!r} is not key=value; --explain takes one value per "
                                   "key (e.g. tp=4,pp=2), not a set")
            key = key.strip().lstrip("-").replace("-", "_")
            if key not in KEYS:
                raise AutoparError(f"--explain={text!r}: unknown key {key!r}; allowed {', '.join(KEYS)}")
            spec = KEYS[key]
            if key in wanted:
                raise AutoparError(f"--explain={text!r}: give {key} once, with one value")
            try:  # --explain takes one value per key: parse_values' "or a comma-separated set" does not apply
                codes = parse_values(FieldSpec(f"--explain {key}", spec.column, spec.names, spec.lowest,
                                               spec.highest), value.strip())
            except AutoparError:
                codes = frozenset()
            if len(codes) != 1:
                allowed = (", ".join(spec.names) if spec.names is not None
                           else f"a whole number in {spec.lowest}..{spec.highest}")
                example = (next(iter(spec.names)) if spec.names is not None
                           else 4 if spec.lowest <= 4 <= spec.highest else spec.lowest)
                raise AutoparError(f"--explain={text!r}: {key}={value.strip()!r}: one value per key, {allowed} "
                                   f"(e.g. {key}={example})")
            wanted[key] = next(iter(codes))
    else:
        for part in text.split():
            m = _LABEL.match(part)
            if not m:
                raise AutoparError(f"--explain={text!r}: cannot read {part!r}; give key=value pairs "
                                   "(tp=4,pp=4,vpp=5) or a table label such as 'tp4+sp pp4x5 cp2 dp2'")
            for k, v in m.groupdict().items():
                if not v or k in ("sp", "ov", "cp_algo", "vsp", "gpipe", "nc", "v", "disp", "a2a"):
                    continue
                if k in wanted:
                    raise AutoparError(f"--explain={text!r}: {part!r} gives {k} again; give each label part once")
                spec = KEYS.get(k)
                if spec is not None and not spec.lowest <= int(v) <= spec.highest:
                    raise AutoparError(f"--explain={text!r}: {part!r}: {k}={int(v)}; allowed a whole number in "
                                       f"{spec.lowest}..{spec.highest}")
                wanted[k] = int(v)
            if m.group("vsp"):  # Galvatron's marks (autopar.report.table.galvatron_marks)
                wanted.update(vocab_tp=int(m.group("vsp")), vocab_sp=1)
            if m.group("gpipe") or m.group("v"):  # schedule marks: gpipe, torchtitan's zbv / dualpipev
                wanted["schedule"] = KEYS["schedule"].names[m.group("gpipe") or m.group("v")]
            if m.group("nc"):
                wanted["tp_consecutive"] = 0
            if part.startswith("tp"):
                wanted["sp"] = int(bool(m.group("sp")))
                wanted["tp_comm_overlap"] = int(bool(m.group("ov")))
            if part.startswith("cp"):  # the table marks an algorithm other than the ring: cp8:a2a, cp16:a2a8+p2p
                algo = re.sub(r"a2a\d+\+p2p", "a2a+p2p", m.group("cp_algo") or "p2p")
                wanted["cp_comm_type"] = KEYS["cp_comm_type"].names[algo]
            if part.startswith("pp") and not m.group("vpp"):
                wanted["vpp"] = 1
            if part.startswith("ep"):  # the table marks a dispatcher other than alltoall and the EP overlap
                wanted["moe_dispatcher"] = KEYS["moe_dispatcher"].names[m.group("disp") or "alltoall"]
                wanted["moe_ep_overlap"] = int(bool(m.group("a2a")))
    if not wanted:
        raise AutoparError(f"--explain={text!r}: no layout field given (e.g. tp=4,pp=4)")
    return wanted


#: Keys a table label fixes by a mark it leaves out, with the code it then means (``tp4`` without
#: ``+ov``: TP overlap off; ``pp4`` without ``x``: vpp 1; ``cp2`` without ``:a2a``: the p2p ring).
LABEL_IMPLIED = {"sp": 0, "tp_comm_overlap": 0, "vpp": 1, "cp_comm_type": 0, "moe_dispatcher": 0, "moe_ep_overlap": 0}
_SIZES = ("tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs")


def label_note(text: str, stated: dict[str, int]) -> str | None:
    """For a label-form ``--explain`` (no ``=``), the line saying which fields the label fixed
    without a mark (:data:`LABEL_IMPLIED`, e.g. ``tp_comm_overlap=off, cp_comm_type=p2p``) and the
    ``key=value`` form that leaves them free (its sizes only); None for the key=value form."""
    if "=" in text:
        return None
    implied = {k: v for k, v in stated.items() if LABEL_IMPLIED.get(k) == v}
    if not implied:
        return None
    sizes = ",".join(f"{k}={stated[k]}" for k in _SIZES if k in stated and k not in implied)
    return (f"label form is exact: {_where(implied)} (a mark the label leaves out is fixed, not free); "
            f"write key=value to leave a field free, e.g. --explain '{sizes}'")


@dataclass
class Explanation:
    """What ``--explain`` found. ``status``: ``ranked``, ``not_enumerated``, ``constraint``,
    ``rule``, ``memory`` or ``not_writable``; ``rank`` (1 = best, as the table lists) when ranked;
    ``lines``: the human text; ``details``: numbers for the JSON."""

    layout: str
    status: str
    lines: list[str]
    rank: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    headline: str = ""

    def summary(self) -> str:
        """One line for the top of the output: ``--explain LAYOUT: ranks #783 of 9,120 fitting
        layouts, +11.7% against #1 (details below the table)``; the first line of the
        explanation where it did not rank."""
        return f"--explain {self.layout}: {self.headline or self.lines[0]} (details below the table)"

    def to_dict(self) -> dict[str, Any]:
        """The ``explain`` record of the search JSON."""
        return {"layout": self.layout, "status": self.status, "rank": self.rank, "text": self.lines,
                **self.details}

    def text(self) -> str:
        """The explanation as printed under the search table."""
        return f"--explain {self.layout}:\n  " + "\n  ".join(self.lines)


def _where(wanted: dict[str, int]) -> str:
    """Key codes as ``key=value`` text, names for named keys (``tp=2, sp=on``)."""
    return ", ".join(f"{k}={v}" for k, v in _named(wanted).items())


def _memory_lines(e: Estimate) -> list[str]:
    peak = max(e.memory_per_stage, key=lambda m: m.total_bytes)
    parts = ", ".join(f"{name} {getattr(peak, name + '_bytes') / GIB:.1f}"
                      for name in ("weights", "grads", "optimizer", "activations", "other"))
    return [f"stage {peak.stage} ({peak.layers} layers, recompute {peak.recompute}): {parts} = "
            f"{peak.total_bytes / GIB:.1f} GiB against {e.device_memory_bytes / GIB:.1f} GiB per device"]


#: Key -> the keys it depends on: a script's value of the key is kept only when each of them is
#: either not stated or stated compatibly with the script's own value: equal, or, for the keys
#: in :data:`_ABOVE_ONE`'s, on the same side of 1 (a script's vpp divides its own pp; its sequence
#: parallelism and TP overlap need tp > 1, its CP algorithm cp > 1). dp and num_microbatches
#: follow from the other sizes and the batch and are never taken from it.
_DEPENDS: dict[str, tuple[str, ...]] = {
    "tp": (), "pp": (), "cp": (), "ep": (), "mbs": (), "zero": (), "recompute": (),
    "vpp": ("pp",), "schedule": ("pp", "vpp"), "sp": ("tp",), "tp_comm_overlap": ("tp", "sp"),
    "cp_comm_type": ("cp",), "etp": ("ep", "tp"),
}
_ABOVE_ONE = {"sp", "tp_comm_overlap", "cp_comm_type"}


def _strategy_codes(s: Strategy) -> dict[str, int]:
    """The :data:`KEYS` codes of layout ``s`` for the keys of :data:`_DEPENDS`."""
    named = {"recompute": s.recompute, "schedule": s.schedule, "sp": "on" if s.sp else "off",
             "tp_comm_overlap": "on" if s.tp_comm_overlap else "off", "cp_comm_type": s.cp_comm_type}
    sizes = {"etp": s.expert_tp}  # etp None = tp (Megatron-LM's default), as the search's batch holds it
    return {k: KEYS[k].names[named[k]] if k in named else int(sizes.get(k, getattr(s, k))) for k in _DEPENDS}


def script_fill(wanted: dict[str, int], script_layout: Strategy) -> dict[str, int]:
    """The keys ``--explain`` left out that come from the ``--script``'s own layout: each
    :data:`_DEPENDS` key not in ``wanted`` whose dependencies ``wanted`` leaves out or states with
    the script's values, with the script's code. E.g. ``tp=2,pp=4,recompute=full`` on a script
    running tp2+sp pp4 (no vpp, no TP overlap) mbs1 zero1: ``cp=1``, ``zero=1``, ``vpp=1``,
    ``schedule=1f1b``, ``sp=on``, ``tp_comm_overlap=off``, ...; with ``pp=8`` instead its vpp and
    schedule stay free (its vpp divides its own pp, not 8); with ``tp=4`` its ``sp=on`` holds."""
    codes = _strategy_codes(script_layout)
    def compatible(key: str, dep: str) -> bool:
        value = wanted.get(dep, codes[dep])
        if key in _ABOVE_ONE and dep in ("tp", "cp"):
            return (value > 1) == (codes[dep] > 1)
        return value == codes[dep]

    return {k: codes[k] for k, deps in _DEPENDS.items() if k not in wanted and all(compatible(k, d) for d in deps)}


def _irrelevant(p: Problem, codes: dict[str, int]) -> dict[str, bool]:
    """Which keys say nothing for a layout of key ``codes`` (missing sizes count as 1): expert
    sizes on a dense model, the CP algorithm without cp, sequence parallelism and TP overlap
    without tp."""
    dense = not p.model.num_experts
    return {"ep": dense, "etp": dense, "cp_comm_type": codes.get("cp", 1) == 1, "sp": codes.get("tp", 1) == 1,
            "tp_comm_overlap": codes.get("tp", 1) == 1}


def explain_layout(p: Problem, text: str, result: SearchResult, memory_margin: float,
                   options: SpaceOptions | None, target: str, constraints: list[Constraint],
                   script_layout: Strategy | None = None) -> Explanation:
    """Explain layout ``text`` (:func:`parse_layout`) in the search that produced ``result``
    (same problem, margin, space ``options``, ``target`` and ``constraints``). With
    ``script_layout`` (the ``--script``'s own layout) the keys ``text`` leaves out come from it
    (:func:`script_fill`) rather than from the fastest fitting variant; either way the
    explanation names each key it filled and with what.

    Raises:
        AutoparError: ``text`` cannot be read (:func:`parse_layout`).
    """
    stated = parse_layout(text)
    from_script = script_fill(stated, script_layout) if script_layout is not None else {}
    from_script = {k: v for k, v in from_script.items() if not _irrelevant(p, {**stated, **from_script}).get(k)}
    # an option given wins over the script, as everywhere (--no-recompute against the script's full recompute)
    overruled = {k: next(c.text for c in constraints if c.column == KEYS[k].column and v not in c.allowed)
                 for k, v in from_script.items()
                 if any(c.column == KEYS[k].column and v not in c.allowed for c in constraints)}
    from_script = {k: v for k, v in from_script.items() if k not in overruled}
    wanted = {**stated, **from_script}
    hidden = {}  # full recompute of how many layers per stage: no --explain key, the script's when it recomputes so
    if script_layout is not None and script_layout.recompute == "full" and all(
            wanted.get(k) == v for k, v in _strategy_codes(script_layout).items() if k in ("recompute", "pp", "vpp")):
        hidden["recompute_layers"] = script_layout.recompute_layers or 0  # 0: all layers (LayoutBatch)
    explained = _explain(p, wanted, result, memory_margin, options, target, constraints, hidden)
    explained.layout = _where(stated)
    if (note := label_note(text, stated)) is not None:
        explained.lines.insert(0, note)
        explained.details["label_fixed"] = _named({k: v for k, v in stated.items() if LABEL_IMPLIED.get(k) == v})
    if from_script:
        shown = {**_named(from_script), **{k: v or "all" for k, v in hidden.items()}}
        explained.lines.insert(0, f"--explain leaves out {', '.join(shown)}: taken from --script's own layout: "
                                  + ", ".join(f"{k}={v}" for k, v in shown.items()))
        explained.details["filled_from_script"] = shown
    if overruled:
        script_values = _named({k: _strategy_codes(script_layout)[k] for k in overruled})
        explained.lines.insert(0, "not taken from --script (an option given wins): " + ", ".join(
            f"{k}={script_values[k]} ({overruled[k]})" for k in overruled))
        explained.details["overruled_script"] = {k: overruled[k] for k in overruled}
    return explained


def _explain(p: Problem, wanted: dict[str, int], result: SearchResult, memory_margin: float,
             options: SpaceOptions | None, target: str, constraints: list[Constraint],
             hidden: dict[str, int]) -> Explanation:
    """:func:`explain_layout` of the key codes ``wanted`` (those stated and those filled) and the
    batch column codes ``hidden`` (a script's ``recompute_layers``), which narrow the match only
    where some enumerated layout has them."""
    p, options = for_search(p, target, options)
    pins = [Constraint(k, KEYS[k].column, frozenset({v})) for k, v in wanted.items()]
    from autopar.search.constraints import widen_space

    grid = costed_grid(p, memory_margin, widen_space(options or SpaceOptions(), pins, narrow=False), constraints,
                       full=True)
    batch, layers = grid.batch, p.model.num_layers
    match = np.ones(len(batch), dtype=bool)
    for c in pins:
        match &= c.passes(batch)
    for column, code in hidden.items():
        if np.any(narrowed := match & (np.asarray(getattr(batch, column)) == code)):
            match = narrowed
    where = _where(wanted)
    if not np.any(match):
        absent = [k for k, c in zip(wanted, pins) if not np.any(c.passes(batch))]
        why = (f"no enumerated layout has {_where({k: wanted[k] for k in absent})}" if absent
               else "no enumerated layout combines these values")
        target_why = _target_omits(target, {k: wanted[k] for k in absent})
        return Explanation(where, "not_enumerated", [
            f"{why}: {target_why}" if target_why else
            f"{why} (tp x cp x pp x dp must equal the {p.world_size} devices; vpp > 1 divides num_layers / pp = "
            f"{layers} / pp, or (num_layers + 2) / pp with the embedding and loss counted as layers (its two largest "
            "such vpp, >= 2 layers a chunk), or, where neither does, a flexible pipeline layout's two vpp values; "
            f"mbs from {sorted(set(batch.mbs.tolist()))}; ep divides the experts)"])
    if not np.any(match & grid.kept):
        _, removed = apply_constraints(batch.take(match), constraints)
        by = ", ".join(f"{t} ({n:,})" for t, n in removed.items() if n)
        return Explanation(where, "constraint", [f"removed by the constraints: {by} of its {int(match.sum()):,} "
                                                 "variants (mbs, zero, recompute, sp, ...)"])
    candidates = match & grid.kept
    valid_match = np.isin(grid.valid_rows, np.flatnonzero(candidates))
    if not np.any(valid_match):
        counts = {RULES[i].name: int(np.sum(candidates & (grid.failed == i))) for i in set(grid.failed[candidates])}
        name = max(counts, key=counts.get)
        row = int(np.flatnonzero(candidates & (grid.failed == [r.name for r in RULES].index(name)))[0])
        rule = next(r for r in RULES if r.name == name)
        return Explanation(where, "rule", [
            f"rejected by rule {name}: {rule.reason(p, batch.strategy(row, layers, p.model.mtp_num_layers))}",
            "variants rejected by rule: " + ", ".join(f"{k} {v:,}" for k, v in counts.items())],
            details={"rules": counts})
    fitting = valid_match & grid.fits
    if not np.any(fitting):
        lightest = int(np.flatnonzero(valid_match)[np.argmin(grid.costs.peak_memory_bytes[valid_match])])
        e = estimate(p, grid.valid.strategy(lightest, layers, p.model.mtp_num_layers), memory_margin)
        return Explanation(where, "memory", [
            f"out of memory: none of its {int(valid_match.sum()):,} valid variants fits; the lightest "
            f"(mbs {e.strategy.mbs}, zero {e.strategy.zero}, recompute {e.strategy.recompute}) peaks at "
            f"{e.peak_memory_bytes / GIB:.1f} GiB", *_memory_lines(e)],
            details={"peak_memory_bytes": e.peak_memory_bytes, "device_memory_bytes": e.device_memory_bytes})
    return _ranked(p, grid, fitting, where, result, memory_margin, target, wanted)


def _ranked(p: Problem, grid: Any, fitting: np.ndarray, where: str, result: SearchResult, memory_margin: float,
            target: str, wanted: dict[str, int]) -> Explanation:
    """The rank of the best fitting match among the undominated, writable layouts (as the table
    ranks them before its top rows are re-balanced) and its time against #1's: whether it is
    within autopar's step-time band of #1 (:func:`autopar.report.ties.within_band`, the ``≈1``
    mark), and the keys ``wanted`` leaves free with the values the fastest fitting variant took."""
    from autopar.report.ties import problem_certainty, within_band

    layers, refused = p.model.num_layers, []

    def writable(i: int) -> bool:
        reason = refusal(p, target, grid.valid.strategy(i, layers, p.model.mtp_num_layers))
        if reason is not None and fitting[i]:
            refused.append(reason)
        return reason is None

    ordered = grid.order[grid.fits[grid.order]]
    walk = undominated(grid.valid, grid.costs.step_time_s, grid.costs.peak_memory_bytes, ordered, writable)
    found = next(((rank, i) for rank, i in enumerate(islice(walk, MAX_RANK), 1) if fitting[i]), None)
    total = int(np.sum(grid.fits))
    if found is None and refused and len(refused) >= int(fitting.sum()):
        return Explanation(where, "not_writable", [f"fits, but --target {target} cannot write it: {refused[0]}"])
    if found is None:  # its fastest fitting variant, costed all the same
        rank, i = None, int(next(j for j in ordered if fitting[j]))
    else:
        rank, i = found
    e = estimate(p, grid.valid.strategy(i, layers, p.model.mtp_num_layers), memory_margin)
    best = result.layouts[0]
    s = e.strategy
    ranks = f"ranks #{rank}" if rank is not None else f"ranks below #{MAX_RANK}"
    lines = [f"{ranks} of {total:,} fitting layouts by the search's first costing (the table then re-costs "
             f"only its top rows, with balanced pipeline stages): {layout_label(e)} mbs {s.mbs} zero {s.zero} recompute "
             f"{s.recompute}, step {e.step_time_s:.3f} s, {e.tokens_per_s_per_device:,.0f} tok/s/dev, peak "
             f"{e.peak_memory_bytes / GIB:.1f} of {e.device_memory_bytes / GIB:.1f} GiB"
             + (" (marginal)" if e.marginal else "")]
    diff = {k: e.time_breakdown_s[k] - best.time_breakdown_s.get(k, 0.0) for k in e.time_breakdown_s}
    worst = [f"{k} {v:+.3f} s" for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:3] if abs(v) >= 5e-4]
    slower = e.step_time_s / best.step_time_s - 1
    lines.append(f"against #1 ({best.step_time_s:.3f} s): {slower:+.1%}" + (f"; largest differences: "
                                                                           f"{', '.join(worst)}" if worst else ""))
    headline = f"{ranks} of {total:,} fitting layouts, {slower:+.1%} against #1"
    runner_up = next((x for x in result.layouts if x.strategy != s), None) if rank == 1 else None
    if runner_up is not None:
        gap = runner_up.step_time_s / e.step_time_s - 1
        lines.append(f"the next layout, {layout_label(runner_up)} ({runner_up.step_time_s:.3f} s), is {gap:+.1%} "
                     "against it")
        headline += f"; the next, {layout_label(runner_up)}, {gap:+.1%}"
    band = problem_certainty(p).step_time
    caveat = sharded_rows_note(target, [s.zero, best.strategy.zero])
    row = next((x for x in result.layouts if _same_layout(x.strategy, s)), None)  # its table row, re-costed
    step_s = row.step_time_s if row is not None else e.step_time_s
    tie = rank != 1 and within_band(step_s, best.step_time_s, band.band_pct)
    if rank != 1:
        costing = "as the table re-costs it" if row is not None else "by the first costing"
        lines.append(band_line(step_s, best.step_time_s, band, costing, caveat))
    elif runner_up is not None:
        lines.append("the next layout: " + band_line(runner_up.step_time_s, best.step_time_s, band, "as the table "
                                                     "re-costs it", caveat))
    irrelevant = _irrelevant(p, _strategy_codes(s))
    free = {"dp": s.dp} if any(k not in wanted for k in ("tp", "pp", "cp")) else {}  # else dp follows from them
    chosen = {k: v for k, v in {**free, **_strategy_codes(s)}.items() if k not in wanted and not irrelevant.get(k)}
    if chosen:
        lines.append(f"not given, set by the fastest fitting variant: {_where(chosen)}")
    return Explanation(where, "ranked", lines, rank=rank, headline=headline,
                       details={"fitting": total, "estimate": e.to_dict(result.global_batch_size),
                                "time_vs_best_s": diff, "filled_by_search": _named(chosen), "within_band_of_best": tie,
                                "band_pct": band.band_pct})


def _same_layout(a: Strategy, b: Strategy) -> bool:
    """Whether two strategies are one layout up to the stages' layer split (the table re-balances
    the split of the layouts it shows)."""
    free = {"layers_per_stage": None, "recompute_per_stage": None, "pipeline_layout": None}
    return a.model_copy(update=free) == b.model_copy(update=free)


def _target_omits(target: str, absent: dict[str, int]) -> str | None:
    """Why ``--target`` leaves an absent value out of the space, where the target is the reason:
    TP communication overlap or a context-parallel algorithm its writer cannot write
    (:mod:`autopar.export.comm_knobs`); None otherwise."""
    from autopar.export.comm_knobs import CP_ALGORITHMS, TP_OVERLAP_TARGETS

    if absent.get("tp_comm_overlap") == 1 and target not in TP_OVERLAP_TARGETS:
        return (f"--target {target} cannot write TP communication overlap, so the search costs its layouts without "
                f"it (targets that write it: {', '.join(sorted(TP_OVERLAP_TARGETS))}); a tp > 1 layout of this "
                "target is costed with its TP collectives exposed")
    if "cp_comm_type" in absent:
        names = {v: n for n, v in KEYS["cp_comm_type"].names.items()}
        written = CP_ALGORITHMS.get(target, ("p2p",))
        if names.get(absent["cp_comm_type"]) not in written:
            return f"--target {target} writes context parallelism only as {', '.join(written)}"
    return None


def band_line(step_time_s: float, first_s: float, band: Band, costing: str, caveat: str | None = None) -> str:
    """Whether a layout's gap to #1 (``costing`` says which step times: the table's re-costed ones
    or the search's first costing) is inside autopar's step-time error ``band`` (the MAPE of the
    measured rows it names, :func:`autopar.report.ties.problem_certainty`): inside, the two are too
    close to rank; beyond it, the ranking likely holds (the band is a mean; the line gives its rows'
    largest error), unless ``caveat`` (few measured rows of sharded layouts,
    :func:`autopar.validate.bands.sharded_rows_note`) says the band itself is uncertain there;
    without a band, that the gap cannot be weighed."""
    from autopar.report.ties import band_verdict, within_band

    gap = f"{100.0 * abs(step_time_s - first_s) / first_s:.1f}% from #1 ({costing})"
    if band.band_pct is None:
        return f"{gap}; no measured row gives an error band, so how sure this order is is unknown"
    verdict = f"{gap}, {band_verdict(step_time_s, first_s, band.band_pct, band.group)}"
    if within_band(step_time_s, first_s, band.band_pct):
        return verdict
    if caveat is not None:
        return f"{verdict}; but {caveat}"
    worst = "" if band.max_pct is None else f" (a mean, not a bound: single rows there err by up to {band.max_pct:g}%)"
    return f"{verdict}: the order likely holds{worst}"


def _named(codes: dict[str, int]) -> dict[str, Any]:
    """Codes as values for the JSON: names for named keys (``sp: "on"``), integers otherwise."""
    names = {k: {v: n for n, v in KEYS[k].names.items()} for k in codes if k in KEYS and KEYS[k].names}
    return {k: names[k][v] if k in names else v for k, v in codes.items()}
