"""x-fence's events: ENTER / LEAVE with their reasons, as the workers emit them and the
archive, the API and the MQTT bridge carry them (`to_json` is the wire form). An event's id
hashes the decision and the time of the position it came from, so the same input always
gives the same id and a consumer drops a redelivered event by it.

Visits: the ENTER and the LEAVE of one stay of an object in a fence share a `visit_id` (a
hash of the fence, the object and the stay's start, which the worker keeps with who is
inside, through fence changes, handovers and restarts), and the LEAVE carries `inside_s`, the
time between the two events.

Dwell: a fence with `dwell_s` reports a stay only once the object has been inside that long,
by an ENTER with reason `dwelled` at the first position that shows it (its `inside_s` says how
long the object had been inside then; its visit id is the stay's, as the LEAVE's); a stay that
ends sooner gives no event at all.

Cross: a fence with `cross` reports an object whose two consecutive positions (as its region
saw them) are both outside it while the segment between them passes through it (a fast
vehicle, a sparse tracker) by an event `cross`, reason `crossed`, at the second position.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from exchanges.fence_options import REASONS as OPTION_REASONS
from exchanges.fence_options.cross import CROSSED as CROSSED
from exchanges.fence_options.dwell import DWELLED as DWELLED
from exchanges.fence_options.shares import ANON_PREFIX
from exchanges.fence_options.timeout import TIMEOUT as TIMEOUT
from exchanges.fence_options.ttl import EXPIRED as EXPIRED
from exchanges.tenancy import name_of, qualify, split, tenant_of
from exchanges.wire_schemas import SCHEMA_VERSION

ENTER, LEAVE = "enter", "leave"
CROSS = "cross"  # positions both sides of a fence that detects CROSS, none inside
ENTERED, EXITED, FENCE_CHANGED, FENCE_DELETED = "entered", "exited", "fence_changed", "fence_deleted"
# The reasons the fence options give (each in its module of exchanges/fence_options/): timeout,
# silent longer than the fence's timeout_s; expired, past the object's own TTL (the `ttl` of
# its latest position) when that comes first; dwelled; crossed; and any a new option adds.
_OWN = (ENTERED, EXITED, TIMEOUT, FENCE_CHANGED, FENCE_DELETED, EXPIRED, DWELLED, CROSSED)
REASONS = (*_OWN, *(r for r in OPTION_REASONS if r not in _OWN))
KINDS = (ENTER, LEAVE, CROSS)  # the event kinds
# the core's event codes 0-3 (also their order among equal ts, object, fence): 2 is the ENTER
# of a stay that reached its fence's dwell time (reason `dwelled`), 3 a CROSS (`crossed`)
CODES = (ENTER, LEAVE, ENTER, CROSS)


@dataclass(frozen=True, slots=True)
class Event:
    event: str  # enter | leave | cross
    fence_id: str
    object_id: str
    ts: float
    reason: str
    event_id: str
    # the time of the position the decision came from (not on the wire): `ts` is it, or the
    # fence's change time when that is later (a fence's events are never dated before the
    # change that made its current version); the event id hashes this one
    position_ts: float = field(default=float("nan"), compare=False)
    visit_id: str = field(default="", compare=False)  # shared by a stay's ENTER and LEAVE
    # a LEAVE's: since its stay began; a `dwelled` ENTER's: since the stay began (>= dwell_s)
    inside_s: float | None = field(default=None, compare=False)
    # the position the decision came from (`position_json`), when one did: an ENTER, LEAVE or
    # CROSS of a position, not a timer's LEAVE or a fence change's without one
    position: dict[str, Any] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The wire form: the fence and object as their tenant names them, and `tenant` (the
        fence's, absent for the platform's own names), exchanges/tenancy.py."""
        tenant, fence = split(self.fence_id)
        out = {"schema": SCHEMA_VERSION, "event": self.event, "fence_id": fence,
               "object_id": name_of(self.object_id), "ts": self.ts, "reason": self.reason,
               "event_id": self.event_id}
        if tenant:
            out["tenant"] = tenant
        if self.visit_id:
            out["visit_id"] = self.visit_id
        if self.inside_s is not None:
            out["inside_s"] = self.inside_s
        if self.position is not None:
            out["position"] = self.position
        return out


