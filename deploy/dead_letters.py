"""Dead letters: what a message in a vhost's `dead-letters` queue is, and how to replay it.
The pure core of `geofence dlq` (deploy/dlq_cmd.py is the AMQP shell around it): no I/O.

Two header styles reach a `dead-letters` queue:

- **sidecar**: a sidecar could not process the message and published it there itself
  (exchanges.shell.dead_letter) with `x-geofence-reason` (the reason), `x-geofence-source`
  (the queue it consumed it from) and `x-geofence-routing-key` (its original routing key),
  plus the message's own headers, content type and message id.
- **broker**: RabbitMQ dead-lettered it by policy (reason `delivery_limit` on a quorum queue
  with a delivery limit, `rejected`, `maxlen`, `expired`), adding the `x-death` list (most
  recent first; entries with `reason`, `queue`, `exchange`, `routing-keys`, `count`, `time`)
  and `x-first-death-reason` / `-queue` / `-exchange`. RabbitMQ 3.10 does not keep the quorum
  queue's `x-delivery-count` on the dead-lettered copy, so the number of deliveries is shown
  only when that header is there.

`x-geofence-reason` wins when both styles are present (the last thing that happened to the
message is then the sidecar's verdict; a replay removes both, see below). A message with
neither is of kind `unknown`: reason "unknown", no source, never replayed.

**Replay** puts a message back at the end of the queue it came from, in the same vhost, with
its original routing key (x-ingress reads the object id of an MQTT position from it, so the
default exchange, which would set the routing key to the queue name, is not used: the shell
publishes through a private fanout exchange bound to that one queue). Headers on the replayed
message:
- removed: the dead-lettering records `x-death`, `x-first-death-*`, `x-last-death-*`,
  `x-delivery-count`, `x-geofence-reason`, `x-geofence-source`, `x-geofence-routing-key`
  (a message that fails again gets fresh ones, and its kind and source are then unambiguous;
  a stale `x-delivery-count`, which a sidecar copies when it dead-letters a message from a
  quorum queue, would make a classic queue's consumer take the replay for a suspect);
- set: `x-geofence-replays` (previous value + 1), `x-geofence-last-reason` (why it was
  dead-lettered before this replay), `x-geofence-replayed-at-ms` (epoch milliseconds, an
  integer: pamqp encodes a Python float header as a 32-bit float, ~2 minutes of precision);
- kept: every other header (the application's own).
Properties: content type and encoding, message id, correlation id, timestamp, type, app id,
priority and reply-to are kept; the message is persistent; `user_id` (RabbitMQ refuses a
publish whose user id is not the publisher's) and `expiration` (a replay must not expire on
the way) are dropped. A message without a known source queue is refused (`NotReplayable`):
it stays in the dead-letters queue.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from exchanges import topology as t
from exchanges.shell import reason_key

Kind = Literal["sidecar", "broker", "unknown"]

SOURCE_HEADER = "x-geofence-source"
ROUTING_KEY_HEADER = "x-geofence-routing-key"
REPLAYS_HEADER = "x-geofence-replays"
LAST_REASON_HEADER = "x-geofence-last-reason"
DEAD_LETTERED_AT_HEADER = "x-geofence-dead-lettered-at-ms"  # set by exchanges.shell.dead_letter
REPLAYED_AT_HEADER = "x-geofence-replayed-at-ms"  # an int: pamqp sends floats as 32-bit
SIDECAR_HEADERS = (t.REASON_HEADER, SOURCE_HEADER, ROUTING_KEY_HEADER, DEAD_LETTERED_AT_HEADER)
BROKER_HEADER_PREFIXES = ("x-first-death-", "x-last-death-")
BROKER_HEADERS = ("x-death", "x-delivery-count")
# the message properties a replay keeps (delivery mode: always persistent)
KEPT_PROPERTIES = ("content_type", "content_encoding", "message_id", "correlation_id", "timestamp",
                   "type", "app_id", "priority", "reply_to")
PREVIEW_CHARS = 80
MAX_REASON_CHARS = 1000  # as exchanges.shell.dead_letter


class NotReplayable(ValueError):
    """The message cannot be replayed (it stays in the dead-letters queue)."""


@dataclass(frozen=True)
class RawMessage:
    """A message as read from a vhost's dead-letters queue."""

    vhost: str
    body: bytes
    headers: Mapping[str, Any]
    routing_key: str | None = None  # its routing key in the dead-letters queue
    content_type: str | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    """What one dead letter is: why, from where, what."""

    vhost: str
    kind: Kind
    reason: str  # for people
    reason_key: str  # for counting: variable parts blanked (sidecar) or the broker's reason
    source: str | None  # the queue it was consumed / dead-lettered from
    routing_key: str | None  # its original routing key
    exchange: str | None  # the exchange it was first published to, when the broker says
    time: dt.datetime | None  # when it was dead-lettered, when the broker says
    deaths: int  # how many times the broker dead-lettered it from `source` for that reason
    replays: int  # how many times it was replayed already
    last_reason: str | None  # the reason it had before its last replay
    replayed_at: float | None  # epoch seconds (to the millisecond) of its last replay
    size: int
    content_type: str | None
    message_id: str | None
    preview: str

    @property
    def replayable(self) -> bool:
        return bool(self.source)

    @property
    def group(self) -> str:
        """The reason as a summary shows it: quoted when it is a sidecar's text."""
        return f"'{self.reason_key}'" if self.kind == "sidecar" else self.reason_key

    def to_json(self) -> dict[str, Any]:
        return {"vhost": self.vhost, "kind": self.kind, "reason": self.reason,
                "reason_key": self.reason_key, "source": self.source, "routing_key": self.routing_key,
                "exchange": self.exchange, "time": self.time.isoformat() if self.time else None,
                "deaths": self.deaths, "replays": self.replays, "last_reason": self.last_reason,
                "replayed_at": self.replayed_at, "size": self.size, "content_type": self.content_type,
                "message_id": self.message_id, "preview": self.preview, "replayable": self.replayable}


