"""The platform's events, typed (its JSON Schemas, `GET /schemas`: event.schema.json and
proximity-event.schema.json, version 1). `parse` takes a message or a webhook body (one event,
or a JSON array of them) and gives each as a `FenceEvent` or a `ProximityEvent`; fields a later
version adds are kept in `extra`, never refused."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
FENCE_KINDS = ("enter", "leave", "cross")
PROXIMITY_KINDS = ("nearby", "faraway")


class NotAnEvent(ValueError):
    pass


@dataclass(frozen=True)
class Position:
    lon: float
    lat: float
    ts: float
    fields: dict[str, Any] | None = None  # the position's extra fields (None: none, or too big)
    fields_truncated: bool = False


@dataclass(frozen=True)
class FenceEvent:
    event: str  # enter | leave | cross
    fence_id: str
    object_id: str  # a presence event's: a pseudonym of the stay (shared is True)
    ts: float
    reason: str
    event_id: str  # stable: drop a redelivery by it
    tenant: str = ""
    visit_id: str | None = None  # shared by the ENTER and the LEAVE of one stay
    inside_s: float | None = None
    shared: bool = False
    position: Position | None = None
    schema: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProximityEvent:
    event: str  # nearby | faraway
    subscription: str
    subscriber: str
    object: str
    distance_m: float
    ts: float
    event_id: str
    tenant: str = ""
    schema: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)


Event = FenceEvent | ProximityEvent
_FENCE = ("event", "fence_id", "object_id", "ts", "reason", "event_id", "tenant", "visit_id", "inside_s",
          "shared", "position", "schema")
_PROXIMITY = ("event", "subscription", "subscriber", "object", "distance_m", "ts", "event_id", "tenant",
              "schema")


def event_of(data: Any) -> Event:
    """One decoded event body as its type; NotAnEvent says why not."""
    if not isinstance(data, dict):
        raise NotAnEvent("an event is a JSON object")
    kind = data.get("event")
    try:
        if kind in FENCE_KINDS:
            p = data.get("position")
            position = None if p is None else Position(
                float(p["lon"]), float(p["lat"]), float(p["ts"]), p.get("fields"),
                bool(p.get("fields_truncated", False)))
            known = {k: data[k] for k in _FENCE if k in data and k != "position"}
            extra = {k: v for k, v in data.items() if k not in _FENCE}
            return FenceEvent(**known, position=position, extra=extra)
        if kind in PROXIMITY_KINDS:
            known = {k: data[k] for k in _PROXIMITY if k in data}
            return ProximityEvent(**known, extra={k: v for k, v in data.items() if k not in _PROXIMITY})
    except (KeyError, TypeError, ValueError) as exc:
        raise NotAnEvent(f"a {kind} event without what it needs: {exc}") from None
    raise NotAnEvent(f"unknown event kind {str(kind)[:40]!r}")


def parse(body: bytes | str) -> list[Event]:
    """The events of a message or a webhook request: one event object, or a JSON array."""
    data = json.loads(body)
    return [event_of(e) for e in (data if isinstance(data, list) else [data])]