# Events are made by the thousand per batch. Slots (no __dict__) halve the objects the
# garbage collector tracks, and setting the slots directly skips the frozen __init__'s
# object.__setattr__ per field.
EVENT_SLOTS = tuple(getattr(Event, f).__set__
                     for f in ("event", "fence_id", "object_id", "ts", "reason", "event_id", "position_ts",
                               "visit_id", "inside_s"))
SET_POSITION = getattr(Event, "position").__set__  # noqa: B009 (the slot descriptor)
# A position's extra fields ride in its events up to this size (their JSON); larger ones are
# left out of the event (`fields_truncated`), the position itself is always there.
MAX_FIELDS_BYTES = 2048


def _json_value(value: Any) -> Any:
    """What orjson cannot write itself: a msgpack gateway batch's binary field, as base64."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"{type(value).__name__} is not JSON")


def position_json(lon: float, lat: float, ts: float, fields: dict[str, Any] | None) -> dict[str, Any]:
    """An event's `position`: where and when the object was, and its extra fields as JSON (a
    binary value as base64 text; fields that are not JSON, or whose JSON is over
    MAX_FIELDS_BYTES, are left out: `fields_truncated`)."""
    out: dict[str, Any] = {"lon": lon, "lat": lat, "ts": ts}
    if fields:
        try:
            text = orjson.dumps(fields, default=_json_value)
        except TypeError:
            text = b""
        if text and len(text) <= MAX_FIELDS_BYTES:
            out["fields"] = orjson.loads(text)
        else:
            out["fields_truncated"] = True
    return out


def is_shared(e: Event) -> bool:
    """A presence event: its object is of another tenant than its fence (one the fence counts
    from, exchanges/fence_options/shares.py): a count, never an identity."""
    return tenant_of(e.object_id) != tenant_of(e.fence_id)


def presence_json(e: Event) -> dict[str, Any]:
    """A presence event's wire form: the object's id replaced by a pseudonym of its stay (the
    visit, shared by its ENTER and LEAVE; a CROSS's own id), `shared` true."""
    out = e.to_json()
    out.pop("position", None)  # where another tenant's object was is never the fence's tenant's
    out["object_id"] = ANON_PREFIX + (e.visit_id or e.event_id[:24])
    out["shared"] = True
    return out


def qualified_ids(wire: dict[str, Any]) -> tuple[str, str]:
    """(fence id, object id) of an event's wire form (`Event.to_json`) as the pipeline names
    them: qualified by the event's tenant. Values are returned as found (the caller checks
    they are strings)."""
    tenant = wire.get("tenant") or ""
    fence, obj = wire.get("fence_id"), wire.get("object_id")
    if not isinstance(tenant, str) or not isinstance(fence, str) or not isinstance(obj, str):
        return fence, obj  # type: ignore[return-value]
    if wire.get("shared") is True:  # a presence event's object is a pseudonym, of no tenant
        return qualify(tenant, fence), obj
    return qualify(tenant, fence), qualify(tenant, obj)


def event_id(fence_id: str, version: int, object_id: str, event: str, reason: str, ts: float) -> str:
    """Stable id: the same decision on the same input always gets the same id."""
    text = f"{fence_id}\x1f{version}\x1f{object_id}\x1f{event}\x1f{reason}\x1f{ts!r}"
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def visit_id(fence_id: str, object_id: str, since: float) -> str:
    """A stay's id: the fence, the object, and when the stay began (the ENTER's ts)."""
    return hashlib.blake2b(f"{fence_id}\x1f{object_id}\x1f{since!r}".encode(), digest_size=12).hexdigest()