@dataclass(frozen=True)
class Replay:
    """Where and how to publish a dead letter again: to `queue` of `vhost` only, with
    `routing_key`, these headers and properties, persistent."""

    vhost: str
    queue: str
    routing_key: str
    headers: dict[str, Any]
    properties: dict[str, Any]


@dataclass(frozen=True)
class Filter:
    """Which dead letters a command acts on (every given condition must hold)."""

    vhosts: frozenset[str] = frozenset()  # empty: any
    source: str | None = None  # exact queue name
    reason: str | None = None  # substring of the reason, case-insensitive
    message_id: str | None = None  # exact

    def matches(self, letter: DeadLetter) -> bool:
        return ((not self.vhosts or letter.vhost in self.vhosts)
                and (self.source is None or letter.source == self.source)
                and (self.reason is None or self.reason.casefold() in letter.reason.casefold())
                and (self.message_id is None or letter.message_id == self.message_id))


# --------------------------------------------------------------------------- reading


def text(value: object) -> str | None:
    """A header value as text (pamqp gives bytes for strings that are not UTF-8)."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _int(value: object, default: int = 0) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    s = text(value)
    if s is not None and s.strip().lstrip("-").isdigit():
        return int(s)
    return default


def _time(value: object) -> dt.datetime | None:
    """An AMQP timestamp (aio-pika gives an aware datetime; a number is epoch seconds)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.UTC)
    return None


def preview(body: bytes, chars: int = PREVIEW_CHARS) -> str:
    """The start of the body on one printable line: UTF-8 where it decodes, escapes for the
    rest (bytes as \\xNN, control characters as \\n, \\x00 ...), '…' when truncated. JSON
    string values of secret-looking keys (a fence API request's "token") are masked."""
    head = _SECRET_VALUE.sub(r"\1****", body[: chars * 4 + 4096].decode("utf-8", "backslashreplace"))
    out: list[str] = []
    length = 0
    for c in head:
        piece = c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        if length + len(piece) > chars:
            return "".join(out) + "…"
        out.append(piece)
        length += len(piece)
    return "".join(out) + ("…" if len(body) > chars * 4 + 4096 else "")


_SECRET_VALUE = re.compile(
    r'("[A-Za-z_-]*(?:token|password|passwd|secret|authorization|api[_-]?key)"\s*:\s*")(?:[^"\\]|\\.)*',
    re.IGNORECASE)


def _deaths(headers: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = headers.get("x-death")
    if not isinstance(raw, list | tuple):
        return []
    return [d for d in raw if isinstance(d, Mapping)]


def parse(message: RawMessage) -> DeadLetter:
    """The DeadLetter record of a message read from `message.vhost`'s dead-letters queue."""
    h = message.headers
    deaths = _deaths(h)
    sidecar_reason = text(h.get(t.REASON_HEADER))
    first_reason = text(h.get("x-first-death-reason"))
    exchange: str | None = None
    when: dt.datetime | None = None
    count = 0
    kind: Kind
    if sidecar_reason is not None:
        kind = "sidecar"
        reason = sidecar_reason
        key = reason_key(reason)
        source = text(h.get(SOURCE_HEADER)) or None
        routing_key = text(h.get(ROUTING_KEY_HEADER))
        at_ms = _int(h.get(DEAD_LETTERED_AT_HEADER), -1)
        when = dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC) if at_ms >= 0 else None
    elif deaths or first_reason is not None:
        kind = "broker"
        last = deaths[0] if deaths else {}
        key = text(last.get("reason")) or first_reason or "unknown"
        source = text(last.get("queue")) or text(h.get("x-first-death-queue")) or None
        exchange = text(last.get("exchange"))
        if exchange is None:
            exchange = text(h.get("x-first-death-exchange"))
        keys = last.get("routing-keys")
        routing_key = text(keys[0]) if isinstance(keys, list | tuple) and keys else message.routing_key
        when = _time(last.get("time"))
        count = max(_int(last.get("count"), 1), 1) if last else 1
        reason = _broker_reason(key, source, count, h, deaths, first_reason)
    else:
        kind, reason, key, source, routing_key = "unknown", "unknown", "unknown", None, None
    replayed_ms = _int(h.get(REPLAYED_AT_HEADER), -1)
    replayed_at = replayed_ms / 1000 if replayed_ms >= 0 else None
    return DeadLetter(
        vhost=message.vhost, kind=kind, reason=reason, reason_key=key, source=source,
        routing_key=routing_key, exchange=exchange, time=when, deaths=count,
        replays=max(_int(h.get(REPLAYS_HEADER)), 0), last_reason=text(h.get(LAST_REASON_HEADER)),
        replayed_at=replayed_at, size=len(message.body), content_type=message.content_type,
        message_id=message.message_id, preview=preview(message.body))


