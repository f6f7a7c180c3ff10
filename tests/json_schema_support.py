"""Validate a ``--json`` document against its schema in ``autopar/data/schemas`` (jsonschema,
draft 2020-12; ``common.schema.json`` resolved by name)."""

from __future__ import annotations

import jsonschema
from referencing import Registry, Resource

from autopar.schemas import DOCUMENTS, schema


def registry() -> Registry:
    """Every schema file as a resource under its ``$id`` (its file name)."""
    return Registry().with_resources(
        (schema(n)["$id"], Resource.from_contents(schema(n))) for n in ("common", *DOCUMENTS))


def assert_valid(name: str, doc: object) -> None:
    """Raise ``jsonschema.ValidationError`` (its path and message) unless ``doc`` is a valid
    document ``name`` of the current version."""
    validator = jsonschema.Draft202012Validator(schema(name), registry=registry())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    assert not errors, "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors[:5])
