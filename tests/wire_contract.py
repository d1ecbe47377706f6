"""Validators of the published message contract (exchanges/schemas/) for the tests: each schema
with the others registered under their file names, so their relative `$ref`s resolve."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsonschema
from referencing import Registry, Resource

from exchanges import wire_schemas

SCHEMAS = [n for n in wire_schemas.names() if n.endswith(".schema.json")]


@cache
def _registry() -> Registry:
    return Registry().with_resources(
        (name, Resource.from_contents(wire_schemas.load(name))) for name in SCHEMAS)


@cache
def validator(name: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(wire_schemas.load(name), registry=_registry(),
                                      format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def errors(name: str, body: Any) -> list[str]:
    """What is wrong with `body` by schema `name` (empty: valid)."""
    return [f"{list(e.absolute_path)}: {e.message[:300]}" for e in validator(name).iter_errors(body)]
