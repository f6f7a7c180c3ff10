"""The free-text and optional cells of a measurements row, read into typed knobs.

Each reader takes one :class:`~autopar.validate.measurements.Row` and returns the knob, ``None``
where the row leaves it to its source's default, or raises :class:`Unscorable` naming the CSV
column, the value and what is allowed. Nothing here guesses a value silently: a default that had
to be assumed is appended to the caller's ``assumed`` list, which ``rows.md`` prints.
"""

from __future__ import annotations

import re

from autopar.specs.model import MAX_SIZE
from autopar.validate.measurements import Row


class Unscorable(Exception):
    """A row autopar cannot score; ``str()`` is the reason shown in the report (one line that
    names the CSV column, the value and what is allowed)."""


def required(row: Row, column: str, why: str) -> int:
    """A count the row must state (``read_rows`` has checked it is a whole number >= 1).

    Raises:
        Unscorable: ``{column} is empty: {why}``.
    """
    value = row.int(column)
    if value is None:
        raise Unscorable(f"{column} is empty: {why}")
    return value


_TRUE, _FALSE = ("1", "true", "yes", "on", "y", "t"), ("0", "false", "no", "off", "n", "f")


def flag_of(row: Row, column: str) -> bool | None:
    """A yes/no cell (``sp``): the usual spellings of true and false, any case; None when empty.

    Raises:
        Unscorable: any other text (``sp='maybe'``).
    """
    text = row[column].lower()
    if not text:
        return None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise Unscorable(f"{column}={row[column]!r}: expected 1/0, true/false, yes/no or on/off (or empty: the "
                     "source's default)")


# Number formats below fp8 (or integer training) that autopar's cost model has no peak or byte
# convention for; a row that trains in one of them is refused, not costed as bf16.
_UNMODELLED_PRECISION = re.compile(r"\b(nv|mx)?(fp4|fp6|int8|int4)\b|\bfloat4\b")


def precision_of(row: Row, assumed: list[str] | None = None) -> str:
    """Training precision from the ``prec=`` segment of ``notes``: fp8 (incl. Float8 linears,
    FP8-CS, FP8-MX), else whichever of fp16/bf16 it names first ("mixed (fp16 assumed: BF16
    optimizer only introduced 02-28)" is fp16), else bf16, recorded in ``assumed`` ("mixed fp16/bf16
    (not specified)" counts as bf16: both have the same tensor-core peak). fp16 matters for memory:
    DeepSpeed runs fp16 without BF16_Optimizer's fp32 gradient buffer
    (:mod:`autopar.cost.framework_memory`).

    Raises:
        Unscorable: the segment names fp4/fp6/int8/int4 training, or only fp32/tf32 (autopar
            models 16-bit mixed precision and fp8).
    """
    notes = row["notes"]
    segment = next((s.strip() for s in notes.split(";") if s.strip().lower().startswith("prec=")), "")
    prec = segment.lower().replace("fp16/bf16", "")  # "either": same tensor-core peak, bf16 below
    unmodelled = _UNMODELLED_PRECISION.search(prec)
    if unmodelled:
        raise Unscorable(f"notes: {segment!r}: {unmodelled.group(0)} training is not modelled "
                         "(autopar costs bf16, fp16 and fp8)")
    if "fp8" in prec or "float8" in prec:
        return "fp8"
    fp16, bf16 = prec.find("fp16"), prec.find("bf16")
    if fp16 >= 0 and (bf16 < 0 or fp16 < bf16):
        return "fp16"
    if bf16 < 0:
        if re.search(r"\b(fp32|tf32|float32)\b", prec) and "mixed" not in prec:
            raise Unscorable(f"notes: {segment!r}: fp32/tf32 training is not modelled (autopar costs bf16, "
                             "fp16 and fp8)")
        if assumed is not None:
            assumed.append("precision=bf16 (notes do not name it)")
    return "bf16"


def fp8_recipe_of(row: Row, precision: str) -> str | None:
    """``TrainSpec.fp8_recipe`` of an fp8 row from its ``prec=`` note: ``FP8-CS`` (NVIDIA's
    performance tables: current scaling) and torchtitan's ``Float8`` linears (torchao's default
    ``tensorwise`` dynamic scaling, torchtitan ``float8.recipe_name``) are ``tensorwise``, ``FP8-MX``
    is ``mxfp8``, ``blockwise``/``FP8-SS`` (sub-channel) is ``blockwise``; None (the framework's
    default, :attr:`~autopar.specs.train.TrainSpec.effective_fp8_recipe`) when the note names none,
    and for bf16/fp16 rows."""
    if precision != "fp8":
        return None
    notes = row["notes"]
    prec = next((s.strip() for s in notes.split(";") if s.strip().lower().startswith("prec=")), "").lower()
    if "fp8-mx" in prec or "mxfp8" in prec:
        return "mxfp8"
    if "fp8-cs" in prec or "float8" in prec or "tensorwise" in prec:
        return "tensorwise"
    if "blockwise" in prec or "fp8-ss" in prec:
        return "blockwise"
    return None


def zero_of(row: Row) -> int | None:
    """ZeRO stage from ``zero_or_distopt``: ``ZeRO-0..3``, FSDP (= 3), a distributed optimizer
    (= 1, Megatron's ``--use-distributed-optimizer``), DDP (= 0); None when empty.

    Raises:
        Unscorable: a ZeRO stage above 3, or text that names none of these.
    """
    text = row["zero_or_distopt"]
    low = text.lower()
    if not text:
        return None
    match = re.search(r"zero-?(\d+)", low)
    if match:
        if int(match.group(1)) > 3:
            raise Unscorable(f"zero_or_distopt={text!r}: ZeRO stages are 0-3")
        return int(match.group(1))
    if "fsdp" in low:
        return 3
    if "distributed optimizer" in low or "distopt" in low:
        return 1
    if low in ("ddp", "none", "no"):
        return 0
    raise Unscorable(f"zero_or_distopt={text!r}: expected ZeRO-0 .. ZeRO-3, FSDP, distributed optimizer, DDP "
                     "or empty (the source's default)")


def recompute_of(row: Row, assumed: list[str]) -> str | None:
    """Activation recompute from the ``recompute`` cell: text starting with none, selective or
    full (a note after it is kept in ``rows.md``: "full (assumed, as production)" is recorded
    as assumed); None when empty.

    Raises:
        Unscorable: text that starts with none of the three.
    """
    text = row["recompute"].lower()
    if not text:
        return None
    for kind in ("none", "selective", "full"):
        if text.startswith(kind):
            if "assumed" in text:
                assumed.append(f"recompute={kind} (source note)")
            return kind
    raise Unscorable(f"recompute={row['recompute']!r}: expected none, selective or full (or empty: the source's "
                     "default)")


def expert_tp_of(row: Row) -> int | None:
    """``etp`` stated in the notes (``ETP=1``: the dgxc-benchmarking DeepSeek-V3 and Grok-1 H100
    recipes set ``expert_tensor_parallel_size`` apart from tp), else None = tp (Megatron's default).

    Raises:
        Unscorable: ``ETP=`` with something other than a whole number in 1..2^31.
    """
    match = re.search(r"\bETP=(\S*?)(?=[\s;,]|$)", row["notes"])
    if match is None:
        return None
    text = match.group(1)
    if not (text.isdigit() and 1 <= int(text) <= MAX_SIZE):
        raise Unscorable(f"notes: ETP={text!r}: expected a whole number in 1..{MAX_SIZE}")
    return int(text)
