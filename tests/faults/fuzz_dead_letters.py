"""The live fuzz run's dead letters (tests/faults/test_fuzzed_inputs.py): every AMQP message of a
run carries the run's marker, its stream and its number in headers (the sidecars copy the
original headers into the dead letter), MQTT ones are known by their routing key (the device's
topic `positions.<tenant>.<id>`, or its old one `positions.<id>`); a private queue on each
vhost's `dead-letters` exchange sees a copy of each, and the run takes its own (and an earlier
run's left behind) out of the shared `dead-letters` queue at the end.

Invariant: a sentinel (a malformed message) published last on a stream is dead-lettered after
everything published before it on that stream (each input queue is handled in order): once the
sentinels are seen, every dead letter of the run is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from exchanges import topology as t

RUN_HEADER = "x-geofence-fuzz-run"  # on every AMQP message of a run: the run's marker
STREAM_HEADER = "x-geofence-fuzz-stream"
NUMBER_HEADER = "x-geofence-fuzz-n"  # its index in its stream
DEADLINE_S = 240.0  # for all the dead letters of the run to be seen


def text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class Marks:
    """What tells the run's messages: its marker, its device (object id) and their tenant."""

    run: str
    device: str
    tenant: str

    @property
    def mqtt_streams(self) -> Mapping[str, str]:
        """The routing keys of the run's MQTT messages -> their stream."""
        return {f"positions.{self.tenant}.{self.device}": "mqtt", f"positions.{self.device}": "mqtt-old"}


@dataclass
class Seen:
    """Dead letters of the run, per stream, from a private queue on a dead-letters exchange."""

    by_stream: Counter[str] = field(default_factory=Counter)
    no_reason: list[str] = field(default_factory=list)
    sentinels: set[str] = field(default_factory=set)
    sources: Counter[str] = field(default_factory=Counter)
    downstream: list[str] = field(default_factory=list)  # what they are (source, reason)
    reasons: dict[tuple[str, int], str] = field(default_factory=dict)  # (stream, number) -> reason (AMQP)
    reasons_of: dict[str, Counter[str]] = field(default_factory=dict)  # stream -> its reasons, counted


class DeadLetters:
    """An exclusive queue bound to a vhost's `dead-letters` exchange: a copy of every dead
    letter from now on (the shared `dead-letters` queue gets its own copy)."""

    def __init__(self, url: str, marks: Marks, seen: Seen) -> None:
        self.url, self.marks, self.seen = url, marks, seen

    async def __aenter__(self) -> DeadLetters:
        self.conn = await aio_pika.connect(self.url, timeout=30)
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=2000)
        self.queue = await ch.declare_queue("", exclusive=True, auto_delete=True)
        await self.queue.bind(t.DEAD_LETTER_EXCHANGE, "")
        await self.queue.consume(self.on_message)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def on_message(self, m: AbstractIncomingMessage) -> None:
        stream = classify(m, self.marks)
        if stream is not None:
            h = m.headers or {}
            reason = text(h.get(t.REASON_HEADER, ""))
            if stream.startswith("sentinel-"):
                self.seen.sentinels.add(stream)
            else:
                self.seen.by_stream[stream] += 1
                self.seen.reasons_of.setdefault(stream, Counter())[reason] += 1
                n = h.get(NUMBER_HEADER)
                if isinstance(n, int):
                    self.seen.reasons[(stream, n)] = reason
                self.seen.sources[text((m.headers or {}).get("x-geofence-source", ""))] += 1
                if stream == "downstream":
                    self.seen.downstream.append(
                        f"{text((m.headers or {}).get('x-geofence-source', '?'))}: {reason[:300]}")
                if not reason.strip():
                    self.seen.no_reason.append(f"{stream}: {m.body[:100]!r}")
        await m.ack()


def classify(m: AbstractIncomingMessage, marks: Marks) -> str | None:
    """The run's stream of a dead letter, or None if it is not the run's. What the sidecars
    after x-ingress dead-letter of the run (its object / fence ids in the body) is
    "downstream": there should be none."""
    h = m.headers or {}
    run = marks.run
    if RUN_HEADER in h:
        return text(h.get(STREAM_HEADER, "?")) if text(h[RUN_HEADER]) == run else None
    mqtt = marks.mqtt_streams.get(text(h.get("x-geofence-routing-key", "")))
    if mqtt is not None:
        return "sentinel-mqtt" if m.body == sentinel(run, "mqtt") else mqtt
    if any(marker.encode() in m.body for marker in (f"fz{run}", f"fh{run}", f"fr{run}", marks.device)):
        return "downstream"
    return None


def sentinel(run: str, stream: str) -> bytes:
    return f"fuzz sentinel {run} {stream}".encode()  # not JSON: dead-lettered


EARLIER = re.compile(rb"fuzz-[0-9a-f]{10}|f[zhr][0-9a-f]{8}")  # a run's device and its ids


def earlier_run(m: AbstractIncomingMessage) -> bool:
    """A dead letter of an earlier fuzz run (one that stopped before taking its own out)."""
    h = m.headers or {}
    key = text(h.get("x-geofence-routing-key", ""))
    return RUN_HEADER in h or re.match(r"positions\.([a-z0-9-]+\.)?fuzz-", key) is not None \
        or EARLIER.search(m.body) is not None


async def drain_own(url: str, marks: Marks) -> int:
    """Ack the run's messages (and earlier fuzz runs' left behind) out of the shared
    dead-letters queue; others' go back untouched. Returns how many of the run's were taken."""
    taken = 0
    async with await aio_pika.connect(url, timeout=30) as conn:
        ch = await conn.channel()
        queue = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
        ready = queue.declaration_result.message_count or 0
        held: list[AbstractIncomingMessage] = []
        for _ in range(ready):
            m = await queue.get(no_ack=False, fail=False, timeout=30)
            if m is None:
                break
            if classify(m, marks) is not None:
                await m.ack()
                taken += 1
            elif earlier_run(m):
                await m.ack()
            else:
                held.append(m)  # unacked until the end, so that get() moves on
        for m in held:
            await m.nack(requeue=True)
    return taken
