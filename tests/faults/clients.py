"""The test's own AMQP clients of the live stack, each at-least-once across broker restarts
and cut connections.

- `EventCollector`: the test's consumer of fence.events (a durable queue, "#"), which dedupes
  on event_id, counts raw deliveries, acks after recording and reconnects for ever (it is
  the system's client: it must not lose events either, broker restarts included); it keeps
  the run's events with their ids qualified again by the event's tenant, and every one that
  pairs a fence with another tenant's object (`crossed`);
- `DeadLetterWatch`: a durable queue on a vhost's `dead-letters` exchange, to see every
  message dead-lettered during a run (with its reason header);
- `Publisher`: the position stream as gateway batches (`Body`) over AMQP with publisher
  confirms, paced, at-least-once (reconnects with backoff and republishes, in order, every
  batch not confirmed: a position published twice is the same observation); each body goes
  to ingress.gateway under its tenant's key, through that tenant's gateway user.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import numpy as np
import orjson
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.fence_events import qualified_ids
from fence.reference import EventTuple
from tests.faults.timing import PUBLISH_TIMEOUT_S

# --------------------------------------------------------------------------- consumers


def _setter(event: asyncio.Event) -> Callable[..., None]:
    """A close callback that sets `event` (whatever it is called with)."""
    def on_close(*_: Any) -> None:
        event.set()
    return on_close


class ReconnectingConsumer:
    """A durable queue of its own, bound as asked, consumed for ever: reconnects with
    backoff when the broker or the connection goes away; the queue (durable, persistent
    messages) keeps what arrives meanwhile. Each message is handled, then acked; a message
    whose ack was lost with the connection comes back and is handled again (raw counts
    include it)."""

    def __init__(self, url: str, queue: str, bindings: Sequence[tuple[str, str]],
                 prefetch: int = 2000) -> None:
        self.url, self.queue, self.bindings, self.prefetch = url, queue, list(bindings), prefetch
        self.reconnects = 0
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def handle(self, message: AbstractIncomingMessage) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """The queue is declared and bound before this returns (nothing published after it is missed)."""
        async with await aio_pika.connect(self.url, timeout=10) as c:
            ch = await c.channel()
            q = await ch.declare_queue(self.queue, durable=True)
            for exchange, key in self.bindings:
                await q.bind(exchange, key)
        self._task = asyncio.create_task(self._run(), name=f"consumer {self.queue}")

    async def _run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            c: AbstractConnection | None = None
            try:
                c = await aio_pika.connect(self.url, timeout=5)
                # aio-pika 10's `closed()` / `is_closed` miss a close by the broker (e.g.
                # CONNECTION_FORCED at its shutdown); the close callbacks do not
                lost = asyncio.Event()
                c.close_callbacks.add(_setter(lost))
                ch = await c.channel()
                ch.close_callbacks.add(_setter(lost))
                await ch.set_qos(prefetch_count=self.prefetch)
                q = await ch.declare_queue(self.queue, durable=True)
                await q.consume(self._on_message)
                delay = 0.1
                closed = asyncio.ensure_future(lost.wait())
                stopped = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait([closed, stopped], return_when=asyncio.FIRST_COMPLETED)
                for f in (closed, stopped):
                    f.cancel()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                if c is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(c.close(), 5)
            if self._stop.is_set():
                return
            self.reconnects += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)  # backoff, cut short by stop
            delay = min(delay * 2, 1.0)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.handle(message)
        with contextlib.suppress(Exception):  # lost with the connection: redelivered, handled again
            await message.ack()

    async def stop(self, delete: bool = True) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 15)
        if delete:
            with contextlib.suppress(Exception):
                async with await aio_pika.connect(self.url, timeout=10) as c:
                    ch = await c.channel()
                    await ch.queue_delete(self.queue)


@dataclass(frozen=True)
class Delivery:
    at: float  # time.monotonic() of receipt
    event: EventTuple
    event_id: str


class EventCollector(ReconnectingConsumer):
    """fence.events (all of it), kept only for the run's fences and objects: the event's tenant
    one of the run's, its fence named with the suite's `fence_prefix` (the fences are the
    session's: tests/faults/session_fences.py), its object with the run's `prefix`. Each kept event is
    qualified again by its tenant (exchanges.fence_events.qualified_ids), as the reference
    names things. `owner`: the tenant of each of the run's objects (by name, as published): an
    event of a run's fence whose object is another tenant's, or a presence event (`shared`,
    its object a pseudonym: the fence saw an object of another tenant), or whose routing key
    names another tenant than the event, is recorded in `crossed` too."""

    def __init__(self, conn: ConnectionSettings, queue: str, fence_prefix: str, prefix: str,
                 owner: Mapping[str, str]) -> None:
        super().__init__(conn["amqp"][t.FENCES_VHOST], queue, [(t.EVENTS_EXCHANGE, "#")])
        self.fence_prefix, self.prefix, self.owner = fence_prefix, prefix, dict(owner)
        self.tenants = frozenset(self.owner.values())
        self.deliveries: list[Delivery] = []  # raw, in order of receipt
        self.distinct: dict[str, EventTuple] = {}
        self.conflicts: list[str] = []  # one event_id, two different events
        self.crossed: dict[str, str] = {}  # event_id -> what crossed (deduped, as `distinct`)
        self.malformed = 0
        self.last_at = time.monotonic()

    def handle(self, message: AbstractIncomingMessage) -> None:
        try:
            e = orjson.loads(message.body)
            tenant, fence, obj = e.get("tenant"), str(e["fence_id"]), str(e["object_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.malformed += 1
            return
        shared = e.get("shared") is True
        if tenant not in self.tenants or not fence.startswith(self.fence_prefix) \
                or not (shared or obj.startswith(self.prefix)):
            return  # not the run's (an object of an earlier run inside the fences is not)
        fence_id, object_id = qualified_ids(e)
        ev: EventTuple = (str(e["event"]), fence_id, object_id, float(e["ts"]), str(e["reason"]))
        eid = str(e["event_id"])
        now = time.monotonic()
        self.last_at = now
        self.deliveries.append(Delivery(now, ev, eid))
        seen = self.distinct.setdefault(eid, ev)
        if seen != ev:
            self.conflicts.append(f"event_id {eid}: {seen} and {ev}")
        key_tenant = (message.routing_key or "").split(".")[1:2]
        whose = self.owner.get(obj, tenant)
        if shared or whose != tenant or key_tenant != [tenant]:
            what = ("a presence event (an object of another tenant)" if shared else
                    f"object of {whose}" if whose != tenant else f"routing key {message.routing_key}")
            self.crossed.setdefault(eid, f"{ev}: {what}")

    @property
    def raw(self) -> int:
        return len(self.deliveries)

    @property
    def duplicates(self) -> int:
        return self.raw - len(self.distinct)


@dataclass(frozen=True)
class DeadLetter:
    vhost: str
    reason: str | None
    source: str | None
    ours: bool  # the body names the run's objects
    bad_input: int | None  # which of the run's planted bad inputs it is, if one


class DeadLetterWatch(ReconnectingConsumer):
    """A copy of everything dead-lettered in one vhost during the run."""

    def __init__(self, conn: ConnectionSettings, vhost: str, queue: str, prefix: str,
                 into: list[DeadLetter]) -> None:
        super().__init__(conn["amqp"][vhost], queue, [(t.DEAD_LETTER_EXCHANGE, "")])
        self.vhost, self.into = vhost, into
        self.ours_marker = prefix.encode()
        self.bad = re.compile(re.escape(prefix.encode()) + rb"bad(\d+)")

    def handle(self, message: AbstractIncomingMessage) -> None:
        h = message.headers or {}
        reason = h.get(t.REASON_HEADER)
        source = h.get("x-geofence-source")
        m = self.bad.search(message.body)
        self.into.append(DeadLetter(self.vhost, None if reason is None else str(reason),
                                    None if source is None else str(source),
                                    self.ours_marker in message.body, int(m.group(1)) if m else None))


# --------------------------------------------------------------------------- the publisher


@dataclass(frozen=True)
class Body:
    lo: int  # first update of the stream it carries (of the batch it is cut from)
    hi: int
    data: bytes
    key: str = ""  # its routing key on ingress.gateway: the tenant whose gateway publishes it
    n: int | None = None  # updates it carries (None: hi - lo)
    bad: int | None = None  # a planted bad input (no valid position): its number

    @property
    def updates(self) -> int:
        if self.bad is not None:
            return 0
        return self.hi - self.lo if self.n is None else self.n


class Publisher:
    """Gateway batches (msgpack) to ingress.gateway with confirms, `window` in flight, paced
    at `rate` updates/s, each body under its key through the gateway user of that key
    (`urls`: routing key -> the AMQP URL of that tenant's gateway user). At-least-once: a
    failed publish or a lost connection ends the session (every connection of it); the next
    one (backoff 0.1-1 s) republishes, in stream order, every body not confirmed, then goes on.
    `set_limit` holds the stream at an update until it is raised."""

    def __init__(self, urls: Mapping[str, str], bodies: Sequence[Body], rate: float, window: int = 8) -> None:
        self.urls, self.bodies, self.rate, self.window = dict(urls), list(bodies), rate, window
        self.confirmed = np.zeros(len(self.bodies), bool)
        self.frontier = 0  # bodies published at least once
        self.sent_updates = 0  # updates of those
        self.republished = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self.limit: int | None = None  # no new body from this update on (None: no limit)
        self._moved = asyncio.Event()
        self.done = asyncio.Event()
        self._due = 0.0

    def set_limit(self, update: int | None) -> None:
        """Publish no new body whose first update is `update` or later (None: go on)."""
        self.limit = update
        self._moved.set()

    @property
    def confirmed_updates(self) -> int:
        return sum(b.updates for b, ok in zip(self.bodies, self.confirmed.tolist(), strict=True) if ok)

    async def run(self) -> None:
        missing = sorted({b.key for b in self.bodies} - set(self.urls))
        assert not missing, f"no gateway for the routing keys {missing}"
        delay = 0.1
        self._due = time.monotonic()
        while not self.confirmed.all():
            conns: list[AbstractConnection] = []
            try:
                for key in self.urls:
                    conns.append(await aio_pika.connect(self.urls[key], timeout=5))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"connect: {type(exc).__name__}: {exc}")
                self.reconnects += 1
                await self._close(conns)
                await asyncio.sleep(delay)  # backoff while the broker is away
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.1
            try:
                exchanges = {}
                for key, conn in zip(self.urls, conns, strict=True):
                    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
                    exchanges[key] = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
                await self._session(exchanges)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"session: {type(exc).__name__}: {exc}")
            finally:
                await self._close(conns)
            if not self.confirmed.all():
                self.reconnects += 1
        self.done.set()

    @staticmethod
    async def _close(conns: Sequence[AbstractConnection]) -> None:
        for conn in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    def _order(self) -> Iterator[int]:
        """Bodies to publish on this connection: first the unconfirmed ones already sent
        (republished, in order), then new ones."""
        retry = [int(i) for i in np.flatnonzero(~self.confirmed[:self.frontier])]
        self.republished += len(retry)
        yield from retry
        while self.frontier < len(self.bodies):
            yield self.frontier

    async def _session(self, exchanges: Mapping[str, aio_pika.abc.AbstractExchange]) -> None:
        sem = asyncio.Semaphore(self.window)
        failed = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def one(k: int) -> None:
            b = self.bodies[k]
            try:
                await asyncio.wait_for(exchanges[b.key].publish(aio_pika.Message(
                    b.data, content_type="application/msgpack",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT), b.key), PUBLISH_TIMEOUT_S)
                self.confirmed[k] = True
            except Exception as exc:
                self.errors.append(f"publish: {type(exc).__name__}: {exc}")
                failed.set()
            finally:
                sem.release()

        try:
            for k in self._order():
                if k == self.frontier:  # a new body: the limit, then the pace
                    while self.limit is not None and self.bodies[k].lo >= self.limit:
                        self._moved.clear()
                        await self._moved.wait()
                    now = time.monotonic()
                    self._due = max(self._due, now - 0.5)
                    if self._due > now:
                        await asyncio.sleep(self._due - now)  # pacing the load
                await sem.acquire()
                if failed.is_set():
                    sem.release()
                    break
                if k == self.frontier:
                    self.frontier += 1
                    self.sent_updates += self.bodies[k].updates
                    self._due += self.bodies[k].updates / self.rate
                tasks.add(asyncio.create_task(one(k)))
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
