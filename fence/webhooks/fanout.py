"""Which endpoint gets which event, in which lane, under which webhook-id. Pure: event bodies and
endpoints in, outbox rows and request bodies out.

An endpoint's events are split into LANES by their object (a hash), and each lane is delivered
in order, one request at a time: an object's events reach the receiver in the order the
pipeline made them, while one slow object's retries hold back only the objects of its lane.
Trade-off: LANES requests in flight per endpoint at most; a receiver that wants more throughput
takes batches (`batch` > 1: a JSON array of up to `batch` events of one lane per request).

A request's webhook-id is chosen at its first attempt and kept on every retry of it (pinned
with its rows in PostgreSQL), so a receiver that stored a request whose answer was lost drops
the retry by its id. For a single event it is a function of the endpoint and the event, so an
event queued again after its row was removed still has the id it was delivered under.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from fence.webhooks.endpoints import Endpoint

LANES = 8
EVENT_ID_RE = re.compile(r"[0-9a-f]{32}")


class NotEvents(ValueError):
    """A message of the queue that is not an event or an array of them (dead-lettered with this)."""


@dataclass(frozen=True)
class OutboxRow:
    endpoint_id: str
    event_id: str
    lane: int
    body: bytes
    event_ts: float


def lane_of(object_id: str) -> int:
    return zlib.crc32(object_id.encode()) % LANES


def decode(body: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """The events of a message of fence.webhooks (a worker batch's JSON array, or one event:
    a proximity event of fence.events), in time order, and what is wrong with those that are
    not events; NotEvents when the message is neither."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise NotEvents(f"not JSON: {exc}") from None
    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise NotEvents("neither a JSON array of events nor an event object")
    good, bad = [], []
    for i, e in enumerate(items):
        problem = _problem(e)
        if problem:
            bad.append(f"event {i} of {len(items)}: {problem}")
        else:
            good.append(e)
    # in time order: a worker batch lists its events by how x-fence decided them (its ENTERs of
    # one pass, then the LEAVEs of another), so one object's LEAVE can precede its ENTER there
    good.sort(key=lambda e: e["ts"])  # stable: events of one instant keep the batch's order
    return good, bad


def _problem(e: Any) -> str | None:
    if not isinstance(e, dict):
        return "not a JSON object"
    if not isinstance(e.get("event_id"), str) or not EVENT_ID_RE.fullmatch(e["event_id"]):
        return "event_id: 32 hex digits expected"
    ts = e.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        return "ts: epoch seconds expected"
    obj = e.get("object_id", e.get("object"))
    if not isinstance(obj, str) or not obj:
        return "object_id (or a proximity event's object): a string expected"
    if "tenant" in e and not isinstance(e["tenant"], str):
        return "tenant: a string expected"
    return None


def fan_out(events: Iterable[dict[str, Any]], by_tenant: Mapping[str, Sequence[Endpoint]],
            ) -> list[OutboxRow]:
    """One row per (endpoint, event) it wants, among the enabled endpoints of the event's
    tenant (an event of no tenant, or a presence event, goes nowhere: Endpoint.wants)."""
    rows = []
    for e in events:
        endpoints = by_tenant.get(e.get("tenant", ""), ())
        if not endpoints:
            continue
        body: bytes | None = None
        for ep in endpoints:
            if ep.enabled and ep.wants(e):
                if body is None:  # bounded by the pipeline: a position's fields are at most 2 KB
                    body = orjson.dumps(e)
                rows.append(OutboxRow(ep.id, e["event_id"], lane_of(str(e.get("object_id", e.get("object")))),
                                      body, float(e["ts"])))
    return rows


def message_id(endpoint_id: str, event_ids: Sequence[str]) -> str:
    """The webhook-id of a request carrying `event_ids` (in order) to the endpoint."""
    h = hashlib.blake2b(endpoint_id.encode(), digest_size=12)
    for event_id in event_ids:
        h.update(b"." + event_id.encode())
    return "msg_" + h.hexdigest()


@dataclass(frozen=True)
class Head:
    """A lane's oldest rows still to deliver: (seq, event_id, msg_id) in seq order."""

    rows: Sequence[tuple[int, str, str | None]]

    def next_request(self, endpoint_id: str, batch: int) -> tuple[list[int], str, bool]:
        """The seqs of the next request, its webhook-id and whether that id is new (to pin):
        a request already tried is sent again as it was (its pinned rows, its id); else the
        oldest `batch` rows not pinned."""
        if not self.rows:
            return [], "", False
        first = self.rows[0][2]
        if first is not None:
            return [s for s, _, m in self.rows if m == first], first, False
        take = [(s, e) for s, e, m in self.rows[:batch] if m is None]
        return [s for s, _ in take], message_id(endpoint_id, [e for _, e in take]), True


def request_body(bodies: Sequence[bytes], batch: int) -> bytes:
    """What is POSTed: the event itself to an endpoint of batch 1, else a JSON array."""
    if batch == 1 and len(bodies) == 1:
        return bodies[0]
    return b"[" + b",".join(bodies) + b"]"
