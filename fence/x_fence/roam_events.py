"""The proximity events an x-fence worker's roaming matcher reports (fence/x_fence/roaming.py):
`nearby` / `faraway` for a (subscription, object) pair, and their ids.

Invariant: an event id is a function of the pair, the kind and the update that caused it
(who moved, when, where, with which extra fields), never of the worker that reports it or of
when: the messages applied again after a crash give the same events with the same ids, which
consumers drop as duplicates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from exchanges.tenancy import name_of, split
from exchanges.wire_schemas import SCHEMA_VERSION


def fields_key(extra: Mapping[str, Any] | None) -> str:
    """A row's extra fields in one canonical text (sorted keys; "" for none)."""
    return json.dumps(extra, sort_keys=True, separators=(",", ":"), default=str) if extra else ""


class RoamEvent(NamedTuple):
    kind: str  # "nearby" | "faraway"
    subscription: str
    subscriber: str
    object: str
    distance_m: float  # after the update
    ts: float
    id: str

    def key(self) -> tuple[str, str, str, float]:
        return (self.subscription, self.object, self.kind, self.ts)

    def to_json(self) -> dict[str, Any]:
        """The wire form: names as the tenant gave them, and `tenant` (the subscription's;
        absent for the platform's own names), exchanges/tenancy.py."""
        tenant, sub = split(self.subscription)
        subscriber = self.subscriber  # a point's synthetic subscriber "@<tenant>:<id>" stays "@<id>"
        subscriber = "@" + name_of(subscriber[1:]) if subscriber.startswith("@") else name_of(subscriber)
        out = {"schema": SCHEMA_VERSION, "event": self.kind, "subscription": sub, "subscriber": subscriber,
               "object": name_of(self.object), "distance_m": round(self.distance_m, 3), "ts": self.ts,
               "event_id": self.id}
        if tenant:
            out["tenant"] = tenant
        return out


def roam_event_id(subscription: str, obj: str, kind: str, ts: float, mover: str, lon: float,
                  lat: float, fields: str = "") -> str:
    """Stable over replays: the pair, the kind and the update that caused it (who moved, when,
    where, and with which extra fields: `fields_key`; two rows of one object at one ts and
    place whose fields differ are two updates)."""
    return pair_event_id(subscription, obj, kind, update_key(ts, mover, lon, lat, fields))


def update_key(ts: float, mover: str, lon: float, lat: float, fields: str = "") -> str:
    """The update's part of an event id's text (made once per row, shared by its events)."""
    text = f"{ts!r}\x1f{mover}\x1f{lon!r}\x1f{lat!r}"
    return f"{text}\x1f{fields}" if fields else text


def pair_event_id(subscription: str, obj: str, kind: str, update: str) -> str:
    return hashlib.blake2b(f"{subscription}\x1f{obj}\x1f{kind}\x1f{update}".encode(),
                           digest_size=16).hexdigest()
