"""The published message contract: a JSON Schema (draft-07) for every message body devices,
gateways and applications exchange with the platform, and an AsyncAPI 3.0 document of the
exchanges, routing keys and MQTT topics that carry them (`exchanges/schemas/`, served by the
API under /schemas/).

Every body the platform publishes carries `schema`, the version of its schema: a change that
a consumer written against an older version would misread (a field removed or retyped, a
meaning changed) is a new version and a new set of files; adding an optional field is not.
The event schemas say `additionalProperties: false`, so the tests catch a field added to the
wire without its schema.

Trade-off: the files are hand-written, not generated from the code; tests/unit/test_wire_schemas.py
holds them to the code (the reasons, the ops, the exchange names, what the encoders emit)
and tests/integration's wire tap validates every message the live suite sees.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1  # the `schema` field of every body the platform publishes
SCHEMA_DIR = Path(__file__).with_name("schemas")
ASYNCAPI = "asyncapi.json"


def names() -> list[str]:
    """The files served: every `*.schema.json` and the AsyncAPI document."""
    return sorted(p.name for p in SCHEMA_DIR.glob("*.json"))


@cache
def load(name: str) -> dict[str, Any]:
    """One file, parsed; KeyError for a name that is not one of `names()` (never a path)."""
    if name not in names():
        raise KeyError(name)
    data: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text())
    return data
