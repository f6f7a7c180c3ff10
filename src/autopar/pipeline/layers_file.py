"""Read a hand-written (or measured) per-layer table for ``autopar balance --layers FILE``.

JSON or YAML::

    pp: 4                      # pipeline stages
    vpp: 1                     # chunks per stage (optional, default 1)
    num_microbatches: 32
    memory_limit_bytes: 80e9   # usable bytes per device
    schedule: 1f1b             # optional (default: 1f1b, interleaved when vpp > 1)
    p2p_s: 0.0                 # optional: one activation transfer between stages
    layers:                    # one entry per decoder layer, in order
      - forward_s: 0.010
        backward_s: 0.020
        static_bytes: 1.5e9    # optional: weights + grads + optimizer state (default 0)
        activation_bytes: {none: 2.0e9, selective: 0.8e9, full: 0.1e9}
        recompute_s: {selective: 0.002}   # optional: none -> 0 (not given), full -> forward_s

Other keys, at the top level or in a layer, are refused (a misspelt key would leave its default
without a word), as is a ``recompute_s`` for ``none``, which recomputes nothing. The recompute
options are the keys of the first layer's ``activation_bytes`` (every layer must give the same
keys). Stages carry no fixed (embedding / output) parts.

Bounded work: a file over :data:`MAX_FILE_BYTES` bytes, more than
:data:`autopar.pipeline.balance.MAX_LAYERS` layers or more than :data:`MAX_OPTIONS` recompute
options is refused before the table is built (the split's cost grows with layers squared times
options).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autopar.errors import AutoparError, read_text
from autopar.pipeline.balance import MAX_LAYERS
from autopar.pipeline.layers import LayerTable
from autopar.specs.long_numbers import json_or_yaml, too_large


MAX_FILE_BYTES = 16_000_000  # 1,024 layers of 16 options take under 1 MB of JSON
MAX_OPTIONS = 16  # recompute options per layer (Megatron has three: none, selective, full)
MAX_LAYER_S = 3600.0  # one layer's forward/backward/recompute or one send: an hour is a typo, not a time
MAX_BYTES = 1e15  # one layer's or one device's bytes (as autopar.specs.cluster.MAX_MEMORY_BYTES): 1e308 summed to inf


TOP_KEYS = ("pp", "vpp", "num_microbatches", "memory_limit_bytes", "schedule", "p2p_s", "layers")
LAYER_KEYS = ("forward_s", "backward_s", "static_bytes", "activation_bytes", "recompute_s")


def _refuse_unknown(path: str, where: str, doc: dict, allowed: tuple[str, ...]) -> None:
    """Refuse a key of ``doc`` (the file's ``where``) outside ``allowed``, as ``--config`` does: a
    misspelt ``p2p`` or ``static_byte`` was ignored and its default used without a word.

    Raises:
        AutoparError: ``FILE: unknown key 'p2p' at the top level; allowed pp, vpp, ...``.
    """
    unknown = [k for k in doc if k not in allowed]
    if unknown:
        raise AutoparError(f"{path}: unknown key {unknown[0]!r} {where}; allowed {', '.join(allowed)}")


@dataclass(frozen=True)
class LayersFile:
    """A parsed ``--layers`` file: the table plus the pipeline sizes it asks for."""

    table: LayerTable
    vpp: int
    num_microbatches: int
    schedule: str


def _number(path: str, where: str, value: Any, positive: bool = False) -> float:
    """``value`` (the file's ``where``) as a float in range: >= 0 (> 0 when ``positive``), at most
    :data:`MAX_LAYER_S` for times, :data:`MAX_BYTES` for sizes.

    Raises:
        AutoparError: not a number, out of range, or too long to be one (a 5,000-digit literal).
    """
    long = too_large(f"{path}: {where}", value, f"at most {MAX_BYTES:g}")
    if long:
        raise AutoparError(long)
    if isinstance(value, bool):  # JSON true is not a time or a size
        raise AutoparError(f"{path}: {where}={value!r}: expected a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise AutoparError(f"{path}: {where}={value!r}: expected a number") from None
    if not np.isfinite(x) or x < 0 or (positive and x == 0):
        raise AutoparError(f"{path}: {where}={value!r}: must be {'> 0' if positive else '>= 0'}")
    seconds = where.endswith("_s") or ".recompute_s." in where
    if seconds and x > MAX_LAYER_S:
        raise AutoparError(f"{path}: {where}={value!r}: at most {MAX_LAYER_S:g} s (one layer's pass or send)")
    if not seconds and x > MAX_BYTES:
        raise AutoparError(f"{path}: {where}={value!r}: at most {MAX_BYTES:g} bytes")
    return x


def _integer(path: str, doc: dict, key: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    long = too_large(f"{path}: {key}", value, "expected a positive integer")
    if long:
        raise AutoparError(long)
    if value is None:
        raise AutoparError(f"{path}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutoparError(f"{path}: {key}={value!r}: expected a positive integer")
    return value


def load_layers_file(path: str) -> LayersFile:
    """Parse ``path`` (JSON, or YAML if it is not JSON) into a :class:`LayersFile`.

    Raises:
        AutoparError: unreadable file, missing, unknown or malformed field (named in the message).
    """
    if Path(path).is_file() and Path(path).stat().st_size > MAX_FILE_BYTES:  # before reading it
        raise AutoparError(f"--layers {path}: {Path(path).stat().st_size:,} bytes, beyond the {MAX_FILE_BYTES:,} a "
                           f"table of {MAX_LAYERS:,} layers needs")
    text = read_text(path, "--layers", "expected JSON or YAML")
    try:
        doc = json_or_yaml(text)
    except RecursionError:  # [[[...]]] beyond Python's recursion limit
        raise AutoparError(f"--layers {path}: nested too deeply to be a layer table") from None
    except ValueError as err:
        raise AutoparError(f"--layers {path}: neither JSON nor YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise AutoparError(f"--layers {path}: expected a mapping with pp, num_microbatches, memory_limit_bytes, layers")
    _refuse_unknown(path, "at the top level", doc, TOP_KEYS)
    pp, vpp = _integer(path, doc, "pp"), _integer(path, doc, "vpp", 1)
    m = _integer(path, doc, "num_microbatches")
    limit = _number(path, "memory_limit_bytes", doc.get("memory_limit_bytes"), positive=True)
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise AutoparError(f"{path}: 'layers' must be a non-empty list of per-layer entries")
    if len(layers) > MAX_LAYERS:
        raise AutoparError(f"{path}: {len(layers):,} layers: balancing splits at most {MAX_LAYERS:,} layers (the exact "
                           "split is quadratic in the layer count)")
    if pp * vpp > len(layers):
        raise AutoparError(f"{path}: pp={pp} x vpp={vpp} exceeds the {len(layers)} layers: some stage would be empty")
    first = layers[0].get("activation_bytes") if isinstance(layers[0], dict) else None
    if not isinstance(first, dict) or not first:
        raise AutoparError(f"{path}: layers[0].activation_bytes must map recompute option -> bytes")
    options = tuple(str(k) for k in first)
    if len(options) > MAX_OPTIONS:
        raise AutoparError(f"{path}: layers[0].activation_bytes has {len(options)} recompute options, at most "
                           f"{MAX_OPTIONS} (the split is searched once per option)")
    rows = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise AutoparError(f"{path}: layers[{i}] must be a mapping")
        _refuse_unknown(path, f"in layers[{i}]", layer, LAYER_KEYS)
        act = layer.get("activation_bytes")
        if not isinstance(act, dict) or tuple(str(k) for k in act) != options:
            raise AutoparError(f"{path}: layers[{i}].activation_bytes must have the keys {', '.join(options)}")
        # a pass takes time: all-zero layers made the speed-up a 0/0 (numpy warnings on stderr)
        fwd = _number(path, f"layers[{i}].forward_s", layer.get("forward_s"), positive=True)
        bwd = _number(path, f"layers[{i}].backward_s", layer.get("backward_s"), positive=True)
        rec_given = layer.get("recompute_s") or {}
        if not isinstance(rec_given, dict) or not set(map(str, rec_given)) <= set(options):
            raise AutoparError(f"{path}: layers[{i}].recompute_s={rec_given!r}: expected a mapping from recompute "
                               f"options ({', '.join(options)}) to seconds")
        if "none" in rec_given:  # 'none' re-runs nothing: a time for it made recomputing look faster
            raise AutoparError(f"{path}: layers[{i}].recompute_s.none={rec_given['none']!r}: option 'none' recomputes "
                               "nothing (its time is 0); give recompute_s only for the options that recompute")
        rec = []
        for name in options:
            default = 0.0 if name == "none" else fwd if name == "full" else None
            value = rec_given.get(name, default)
            if value is None:
                raise AutoparError(f"{path}: layers[{i}].recompute_s.{name} is required for option {name!r}")
            rec.append(_number(path, f"layers[{i}].recompute_s.{name}", value))
        acts = [_number(path, f"layers[{i}].activation_bytes.{n}", act[n]) for n in options]
        rows.append((fwd, bwd, rec, acts, _number(path, f"layers[{i}].static_bytes", layer.get("static_bytes", 0))))
    n_opt = len(options)
    zeros = np.zeros((pp, n_opt))
    table = LayerTable(
        options=options,
        forward_s=np.array([[r[0]] * n_opt for r in rows]), backward_s=np.array([[r[1]] * n_opt for r in rows]),
        recompute_s=np.array([r[2] for r in rows]), activation_bytes=np.array([r[3] for r in rows]),
        static_bytes=np.array([r[4] for r in rows]),
        stage_forward_s=zeros, stage_backward_s=zeros, stage_recompute_s=zeros, stage_bytes=zeros,
        p2p_s=_number(path, "p2p_s", doc.get("p2p_s", 0.0)), memory_limit_bytes=limit)
    schedule = str(doc.get("schedule") or ("interleaved" if vpp > 1 else "1f1b"))
    return LayersFile(table, vpp, m, schedule)
