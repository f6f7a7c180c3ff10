"""Ranks that state their certainty: layouts whose predicted step time is within autopar's own
error band of #1's are marked as ties with it (``≈1``), since the ranking cannot tell them apart.

The band is :class:`autopar.validate.bands.Certainty`'s (the MAPE of similar validation rows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autopar.validate.bands import Certainty, certainty, model_rows_note, sharded_rows_note

if TYPE_CHECKING:
    from autopar.problem import Problem
    from autopar.search import SearchResult

TIE = "≈"


def within_band(step_time_s: float, first_s: float, band_pct: float | None) -> bool:
    """Whether ``|step_time_s - first_s| / first_s`` (in %, rounded to 0.1 as the text prints it
    and as the band itself is) is at most ``band_pct`` (never with no band)."""
    return band_pct is not None and round(100.0 * abs(step_time_s - first_s) / first_s, 1) <= band_pct


def band_verdict(step_time_s: float, first_s: float, band_pct: float, group: str = "similar measured rows") -> str:
    """``within autopar's ±B% band (its mean step-time error, MAPE, on GROUP): too close to rank`` when
    ``step_time_s`` is within ``band_pct`` of ``first_s`` (:func:`within_band`), else ``beyond ...``:
    the one wording of a gap weighed against the band (``search --explain``, ``--layerwise``)."""
    against = f"autopar's ±{band_pct:g}% band (its mean step-time error, MAPE, on {group})"
    if within_band(step_time_s, first_s, band_pct):
        return f"within {against}: too close to rank"
    return f"beyond {against}"


def rank_marks(step_times_s: list[float], band_pct: float | None) -> list[str]:
    """The rank column of a ranking best first: ``"1"``, then ``"≈1"`` for each layout within
    the band of #1 (:func:`within_band`), else its own rank. E.g. step times [100, 103, 105,
    105.1] s with a 5 % band: ``["1", "≈1", "≈1", "4"]``."""
    if not step_times_s:
        return []
    first = step_times_s[0]
    return ["1"] + [f"{TIE}1" if within_band(t, first, band_pct) else str(i)
                    for i, t in enumerate(step_times_s[1:], 2)]


def ties_note(certainty: Certainty, marks: list[str]) -> str | None:
    """The footnote naming the band when any rank is a tie, else None."""
    if not any(m.startswith(TIE) for m in marks):
        return None
    step, memory = certainty.step_time, certainty.memory
    note = (f"{TIE}1: step time within ±{step.band_pct:g}% of #1's, autopar's step-time error (MAPE) on "
            f"{len(step.rows)} {step.group}; too close to rank")
    if memory.band_pct is not None:
        note += f" (memory: ±{memory.band_pct:g}% on {len(memory.rows)} {memory.group})"
    return note


def annotate(doc: dict[str, Any], certainty: Certainty) -> dict[str, Any]:
    """Add the bands to a search JSON document (``result.to_dict()``): ``certainty``
    (:meth:`Certainty.to_dict`) and, on every layout, ``rank_mark`` (:func:`rank_marks`),
    ``step_time_range_s`` and ``peak_memory_range_bytes`` (the prediction +- its band; None
    without a band). Returns ``doc``."""
    layouts = doc["layouts"]
    marks = rank_marks([e["step_time_s"] for e in layouts], certainty.step_time.band_pct)
    for e, mark in zip(layouts, marks):
        e["rank_mark"] = mark
        with_ranges(e, certainty)
    doc["certainty"] = certainty.to_dict()
    return doc


def with_ranges(layout: dict[str, Any], certainty: Certainty) -> dict[str, Any]:
    """Add ``step_time_range_s`` and ``peak_memory_range_bytes`` (the prediction -/+ its band;
    None without a band) to one layout's JSON (``Estimate.to_dict``). Returns ``layout``."""
    layout["step_time_range_s"] = _range(layout["step_time_s"], certainty.step_time.band_pct)
    layout["peak_memory_range_bytes"] = _range(layout["peak_memory_bytes"], certainty.memory.band_pct)
    return layout


def _range(value: float, band_pct: float | None) -> list[float] | None:
    return None if band_pct is None else [value * (1 - band_pct / 100), value * (1 + band_pct / 100)]


def problem_certainty(p: Problem) -> Certainty:
    """The error bands of problem ``p``: its model family, precision and device
    (:func:`autopar.validate.bands.certainty`)."""
    return certainty(p.model.is_moe, p.train.precision, p.cluster.device.name)


def model_note(p: Problem) -> str | None:
    """The measured runs of ``p``'s model on its class of device, with autopar's signed error there
    (:func:`autopar.validate.bands.model_rows_note`), or None."""
    return model_rows_note(p.model.name, p.cluster.device.name)


def sharding_note(p: Problem, result: SearchResult) -> str | None:
    """:func:`autopar.validate.bands.sharded_rows_note` for the layouts of ``result`` (its export target)."""
    return sharded_rows_note(getattr(result, "target", "megatron"), (e.strategy.zero for e in result.layouts))


def search_document(p: Problem, result: SearchResult) -> dict[str, Any]:
    """The search JSON of ``result`` (``search --json`` and ``--report``'s ``result.json``):
    :meth:`SearchResult.to_dict` with :func:`annotate`'s bands (``certainty.sharding_note``:
    :func:`sharding_note`, or None; ``certainty.model_rows_note``:
    :func:`autopar.validate.bands.model_rows_note`, or None) and the peak MFU is of (``mfu_peak_flops_per_s``; no
    ``schema_version`` yet)."""
    from autopar.cost.step import mfu_peak_flops_per_s

    doc = annotate(result.to_dict(), problem_certainty(p))
    doc["certainty"]["sharding_note"] = sharding_note(p, result)
    doc["certainty"]["model_rows_note"] = model_note(p)
    return {**doc, "mfu_peak_flops_per_s": mfu_peak_flops_per_s(p)}
