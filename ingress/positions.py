"""Decoding and validating what devices and gateways send (the x-ingress core's input side).

Wire contracts (docs/reference.md, "Wire contracts"):
- MQTT: topic `positions/<tenant>/<object_id>` (AMQP routing key `positions.<tenant>.<object_id>`),
  body JSON `{"lon": float, "lat": float, "ts": epoch_seconds, ...}`; other fields pass through.
- AMQP gateways: exchange `ingress.gateway`, routing key `<tenant>`, body
  `{"positions": [{"id", "lon", "lat", "ts", ...}, ...]}` as JSON, or msgpack with content type
  `application/msgpack`.

The tenant comes from the routing key, which RabbitMQ's topic permissions tie to the
credential that published (a device may publish its own key only, a gateway its tenant's), never
from the body: the ids that leave here are qualified, `<tenant>:<object_id>`
(exchanges/tenancy.py), so two tenants' `car-1` never meet.

Every refusal carries a reason a person can act on ("position 3: lat 91.0 is outside
[-90, 90]"); a batch with some bad positions keeps the good ones. Validation is done on
columns (numpy), so a batch of 10,000 positions costs a few array passes, not 10,000 checks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import orjson

from exchanges.batch import PositionBatch, extra_problem
from exchanges.fence_options.ttl import ttl_problem
from exchanges.ids import is_object_id
from exchanges.tenancy import is_tenant, qualify
from hilbert_c import clamp_lonlat

MAX_BODY_BYTES = 256 * 1024  # a single MQTT position is ~100 bytes; a gateway batch ~100 KB
MAX_BATCH = 50_000
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
# Timestamps: epoch seconds between 2000-01-01 and 2100-01-01 (ms by mistake is refused).
TS_MIN, TS_MAX = 946_684_800.0, 4_102_444_800.0
_KNOWN = ("id", "lon", "lat", "ts")
# The latest ts accepted: (receive time, allowed skew in seconds). A position dated further
# ahead is refused: x-fence ignores positions older than an object's latest, so one position
# from the future (a device or gateway with a wrong clock) would silence its object until
# then, and its timeouts would never fire. None: no receive time (only TS_MAX holds).
Latest = tuple[float, float] | None
_PREFIX = re.compile(r"^position \d+: ")


@dataclass
class Decoded:
    """Valid positions (Hilbert index not yet set) and the refused ones with their reasons."""

    batch: PositionBatch
    refused: list[tuple[int, str]] = field(default_factory=list)  # (position in input, reason)


class Refused(ValueError):
    """The whole message is unusable (not JSON, not an object, too big ...)."""


def object_id_from_routing_key(routing_key: str) -> str:
    """The qualified object id (`<tenant>:<object_id>`) of `positions.<tenant>.<object_id>`."""
    parts = routing_key.split(".")
    if len(parts) != 3 or parts[0] != "positions" or not is_tenant(parts[1]) or not is_object_id(parts[2]):
        raise Refused(f"routing key {routing_key[:80]!r} is not positions.<tenant>.<object_id> (MQTT "
                      "positions/<tenant>/<object_id>; tenants are 1-32 of a-z 0-9 -, object ids 1-64 "
                      "of A-Z a-z 0-9 _ -, each starting with a letter or digit)")
    return qualify(parts[1], parts[2])


def tenant_from_routing_key(routing_key: str) -> str:
    """The tenant a gateway's batch is for: its routing key on ingress.gateway."""
    if not is_tenant(routing_key):
        raise Refused(f"routing key {routing_key[:80]!r} is not a tenant (a gateway publishes its batches "
                      "on ingress.gateway with its tenant as the routing key: 1-32 of a-z 0-9 -)")
    return routing_key


def decode_mqtt(routing_key: str, body: bytes, latest: Latest = None) -> Decoded:
    """One device position: `positions.<tenant>.<object_id>` and a JSON object."""
    oid = object_id_from_routing_key(routing_key)
    obj = _load_json(body)
    if not isinstance(obj, dict):
        raise Refused(f"the body is a JSON {type(obj).__name__}, not an object with lon, lat, ts")
    return _columns([{**obj, "id": oid}], latest, qualified=True)


def decode_mqtt_many(messages: Sequence[tuple[str, bytes]], latest: Latest = None) -> Decoded:
    """Many device positions at once (what x-ingress does under load): one column pass.
    `refused` holds (message index, reason) for each message refused, whole or in part."""
    items: list[Any] = []
    at: list[int] = []  # message index of each item
    refused: list[tuple[int, str]] = []
    for m, (routing_key, body) in enumerate(messages):
        try:
            oid = object_id_from_routing_key(routing_key)
            obj = _load_json(body)
        except Refused as exc:
            refused.append((m, str(exc)))
            continue
        if not isinstance(obj, dict):
            refused.append((m, f"the body is a JSON {type(obj).__name__}, not an object with lon, lat, ts"))
            continue
        items.append({**obj, "id": oid})
        at.append(m)
    decoded = _columns(items, latest, qualified=True)
    refused += [(at[i], _PREFIX.sub("", reason, count=1)) for i, reason in decoded.refused]
    return Decoded(decoded.batch, sorted(refused))


