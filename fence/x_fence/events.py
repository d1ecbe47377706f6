"""x-fence's events: ENTER / LEAVE with their reasons, as the workers emit them and the
archive, the API and the MQTT bridge carry them (`to_json` is the wire form). An event's id
hashes the decision and the time of the position it came from, so the same input always
gives the same id and a consumer drops a redelivered event by it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

ENTER, LEAVE = "enter", "leave"
ENTERED, EXITED, TIMEOUT, FENCE_CHANGED, FENCE_DELETED = (
    "entered", "exited", "timeout", "fence_changed", "fence_deleted")
REASONS = (ENTERED, EXITED, TIMEOUT, FENCE_CHANGED, FENCE_DELETED)
KINDS = (ENTER, LEAVE)  # event kind codes 0, 1 (also their order among equal ts, object, fence)


@dataclass(frozen=True, slots=True)
class Event:
    event: str  # enter | leave
    fence_id: str
    object_id: str
    ts: float
    reason: str
    event_id: str
    # the time of the position the decision came from (not on the wire): `ts` is it, or the
    # fence's change time when that is later (a fence's events are never dated before the
    # change that made its current version); the event id hashes this one
    position_ts: float = field(default=float("nan"), compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.event, "fence_id": self.fence_id, "object_id": self.object_id,
                "ts": self.ts, "reason": self.reason, "event_id": self.event_id}


# Events are made by the thousand per batch. Slots (no __dict__) halve the objects the
# garbage collector tracks, and setting the slots directly skips the frozen __init__'s
# object.__setattr__ per field.
EVENT_SLOTS = tuple(getattr(Event, f).__set__
                     for f in ("event", "fence_id", "object_id", "ts", "reason", "event_id", "position_ts"))


def event_id(fence_id: str, version: int, object_id: str, event: str, reason: str, ts: float) -> str:
    """Stable id: the same decision on the same input always gets the same id."""
    text = f"{fence_id}\x1f{version}\x1f{object_id}\x1f{event}\x1f{reason}\x1f{ts!r}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
