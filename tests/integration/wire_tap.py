"""Every message the platform publishes on its outputs while the integration suite runs, checked
against the published contract (exchanges/schemas/) as it comes: fence.events under every key
(fence events, presence events, proximity events), fence.event-batches, fence.tenant-batches
and venue.occupancy. The tap's queues are the administrator's own, exclusive, bound before the
first test; it runs on a thread of its own with its own event loop, so no test's loop or
timing depends on it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import aio_pika
import orjson
from aio_pika.abc import AbstractIncomingMessage

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from tests.wire_contract import errors

TAPPED = ((t.FENCES_VHOST, t.EVENTS_EXCHANGE, "#"), (t.FENCES_VHOST, t.EVENT_BATCHES_EXCHANGE, ""),
          (t.FENCES_VHOST, t.TENANT_BATCHES_EXCHANGE, "#"), (t.INGRESS_VHOST, t.OCCUPANCY_EXCHANGE, "#"))
QUIET_S, DRAIN_S, START_S = 1.0, 20.0, 30.0
# A test that publishes a message off the contract on purpose (a malformed body the archiver
# must dead-letter) marks it with this header: the tap counts it apart, unchecked.
FORGED = "x-geofence-test-forged"


def schema_of(exchange: str, routing_key: str) -> str | None:
    """The schema a message of `exchange` under `routing_key` follows; None: no message of the
    platform's goes there."""
    if exchange == t.EVENTS_EXCHANGE:
        if routing_key.startswith((t.EVENTS_TOPIC_PREFIX + ".", "presence.")):
            return "event.schema.json"
        if routing_key.startswith("roam-events."):
            return "proximity-event.schema.json"
        return None
    if exchange in (t.EVENT_BATCHES_EXCHANGE, t.TENANT_BATCHES_EXCHANGE):
        return "event-batch.schema.json"
    if exchange == t.OCCUPANCY_EXCHANGE:
        return "hive-occupancy.schema.json"
    return None


@dataclass
class WireTap:
    stack: ConnectionSettings
    seen: Counter[str] = field(default_factory=Counter)
    invalid: list[str] = field(default_factory=list)
    invalid_count: int = 0
    _last: float = field(default_factory=time.monotonic)
    _ready: threading.Event = field(default_factory=threading.Event)
    _failed: list[BaseException] = field(default_factory=list)

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),),
                                        name="wire-tap", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_S) or self._failed:
            raise AssertionError(f"the wire tap did not start: {self._failed or 'no answer'}")

    def stop(self) -> None:
        """Once nothing came for QUIET_S (at most DRAIN_S): what the last tests caused is in."""
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and time.monotonic() - self._last < QUIET_S:
            time.sleep(0.1)
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(DRAIN_S)

    def check(self, exchange: str, message: AbstractIncomingMessage) -> None:
        self._last = time.monotonic()
        if FORGED in (message.headers or {}):
            self.seen["forged by a test, unchecked"] += 1
            return
        key = message.routing_key or ""
        schema = schema_of(exchange, key)
        where = f"{exchange} {key[:80]!r}"
        if schema is None:
            problems = [f"no message of the platform's is published under {where}"]
        else:
            self.seen[schema] += 1
            try:
                problems = errors(schema, orjson.loads(message.body))
            except orjson.JSONDecodeError as exc:
                problems = [f"not JSON: {exc}"]
        if problems:
            self.invalid_count += 1
            if len(self.invalid) < 20:
                self.invalid.append(f"{where}: {problems[:3]}: {message.body[:300]!r}")

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        connections = []
        try:
            for vhost in {v for v, _, _ in TAPPED}:
                connections.append(conn := await aio_pika.connect(self.stack["amqp"][vhost], timeout=START_S))
                channel = await conn.channel()
                await channel.set_qos(prefetch_count=1000)
                for v, exchange, key in TAPPED:
                    if v != vhost:
                        continue
                    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
                    await queue.bind(exchange, key)

                    async def on(message: AbstractIncomingMessage, exchange: str = exchange) -> None:
                        self.check(exchange, message)
                    await queue.consume(on, no_ack=True)
        except BaseException as exc:
            self._failed.append(exc)
            self._ready.set()
            raise
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for conn in connections:
                await conn.close()

    def summary(self) -> str:
        kinds = ", ".join(f"{n:,} {s.removesuffix('.schema.json')}" for s, n in sorted(self.seen.items()))
        return (f"wire tap: {sum(self.seen.values()):,} messages checked against exchanges/schemas/ "
                f"({kinds or 'none'}), {self.invalid_count} invalid")
