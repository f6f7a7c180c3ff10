"""Batch-size search (``autopar search --gbs-range``): the best layout for each global batch size.

As Galvatron's ``min_bsz``..``max_bsz`` by ``bsz_scale`` sweep: one full search
(:func:`autopar.search.grid.search`, same constraints, target and margin) per gbs, keeping its #1.
A larger batch amortises the pipeline bubble and the data-parallel gradient reduction over more
tokens, so tokens/s per device rises with gbs until memory or the micro-batch count limits it; the
sweep reports the gbs with the most tokens/s per device, the smallest gbs whose tokens/s per device
is within autopar's step-time band of that best (where throughput saturates: a larger batch gains
less than the model can resolve), and the largest gbs any layout fits, saying when that is only the
range's top (memory does not limit the batch: a larger gbs adds micro-batches, not activations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autopar.errors import AutoparError
from autopar.estimate import Estimate
from autopar.problem import Problem
from autopar.search.constraints import Constraint
from autopar.space import SpaceOptions

MAX_POINTS = 64  # one full search each
MAX_GBS = 2**30  # as --gbs


def parse_gbs_range(text: str) -> list[int]:
    """``--gbs-range``: ``FIRST:LAST`` (FIRST, 2 FIRST, 4 FIRST, ... up to LAST), ``FIRST:LAST:STEP``
    (arithmetic) or a comma-separated list; sorted, without repeats.

    Raises:
        AutoparError: a non-integer, other than 2 or 3 ':'-separated numbers, a value outside
            1..2^30, FIRST > LAST, a step < 1, or more than
            :data:`MAX_POINTS` batch sizes.
    """
    form = "FIRST:LAST (FIRST doubled up to LAST: FIRST, 2 FIRST, 4 FIRST, ...), FIRST:LAST:STEP or a list such as " \
           "256,512,1024"
    from autopar.integers import is_integer_text

    if not all(is_integer_text(t) for t in text.replace(":", ",").split(",")):
        raise AutoparError(f"--gbs-range={text!r}: integers expected, as {form}")
    parts = [int(t) for t in text.split(":")] if ":" in text else None
    values = [int(t) for t in text.split(",")] if parts is None else []
    if parts is not None:
        if len(parts) not in (2, 3):
            raise AutoparError(f"--gbs-range={text!r}: {len(parts)} ':'-separated numbers; give 2 or 3, as {form}")
        if any(v < 1 for v in parts) or parts[0] > parts[1]:
            raise AutoparError(f"--gbs-range={text!r}: FIRST <= LAST and STEP >= 1, all positive, as {form}")
        first, last = parts[:2]
        if len(parts) == 3:
            values = list(range(first, last + 1, parts[2]))[:MAX_POINTS + 1]
        else:
            values = [first << k for k in range(0, MAX_POINTS + 1) if first << k <= last]
    if not values or any(not 0 < v <= MAX_GBS for v in values):
        raise AutoparError(f"--gbs-range={text!r}: each batch size must be in 1..{MAX_GBS}, as {form}")
    values = sorted(set(values))
    if len(values) > MAX_POINTS:
        raise AutoparError(f"--gbs-range={text!r}: more than {MAX_POINTS} batch sizes (one search each); "
                           "use a larger step or a shorter range")
    return values


@dataclass
class BatchPoint:
    """One batch size: its best layout (``best``), or why none (``reason``)."""

    gbs: int
    best: Estimate | None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The point's JSON: gbs, the best layout as in the search JSON (or null) and the reason."""
        return {"gbs": self.gbs, "best": self.best.to_dict(self.gbs) if self.best else None, "reason": self.reason}


@dataclass
class BatchSearch:
    """The sweep: one :class:`BatchPoint` per gbs, in increasing gbs."""

    points: list[BatchPoint]
    target: str

    @property
    def fitting(self) -> list[BatchPoint]:
        """The points with a layout that fits."""
        return [pt for pt in self.points if pt.best is not None]

    @property
    def best_throughput(self) -> BatchPoint | None:
        """The point with the most tokens/s per device (the smaller gbs on a tie), or None."""
        return max(self.fitting, key=lambda pt: (pt.best.tokens_per_s_per_device, -pt.gbs), default=None)

    @property
    def largest_fitting(self) -> BatchPoint | None:
        """The largest gbs with a fitting layout, or None."""
        return self.fitting[-1] if self.fitting else None

    @property
    def memory_limits_gbs(self) -> bool:
        """Whether memory bounds the batch inside the range: False when the range's largest gbs
        still has a fitting layout (then "largest that fits" is only the range's top)."""
        return self.points[-1].best is None

    def saturating(self, band_pct: float | None) -> BatchPoint | None:
        """The smallest gbs whose tokens/s per device is within ``band_pct`` % of the best point's
        (``t >= t_best (1 - band_pct / 100)``; the step-time band of
        :func:`autopar.report.ties.problem_certainty`, as the ``≈1`` ties), or None without a band or
        a fitting point. E.g. 1,167 tok/s/dev at gbs 16 against a best of 1,177 with a 4.3 % band: gbs 16."""
        best = self.best_throughput
        if best is None or band_pct is None:
            return None
        floor = best.best.tokens_per_s_per_device * (1 - band_pct / 100)
        return next(pt for pt in self.fitting if pt.best.tokens_per_s_per_device >= floor)

    @property
    def sharding_note(self) -> str | None:
        """The caveat on sharded (ZeRO 2/3) step times when a best layout of the sweep is sharded
        and few measured rows back them (:func:`autopar.validate.bands.sharded_rows_note`), or None."""
        from autopar.validate.bands import sharded_rows_note

        return sharded_rows_note(self.target, (pt.best.strategy.zero for pt in self.fitting))

    def to_dict(self, band_pct: float | None = None) -> dict[str, Any]:
        """The ``--gbs-range --json`` document (``band_pct``: the step-time band for
        :meth:`saturating`)."""
        best, largest, saturating = self.best_throughput, self.largest_fitting, self.saturating(band_pct)
        return {"points": [pt.to_dict() for pt in self.points], "target": self.target,
                "sharding_note": self.sharding_note,
                "best_tokens_per_s_per_device_gbs": best.gbs if best else None,
                "saturating_gbs": saturating.gbs if saturating else None, "saturating_band_pct": band_pct,
                "largest_fitting_gbs": largest.gbs if largest else None,
                "memory_limits_gbs": self.memory_limits_gbs}


def batch_search(p: Problem, gbs_values: list[int], memory_margin: float, options: SpaceOptions | None,
                 target: str, constraints: list[Constraint]) -> BatchSearch:
    """One search per gbs of ``gbs_values`` on ``p`` (its other fields unchanged).

    A gbs where no layout is valid or fits gets the search's one-line reason instead of a layout.
    """
    from autopar.search.grid import search

    points = []
    for gbs in gbs_values:
        q = Problem(p.model, p.cluster, p.train.model_copy(update={"global_batch_size": gbs}))
        try:
            points.append(BatchPoint(gbs, search(q, 1, memory_margin, options, target, constraints).layouts[0]))
        except AutoparError as err:
            points.append(BatchPoint(gbs, None, str(err)))
    return BatchSearch(points, target)
