"""Error bands: how far autopar's step time and peak memory are off on validation rows like a
problem, so a ranking can say which of its layouts are too close to tell apart.

A band is the mean absolute percentage error (MAPE; Hyndman & Koehler 2006, "Another look at
measures of forecast accuracy") of the scored rows of ``autopar validate``
(:func:`autopar.validate.score.score_rows`) that are *similar* to the problem: the same model
family (dense or MoE), the same precision class (16-bit: bf16/fp16, which share the tensor-core
peak; or fp8) and the same device class (:func:`device_class`). Where fewer than
:data:`MIN_ROWS` such rows exist the device class is dropped, then the precision, then the
family (:data:`LEVELS`), and the band says which group it came from. Step-time bands use the
throughput metrics (:data:`autopar.validate.score.THROUGHPUT`: a step time, tokens/s, TFLOP/s
or MFU row is off by the same relative error as its step time, to first order); memory bands
use ``peak_mem_per_gpu`` rows. One band per group: no per-model or per-row factor.

Scoring the shipped CSV takes seconds, so its per-row errors are cached in
:data:`ERRORS_PATH` (``python -m autopar.validate.bands`` rewrites it;
``tests/validate/test_validate_bands.py`` checks it against a fresh scoring).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

#: Per-row signed errors of the shipped measurements (written by :func:`write_errors`).
ERRORS_PATH = Path(__file__).resolve().parents[1] / "data" / "validation" / "row_errors.json"
#: Fewest similar rows a band is taken from; a smaller group falls back to the next level.
MIN_ROWS = 5
#: The groupings tried in turn, most similar first: the keys of a row that must match.
LEVELS = (("family", "precision", "device_class"), ("family", "precision"), ("family",), ())
KINDS = ("step_time", "memory")

# Device-name prefixes of each device class (architecture generation); see device_class.
_CLASSES = (("gb", "blackwell"), ("b", "blackwell"), ("gh", "hopper"), ("h", "hopper"), ("a", "ampere"),
            ("mi", "amd-instinct"), ("ascend", "ascend"))


def device_class(name: str) -> str:
    """The architecture generation of a device preset name: ``a100-80gb`` -> ``ampere``,
    ``h100-80gb`` / ``h200`` -> ``hopper``, ``b200`` / ``gb200`` -> ``blackwell``, ``mi300x`` ->
    ``amd-instinct``, ``ascend-910b`` -> ``ascend``; any other name (a ``--device-file`` of
    one's own) -> ``other``, which matches no validation row."""
    low = name.lower()
    for prefix, cls in sorted(_CLASSES, key=lambda pc: -len(pc[0])):  # longest prefix first: gb before b
        if low.startswith(prefix) and (low[len(prefix):][:1].isdigit() or prefix == "ascend"):
            return cls
    return "other"


def precision_class(precision: str) -> str:
    """``fp8``, or ``bf16/fp16`` for the 16-bit formats (same tensor-core peak)."""
    return "fp8" if precision == "fp8" else "bf16/fp16"


def similarity_keys(is_moe: bool, precision: str, device_name: str) -> dict[str, str]:
    """The keys rows are grouped by: ``family`` (dense | MoE), ``precision``
    (:func:`precision_class`), ``device_class`` (:func:`device_class`)."""
    return {"family": "MoE" if is_moe else "dense", "precision": precision_class(precision),
            "device_class": device_class(device_name)}


def row_errors(results: Iterable) -> list[dict[str, Any]]:
    """One record per scored row with an error: ``{"id", "kind": step_time | memory, "family",
    "precision", "device_class", "framework", "zero", "model", "devices", "nodes", "metric", "error_pct"}``
    (``framework``: the row's ``TrainSpec.framework``; ``zero``: its layout's ZeRO stage; ``model``,
    ``devices``, ``nodes``: what ran, for the notes that cite the row; ``metric``: the row's
    ``measured_metric``; ``error_pct`` signed, 100 (predicted -
    measured) / measured, rounded to 0.01), from :class:`autopar.validate.score.Result` objects;
    OOM rows and rows of other metrics are left out."""
    from autopar.validate.score import THROUGHPUT

    out = []
    for r in results:
        if r.error_pct is None or r.case is None:
            continue
        kind = "step_time" if r.metric in THROUGHPUT else "memory" if r.metric == "peak_mem_per_gpu" else None
        if kind is None:
            continue
        p = r.case.problem
        out.append({"id": r.row.id, "kind": kind, **similarity_keys(p.model.is_moe, r.case.precision,
                                                                    p.cluster.device.name),
                    "framework": p.train.framework, "zero": r.case.strategy.zero, "model": p.model.name,
                    "devices": p.world_size, "nodes": p.cluster.num_nodes, "metric": r.metric,
                    "error_pct": round(r.error_pct, 2)})
    return out


@dataclass(frozen=True)
class Band:
    """One error band: ``band_pct`` = MAPE (%) of the ``rows`` (validation row ids) of ``group``
    (e.g. ``dense bf16/fp16 rows on hopper devices``), ``max_pct`` the largest ``|error|`` among them
    (the band is a mean, not a bound); both None when no row of the kind exists at all."""

    kind: str
    band_pct: float | None
    group: str
    rows: tuple[str, ...]
    max_pct: float | None = None


def _group_name(kind: str, keys: dict[str, str], level: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    """E.g. ``dense bf16/fp16 step-time/throughput rows on hopper devices``; a group widened past
    the problem's family says when none of its rows is of that family (a MoE problem's memory band
    from dense rows only)."""
    what = "step-time/throughput" if kind == "step_time" else "peak-memory"
    family = keys["family"] + " " if "family" in level else ""
    precision = keys["precision"] + " " if "precision" in level else ""
    device = f"on {keys['device_class']} devices" if "device_class" in level else "on any device"
    unlike = "family" not in level and not any(r["family"] == keys["family"] for r in rows)
    return f"{family}{precision}{what} rows {device}" + (f", none of them {keys['family']}" if unlike else "")


def band_from(records: list[dict[str, Any]], kind: str, keys: dict[str, str], min_rows: int = MIN_ROWS) -> Band:
    """The :class:`Band` of ``kind`` for a problem with similarity ``keys``
    (:func:`similarity_keys`) from ``records`` (:func:`row_errors`): the MAPE of the first
    :data:`LEVELS` group holding at least ``min_rows`` rows (the last level, every row of the
    kind, is taken whatever its size)."""
    of_kind = [r for r in records if r["kind"] == kind]
    for level in LEVELS:
        rows = [r for r in of_kind if all(r[k] == keys[k] for k in level)]
        if len(rows) >= min_rows or (level == () and rows):
            mape = sum(abs(r["error_pct"]) for r in rows) / len(rows)
            return Band(kind, round(mape, 1), _group_name(kind, keys, level, rows), tuple(r["id"] for r in rows),
                        round(max(abs(r["error_pct"]) for r in rows), 1))
    return Band(kind, None, "no validation rows", ())


@lru_cache(maxsize=1)
def shipped_errors() -> tuple[dict[str, Any], ...]:
    """The cached :func:`row_errors` of the shipped measurements (:data:`ERRORS_PATH`)."""
    return tuple(json.loads(ERRORS_PATH.read_text())["rows"])


@dataclass(frozen=True)
class Certainty:
    """The step-time and memory :class:`Band` of one problem."""

    step_time: Band
    memory: Band

    def to_dict(self) -> dict[str, Any]:
        """``step_time_band_pct``, ``memory_band_pct`` and, for each, the group and the row ids it
        came from (the search JSON's ``certainty``)."""
        return {"step_time_band_pct": self.step_time.band_pct, "memory_band_pct": self.memory.band_pct,
                "step_time_group": self.step_time.group, "memory_group": self.memory.group,
                "step_time_rows": list(self.step_time.rows), "memory_rows": list(self.memory.rows),
                "min_rows": MIN_ROWS}


def certainty(is_moe: bool, precision: str, device_name: str) -> Certainty:
    """Both bands of a problem (model family, training precision, device preset name) from the
    shipped validation errors (:func:`shipped_errors`)."""
    keys = similarity_keys(is_moe, precision, device_name)
    records = list(shipped_errors())
    return Certainty(band_from(records, "step_time", keys), band_from(records, "memory", keys))


#: Per export target: the ``framework`` of the validation rows that measured its sharded data
#: parallelism (ZeRO 2/3; None: no row can) and its name, for :func:`sharded_rows_note`. Galvatron's
#: ``sdp`` is PyTorch FSDP, which torchtitan's FSDP2 rows measure.
SHARDED_BY_TARGET: dict[str, tuple[str | None, str]] = {
    "megatron": ("megatron", "Megatron-FSDP"), "megatron-bridge": ("megatron", "Megatron-FSDP"),
    "mindspeed": ("megatron", "Megatron-FSDP"), "torchtitan": ("torchtitan", "FSDP2"),
    "galvatron": ("torchtitan", "PyTorch FSDP"), "deepspeed": ("deepspeed", "DeepSpeed ZeRO-2/3"),
    "sapp": (None, "MindFormers optimizer parallelism"),
}


def sharded_rows(framework: str | None, kind: str = "step_time") -> tuple[dict[str, Any], ...]:
    """The shipped validation records (:func:`row_errors`) of ``kind`` that ran ``framework`` (a
    row's ``TrainSpec.framework``; None: none) with ZeRO 2 or 3 (sharded gradients or weights)."""
    return tuple(r for r in shipped_errors() if r["kind"] == kind and r["framework"] == framework and r["zero"] >= 2)


def _what_ran(r: dict[str, Any]) -> str:
    """A record as the notes cite it: ``MBR-2511-H100-1: llama3-8b fp8, 8 devices on 1 node``."""
    return (f"{r['id']}: {r['model']} {r['precision']}, {r['devices']:,} devices on {r['nodes']:,} "
            f"node{'' if r['nodes'] == 1 else 's'}")


def sharded_rows_note(target: str, zero_stages: Iterable[int], min_rows: int = MIN_ROWS) -> str | None:
    """A caveat for a ranking for export ``target`` whose layouts include ZeRO 2/3 (``zero_stages``:
    theirs) when fewer than ``min_rows`` validation rows measured that target's sharded data parallelism
    (:data:`SHARDED_BY_TARGET`): the band comes from rows that mostly ran without it, so such layouts'
    step times are less certain than it says. E.g. ``zero 2/3 layouts (Megatron-FSDP): 1 measured
    step-time row (MBR-2511-H100-1: llama3-8b fp8, 8 devices on 1 node), fewer than 5: ...``. None
    when no layout shards or enough rows exist.

    Raises:
        KeyError: an unknown ``target``.
    """
    if not any(z >= 2 for z in zero_stages):
        return None
    framework, name = SHARDED_BY_TARGET[target]
    rows = sharded_rows(framework)
    if len(rows) >= min_rows:
        return None
    which = f" ({'; '.join(_what_ran(r) for r in rows)})" if rows else ""
    return (f"zero 2/3 layouts ({name}): {len(rows)} measured step-time row{'' if len(rows) == 1 else 's'}{which}, "
            f"fewer than {min_rows}: their step times are less certain than the band says")


def model_rows(model_name: str, device_name: str, kind: str = "step_time") -> tuple[dict[str, Any], ...]:
    """The shipped validation records (:func:`row_errors`) of ``kind`` that ran a model of this name
    (case-insensitive; the measurements' and the presets' names agree: ``llama3-70b``) on a device of
    ``device_name``'s class (:func:`device_class`)."""
    name, cls = model_name.lower(), device_class(device_name)
    return tuple(r for r in shipped_errors() if r["kind"] == kind and r["model"].lower() == name
                 and r["device_class"] == cls)


#: Metrics that are a time (larger = slower); the others are rates (larger = faster).
TIME_METRICS = ("step_time", "layer_fwd_bwd_time")


def step_time_error_pct(record: dict[str, Any]) -> float:
    """A record's error as the step time's: ``error_pct`` for a time metric, else the time a rate's
    error implies, ``100 / (1 + e/100) - 100`` (a throughput predicted 10% high is a step time 9.1%
    short). Negative: autopar predicts the run faster than it was."""
    e = record["error_pct"]
    return e if record.get("metric", "step_time") in TIME_METRICS else 100.0 / (1.0 + e / 100.0) - 100.0


def model_rows_note(model_name: str, device_name: str, worst: int = 3) -> str | None:
    """What autopar's step time got wrong on measured runs of this very model on this class of
    device (:func:`model_rows`), signed as step time (:func:`step_time_error_pct`: ``-`` = predicted
    faster than measured), so a band averaged over other models does not hide a model-specific
    miss: ``measured runs of qwen3-30b-a3b on hopper devices: 2 rows, autopar's step time -52.8..-8.3%
    of the measured (- = predicted faster; mean |error| 30.6%); worst: MBR-2511-H100-5 (fp8, 16
    devices) -52.8%, ...`` (the ``worst`` largest by ``|error|``). None without such rows."""
    rows = model_rows(model_name, device_name)
    if not rows:
        return None
    errors = [step_time_error_pct(r) for r in rows]
    mean = sum(map(abs, errors)) / len(errors)
    top = sorted(zip(errors, rows), key=lambda er: -abs(er[0]))[:worst]
    listed = ", ".join(f"{r['id']} ({r['precision']}, {r['devices']:,} devices) {e:+.1f}%" for e, r in top)
    return (f"measured runs of {model_name} on {rows[0]['device_class']} devices: {len(rows)} row"
            f"{'' if len(rows) == 1 else 's'}, autopar's step time {min(errors):+.1f}..{max(errors):+.1f}% of the "
            f"measured (- = predicted faster; mean |error| {mean:.1f}%); worst: {listed}")


def write_errors(path: Path = ERRORS_PATH) -> Path:
    """Score the shipped measurements and write their :func:`row_errors` to ``path``."""
    from autopar.validate import DEFAULT_CSV
    from autopar.validate.measurements import read_rows
    from autopar.validate.score import score_rows

    doc = {"source": "autopar/data/validation/measurements.csv scored by autopar validate "
                     "(python -m autopar.validate.bands rewrites this file)",
           "rows": row_errors(score_rows(read_rows(DEFAULT_CSV)))}
    rows = ",\n".join("  " + json.dumps(r) for r in doc["rows"])  # one row a line: diffs stay readable
    path.write_text(f'{{"source": {json.dumps(doc["source"])},\n "rows": [\n{rows}\n]}}\n')
    return path


if __name__ == "__main__":
    print(f"wrote {write_errors()}")