def decode_batch(body: bytes, content_type: str | None, latest: Latest = None, tenant: str = "") -> Decoded:
    """A gateway batch of `tenant` (its routing key, `tenant_from_routing_key`); positions that
    fail validation are refused one by one. The ids that pass are qualified by the tenant."""
    if len(body) > MAX_BODY_BYTES:
        raise Refused(f"body of {len(body):,} bytes is over the {MAX_BODY_BYTES:,}-byte limit")
    if content_type in MSGPACK_TYPES:
        try:
            obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises a zoo of types on garbage
            raise Refused(f"malformed msgpack: {type(exc).__name__}: {exc}") from None
    else:
        obj = _load_json(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("positions"), list):
        raise Refused('the body is not {"positions": [...]}')
    items = obj["positions"]
    if len(items) > MAX_BATCH:
        raise Refused(f"{len(items):,} positions in one batch, over the limit of {MAX_BATCH:,}")
    decoded = _columns(items, latest)
    if tenant:
        decoded.batch.ids[:] = [qualify(tenant, i) for i in decoded.batch.ids]
    return decoded


def _load_json(body: bytes) -> Any:
    if len(body) > MAX_BODY_BYTES:
        raise Refused(f"body of {len(body):,} bytes is over the {MAX_BODY_BYTES:,}-byte limit")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refused(f"malformed JSON: {exc}") from None


def _number(v: Any) -> float:
    # bool is an int in Python; a position with "lat": true is a bug, not a coordinate
    if isinstance(v, bool) or not isinstance(v, int | float):
        return math.nan
    return float(v)


def _columns(items: list[Any], latest: Latest = None, qualified: bool = False) -> Decoded:
    """`qualified`: the ids come from routing keys, checked and qualified already."""
    n = len(items)
    reasons: dict[int, str] = {}
    ids: list[str] = []
    lon = np.empty(n, np.float64)
    lat = np.empty(n, np.float64)
    ts = np.empty(n, np.float64)
    extra: list[dict[str, Any] | None] = []
    for i, p in enumerate(items):
        if not isinstance(p, dict):
            reasons[i] = f"position {i} is a {type(p).__name__}, not an object"
            ids.append("")
            lon[i] = lat[i] = ts[i] = 0.0
            extra.append(None)
            continue
        missing = [k for k in _KNOWN if k not in p]
        if missing:
            reasons[i] = f"position {i}: missing field{'s' if len(missing) > 1 else ''} " + \
                ", ".join(repr(k) for k in missing)
        oid = p.get("id")
        ids.append(oid if isinstance(oid, str) else "")
        if i not in reasons and not qualified and not is_object_id(oid):
            reasons[i] = f"position {i}: id {str(oid)[:80]!r} is not an object id (1-64 of A-Z a-z 0-9 _ -)"
        lon[i], lat[i], ts[i] = _number(p.get("lon")), _number(p.get("lat")), _number(p.get("ts"))
        rest = {k: v for k, v in p.items() if k not in _KNOWN}
        problem = extra_problem(rest) if rest and i not in reasons else None
        if problem is None and "ttl" in rest and i not in reasons:
            problem = ttl_problem(rest["ttl"])
        if problem:
            reasons[i] = f"position {i}: {problem}"
        extra.append(rest or None)
    lon, lat = clamp_lonlat(lon, lat)  # float noise at the world's edge is the edge
    # column checks: the first failing rule names the position
    for name, col, lo, hi in (("lon", lon, -180.0, 180.0), ("lat", lat, -90.0, 90.0),
                              ("ts", ts, TS_MIN, TS_MAX)):
        bad = ~((col >= lo) & (col <= hi))  # NaN (not a number / missing) fails too
        for i in np.flatnonzero(bad).tolist():
            if i in reasons:
                continue
            raw = items[i].get(name) if isinstance(items[i], dict) else None
            if name == "ts" and isinstance(raw, int | float) and not isinstance(raw, bool) \
                    and TS_MIN * 1000 <= raw <= TS_MAX * 1000:
                reasons[i] = f"position {i}: ts {raw!r} looks like milliseconds; send epoch seconds"
            elif isinstance(raw, bool) or not isinstance(raw, int | float):
                reasons[i] = f"position {i}: {name} must be a number, got {type(raw).__name__}"
            elif not math.isfinite(raw):
                reasons[i] = f"position {i}: {name} is {raw!r}, not a finite number"
            else:
                reasons[i] = f"position {i}: {name} {raw!r} is outside [{lo:g}, {hi:g}]"
    if latest is not None:
        now, skew = latest
        for i in np.flatnonzero(ts > now + skew).tolist():
            if i not in reasons:
                ahead = float(ts[i]) - now
                reasons[i] = (f"position {i}: ts {float(ts[i])!r} is {ahead:,.0f} s ahead of the receive "
                              f"time (more than the {skew:g} s allowed: a device or gateway clock ahead)")
    ok = np.ones(n, bool)
    ok[list(reasons)] = False
    keep = np.flatnonzero(ok)
    any_extra = any(extra[i] for i in keep.tolist())
    batch = PositionBatch(
        [ids[i] for i in keep.tolist()], lon[keep], lat[keep], ts[keep],
        np.zeros(keep.size, np.uint64), [extra[i] for i in keep.tolist()] if any_extra else [],
    )
    return Decoded(batch, sorted(reasons.items()))