def _broker_reason(key: str, source: str | None, count: int, headers: Mapping[str, Any],
                   deaths: list[Mapping[str, Any]], first_reason: str | None) -> str:
    """"delivery_limit (by the broker, from x-ingress.positions)", and what else is known."""
    parts = ["by the broker"]
    if source:
        parts.append(f"from {source}")
    if "x-delivery-count" in headers:  # a quorum queue's count (3.10 drops it on dead-lettering)
        parts.append(f"delivery count {_int(headers['x-delivery-count'])}")
    if count > 1:
        parts.append(f"dead-lettered {count} times")
    first_queue = text(headers.get("x-first-death-queue"))
    if first_reason is not None and (first_reason, first_queue) != (key, source):
        parts.append(f"first: {first_reason}" + (f" from {first_queue}" if first_queue else ""))
    return f"{key} ({', '.join(parts)})"


# --------------------------------------------------------------------------- replaying


def is_dead_letter_header(name: str) -> bool:
    """Headers that describe a dead-lettering (removed on replay)."""
    return (name in BROKER_HEADERS or name in SIDECAR_HEADERS or name.startswith(BROKER_HEADER_PREFIXES)
            or name in (REPLAYS_HEADER, LAST_REASON_HEADER, REPLAYED_AT_HEADER))


def replay_of(letter: DeadLetter, headers: Mapping[str, Any], properties: Mapping[str, Any],
              now: float) -> Replay:
    """How to replay `letter` (whose message had these headers and properties) at `now`.
    Raises NotReplayable when its source queue is not known."""
    if not letter.source:
        raise NotReplayable(f"no known source queue (kind {letter.kind}: "
                            + ("no x-geofence-source header" if letter.kind == "sidecar"
                               else "no x-death queue" if letter.kind == "broker"
                               else "neither x-geofence-* nor x-death headers") + ")")
    kept = {k: v for k, v in headers.items() if not is_dead_letter_header(k)}
    kept[REPLAYS_HEADER] = letter.replays + 1
    kept[LAST_REASON_HEADER] = letter.reason[:MAX_REASON_CHARS]
    kept[REPLAYED_AT_HEADER] = int(now * 1000)
    props = {k: properties[k] for k in KEPT_PROPERTIES if properties.get(k) is not None}
    routing_key = letter.routing_key if letter.routing_key is not None else letter.source
    return Replay(letter.vhost, letter.source, routing_key, kept, props)


def replayed_since(letter: DeadLetter, since: float) -> bool:
    """Replayed at or after `since` (a replay run skips what it replayed itself and came
    back already, so it never goes round in circles)."""
    return letter.replayed_at is not None and letter.replayed_at >= math.floor(since * 1000) / 1000


# --------------------------------------------------------------------------- summaries


def summary(vhost: str, letters: Iterable[DeadLetter], total: int | None = None) -> str:
    """"gf-ingress: 12 dead letters: 9 'lat N is outside [N, N]', 3 delivery_limit" (counts by
    reason, most first). With `total` (the queue's length) when `letters` are those that
    matched a filter: "gf-ingress: 3 of 12 dead letters match: ..."."""
    groups = Counter(letter.group for letter in letters)
    n = sum(groups.values())
    of = n if total is None else max(total, n)
    if of == 0:
        return f"{vhost}: no dead letters"
    noun = "dead letter" if of == 1 else "dead letters"
    head = f"{vhost}: {n} {noun}" if of == n else f"{vhost}: {n} of {of} {noun} match"
    by_reason = sorted(groups.items(), key=lambda gc: (-gc[1], gc[0]))
    return head + (": " + ", ".join(f"{c} {g}" for g, c in by_reason) if n else "")


def json_safe(value: Any) -> Any:
    """A header value as JSON (datetimes as ISO 8601, bytes as text)."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return preview(bytes(value), MAX_REASON_CHARS)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
