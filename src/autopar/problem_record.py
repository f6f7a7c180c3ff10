"""The problem a search result was made for: written into the search JSON as ``"problem"`` and
read back by ``autopar export --from`` (:mod:`autopar.export.result`).

A layout is only the plan for the problem it was costed on: the same tp/pp on another sequence
length, precision or device is another plan. The record holds everything that changes a cost:

* ``model``: ``name``, ``sha256`` (:func:`model_sha256`) and the full ``config`` (every
  :class:`~autopar.specs.ModelSpec` field, so a result exports without the config file);
* ``device``: ``name``, ``sha256`` (:func:`device_sha256`: a ``--device-set`` or ``--device-file``
  override changes it) and the full ``spec``;
* ``cluster``: ``nodes`` and ``devices_per_node``;
* ``train``: every :class:`~autopar.specs.TrainSpec` field (``global_batch_size``, ``seq_len``,
  ``precision``, ``flash_attention``, ``make_vocab_size_divisible_by``, ``moe_token_imbalance``,
  ``fp8_param_storage``, ...).

The hashes are sha256 over the canonical JSON of the spec's fields (sorted keys, no spaces,
floats as Python writes them), without the fields that name or describe it (``name``; a device's
``description`` and ``source``): the same shape under another name is the same model; fields added
later (:data:`ADDED_FIELDS`) count only away from their defaults, so older records still verify.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from autopar.errors import AutoparError, from_validation_error
from autopar.problem import Problem
from autopar.specs import ClusterSpec, DeviceSpec, ModelSpec, TrainSpec

RECORD_VERSION = 1
_MODEL_LABELS = frozenset({"name"})
_DEVICE_LABELS = frozenset({"name", "description", "source"})
# TrainSpec fields that ``search --target`` / ``export --format`` set (autopar.search.grid.for_target),
# not the user: read back as their defaults, then set again for the export format.
TARGET_FIELDS = ("framework", "tp_backward_overlap", "grad_reduce_once")


#: Fields added to a spec after :data:`RECORD_VERSION` 1 was written, with their defaults: left out of
#: the hash while at that default, so a record written before the field existed (its config lacks it
#: and reads back at the default) still verifies. A new field with a default goes here.
ADDED_FIELDS: dict[str, Any] = {"dropout_rates": None}


def _sha256(spec: BaseModel, labels: frozenset[str]) -> str:
    """sha256 hex digest of ``spec``'s fields except ``labels`` and the :data:`ADDED_FIELDS` at their
    defaults, as canonical JSON."""
    added = {k for k, default in ADDED_FIELDS.items() if k in type(spec).model_fields and getattr(spec, k) == default}
    fields = spec.model_dump(mode="json", exclude=set(labels) | added)
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def model_sha256(model: ModelSpec) -> str:
    """Hash of the model's shape and settings (every :class:`ModelSpec` field but ``name``)."""
    return _sha256(model, _MODEL_LABELS)


def device_sha256(device: DeviceSpec) -> str:
    """Hash of the device's numbers (every :class:`DeviceSpec` field but ``name``, ``description``
    and ``source``): a preset and the same preset with a ``--device-set`` override differ."""
    return _sha256(device, _DEVICE_LABELS)


def problem_record(p: Problem) -> dict[str, Any]:
    """The ``"problem"`` object of the search JSON for ``p`` (see the module docstring)."""
    return {
        "version": RECORD_VERSION,
        "model": {"name": p.model.name, "sha256": model_sha256(p.model), "config": p.model.model_dump(mode="json")},
        "device": {"name": p.cluster.device.name, "sha256": device_sha256(p.cluster.device),
                   "spec": p.cluster.device.model_dump(mode="json")},
        "cluster": {"nodes": p.cluster.num_nodes, "devices_per_node": p.cluster.devices_per_node},
        "train": p.train.model_dump(mode="json"),
    }


def _part(record: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = record.get(key)
    if not isinstance(value, dict):
        raise AutoparError(f"--from={path!r}: problem.{key} is {type(value).__name__}, expected an object; "
                           "re-run the search")
    return value


def problem_from_record(record: object, path: str) -> Problem:
    """The :class:`Problem` a ``"problem"`` record describes (``framework`` and
    ``tp_backward_overlap`` at their defaults: the export format sets them).

    Raises:
        AutoparError: not an object of this version, a spec pydantic refuses (field named), or a
            ``sha256`` that does not match its spec (the file was edited by hand).
    """
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
        got = record.get("version") if isinstance(record, dict) else type(record).__name__
        raise AutoparError(f"--from={path!r}: problem record version {got!r}, expected {RECORD_VERSION}; re-run "
                           "the search with this autopar")
    model, device, cluster, train = (_part(record, k, path) for k in ("model", "device", "cluster", "train"))
    try:
        model_spec = ModelSpec.model_validate(model.get("config"))
        device_spec = DeviceSpec.model_validate(device.get("spec"))
        cluster_spec = ClusterSpec(device=device_spec, num_nodes=cluster.get("nodes"),
                                   devices_per_node=cluster.get("devices_per_node"))
        defaults = {k: TrainSpec.model_fields[k].default for k in TARGET_FIELDS}
        train_spec = TrainSpec.model_validate({**train, **defaults})
    except ValidationError as err:
        raise from_validation_error(err, f"{path} problem") from None
    for what, spec, digest in (("model", model_spec, model_sha256), ("device", device_spec, device_sha256)):
        if digest(spec) != _part(record, what, path).get("sha256"):
            raise AutoparError(f"--from={path!r}: problem.{what}.sha256 does not match its fields (edited by "
                               "hand?); re-run the search")
    return Problem(model_spec, cluster_spec, train_spec)
