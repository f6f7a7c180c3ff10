"""Read one layout back from a search result JSON (the README's stable schema)."""

from __future__ import annotations


from pydantic import ValidationError

from autopar.errors import AutoparError, from_validation_error, read_text
from autopar.problem import Problem
from autopar.specs.long_numbers import json_loads, too_large
from autopar.specs.model import MAX_SIZE
from autopar.strategy import RECOMPUTE_MODULES, Strategy

_FIELDS = ("dp", "tp", "pp", "vpp", "cp", "ep", "etp", "mbs", "zero", "sp", "recompute", "recompute_layers",
           "schedule", "layers_per_stage", "recompute_per_stage", "recompute_modules", "account_for_embedding",
           "account_for_loss", "tp_comm_overlap", "cp_comm_type", "cp_a2a")


def _modules(value: object, path: str, rank: int) -> tuple[str, ...]:
    """The ``recompute_modules`` entry of layout ``rank`` as a tuple of Megatron module names.

    Raises:
        AutoparError: not a non-empty list of names from :data:`~autopar.strategy.RECOMPUTE_MODULES`
            (one line, instead of pydantic's per-item errors).
    """
    if not (isinstance(value, list) and value and all(isinstance(n, str) and n in RECOMPUTE_MODULES for n in value)):
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
        raise AutoparError(f"--from={path!r}: layout {rank} recompute_modules={shown}: expected a list of one or "
                           f"more of {', '.join(RECOMPUTE_MODULES)} (e.g. [\"core_attn\"])")
    return tuple(value)


def strategy_from_result(path: str, rank: int, p: Problem) -> Strategy:
    """Layout number ``rank`` (1 = best) of the search result at ``path``.

    Raises:
        AutoparError: a path that is not a regular file, unreadable file, not a search result, rank out of range, a layout whose
            world size or global batch differs from the problem's.
    """
    text = read_text(path, "--from", "expected a search result JSON")  # a FIFO would block the read
    try:
        doc = json_loads(text)
        layouts = doc["layouts"]
    except (ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: [[[...]]]
        raise AutoparError(f"--from={path!r}: not a readable search result ({err})") from None
    if not isinstance(layouts, list):
        raise AutoparError(f"--from={path!r}: 'layouts' is a {type(layouts).__name__}, expected the list a search "
                           "result holds")
    if not layouts:  # was "--rank=1: the result holds layouts 1..0"
        raise AutoparError(f"--from={path!r}: the result holds no layouts (its search found none that fit)")
    if not 1 <= rank <= len(layouts):
        raise AutoparError(f"--rank={rank}: the result holds layouts 1..{len(layouts)}")
    raw = layouts[rank - 1].get("strategy") if isinstance(layouts[rank - 1], dict) else None
    if not isinstance(raw, dict):
        raise AutoparError(f"--from={path!r}: layouts[{rank - 1}] has no 'strategy' object")
    fields = {k: raw[k] for k in _FIELDS if k in raw}
    for key in ("gbs", *fields):
        why = too_large(key, raw.get(key), f"sizes are at most {MAX_SIZE}")
        if why:
            raise AutoparError(f"--from={path!r}: layout {rank} {why}")
    for key in ("layers_per_stage", "recompute_per_stage"):
        value = fields.get(key)
        if value is not None and not isinstance(value, list):
            raise AutoparError(f"--from={path!r}: layout {rank} {key}={value!r}: expected a list (one entry per "
                               "pipeline stage) or null")
        fields[key] = tuple(value or ()) or None
    if "recompute_modules" in fields:
        fields["recompute_modules"] = _modules(fields["recompute_modules"], path, rank)
    try:
        s = Strategy.model_validate(fields, strict=True)  # a JSON true or "8" is not a size
    except ValidationError as err:
        raise from_validation_error(err, f"{path} layout {rank}") from None
    gbs = raw.get("gbs", p.train.global_batch_size)
    if isinstance(gbs, bool) or not isinstance(gbs, int):
        raise AutoparError(f"--from={path!r}: layout {rank} gbs={gbs!r}: expected an integer")
    if s.world_size != p.world_size or gbs != p.train.global_batch_size:
        raise AutoparError(f"--from={path!r}: layout {rank} is for {s.world_size} devices and gbs {raw.get('gbs')}, "
                           f"the problem has {p.world_size} and gbs {p.train.global_batch_size}; pass the same "
                           "--nodes/--gbs as the search")
    return s
