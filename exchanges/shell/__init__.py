"""The asyncio shell every sidecar shares: configuration, connections, intake, publishing,
dead-lettering, lifecycle. The roles' shells (ingress/sidecar.py, exchanges/geo_sidecar.py,
fence/sidecar.py) only decode, call their core, publish what it returns and settle.

Invariants:
- A message is settled in one place (`settle`), after everything it caused is confirmed by
  the broker. One channel per consumed queue and one batch in flight per channel, so the
  batch's messages are exactly the channel's unacked deliveries up to the last one: a single
  `ack(multiple=True)` settles the batch (one frame instead of thousands).
- Bad input is never acked silently: the role publishes it to the vhost's `dead-letters`
  exchange with the reason (header x-geofence-reason), confirmed, before the ack; `Counters`
  counts it by reason.
- A publish refused by the broker (a full queue with overflow reject-publish, or an
  unroutable mandatory message while a federation link is down) is retried with backoff while
  the input stays unacked: back-pressure instead of loss.
- The broker going away ends the session; unacked input is redelivered to the next one.
  `serve` reconnects with capped exponential backoff, for ever, until SIGTERM.
- SIGTERM: stop consuming, finish the batches in hand (DRAIN_S deadline), close channels then
  connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from pamqp.commands import Basic

from exchanges import topology as t
from exchanges.contract import InvalidMessage

log = logging.getLogger("geofence")

ENV_KEYS = t.SIDECAR_ENV_KEYS
PERSISTENT = aio_pika.DeliveryMode.PERSISTENT
BROKER_GONE = (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError,
               ConnectionError, OSError)


class ConfigError(ValueError):
    pass


class PublishRefused(RuntimeError):
    """The broker nacked or returned a publish (full queue, no route)."""


# --------------------------------------------------------------------------- configuration


def mask_url(url: str) -> str:
    """The URL with its password hidden, in the userinfo and in a ?password= parameter."""
    parts = urlsplit(url)
    if parts.password is not None:
        url = url.replace(f":{parts.password}@", ":****@", 1)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1****", url)


def _positive(key: str, raw: str, kind: type[int] | type[float]) -> Any:
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: not a number") from None
    if not value > 0:
        raise ConfigError(f"{key}={raw!r}: must be positive")
    return value


@dataclass(frozen=True)
class SidecarConfig:
    """One sidecar's settings, built once in main from GEOFENCE_* variables.

    GEOFENCE_AMQP_URL is `amqp://user:password@host:port/?name=<connection name>`: the
    sidecar opens one connection per vhost it uses (the URL's path is ignored; the vhosts
    come from the topology). GEOFENCE_POSTGRES_URL is the store of fences and the worldmap.
    """

    role: str
    instance: str
    amqp_url: str
    postgres_url: str
    regions: tuple[str, ...] = t.Topology.regions
    workers: tuple[str, ...] = t.Topology.workers
    drain_s: float = 10.0
    batch_max: int = 5000
    prefetch: int = 10_000
    log_level: str = "INFO"
    # Where a stateful sidecar (x-fence) keeps its snapshot and journal; required there.
    journal_dir: str = ""
    # "on" (production): persistent messages, publisher confirms, x-fence journal. "off":
    # transient messages, no confirms, no journal: a crash loses in-flight work. For
    # benchmarks (bench/e2e.py measures what durability costs); never in production.
    persistence: bool = True

    @classmethod
    def from_env(cls, role: str, instance: str, environ: Mapping[str, str] | None = None,
                 also_known: Iterable[str] = ()) -> SidecarConfig:
        env = os.environ if environ is None else environ
        given = {k: v for k, v in env.items() if k.startswith("GEOFENCE_")}
        unknown = sorted(set(given) - set(ENV_KEYS) - set(also_known))
        if unknown:
            raise ConfigError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)}; known: {', '.join(ENV_KEYS)}")
        missing = [k for k in ("GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL") if not given.get(k)]
        if missing:
            raise ConfigError(f"{' and '.join(missing)} must be set "
                              "(`geofence status --json` shows the local stack's URLs)")
        amqp = given["GEOFENCE_AMQP_URL"]
        if urlsplit(amqp).scheme not in ("amqp", "amqps"):
            raise ConfigError(f"GEOFENCE_AMQP_URL={mask_url(amqp)!r}: not an amqp:// URL")
        pg = given["GEOFENCE_POSTGRES_URL"]
        if urlsplit(pg).scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"GEOFENCE_POSTGRES_URL={mask_url(pg)!r}: not a postgresql:// URL")
        kw: dict[str, Any] = {}
        for key, name in (("GEOFENCE_REGIONS", "regions"), ("GEOFENCE_WORKERS", "workers")):
            if key in given:
                kw[name] = tuple(n.strip() for n in given[key].split(","))
        if "GEOFENCE_DRAIN_S" in given:
            kw["drain_s"] = _positive("GEOFENCE_DRAIN_S", given["GEOFENCE_DRAIN_S"], float)
        if "GEOFENCE_BATCH_MAX" in given:
            kw["batch_max"] = _positive("GEOFENCE_BATCH_MAX", given["GEOFENCE_BATCH_MAX"], int)
        if "GEOFENCE_PREFETCH" in given:
            kw["prefetch"] = _positive("GEOFENCE_PREFETCH", given["GEOFENCE_PREFETCH"], int)
        if "GEOFENCE_LOG_LEVEL" in given:
            kw["log_level"] = given["GEOFENCE_LOG_LEVEL"].upper()
        if given.get("GEOFENCE_JOURNAL_DIR"):
            if not os.path.isabs(given["GEOFENCE_JOURNAL_DIR"]):
                raise ConfigError(f"GEOFENCE_JOURNAL_DIR={given['GEOFENCE_JOURNAL_DIR']!r}: not absolute")
            kw["journal_dir"] = given["GEOFENCE_JOURNAL_DIR"]
        if "GEOFENCE_PERSISTENCE" in given:
            value = given["GEOFENCE_PERSISTENCE"].strip().lower()
            if value not in ("on", "off"):
                raise ConfigError(f"GEOFENCE_PERSISTENCE={given['GEOFENCE_PERSISTENCE']!r}: on or off")
            kw["persistence"] = value == "on"
        config = cls(role, instance, amqp, pg, **kw)
        try:
            _ = config.topology
        except ValueError as exc:
            raise ConfigError(f"GEOFENCE_REGIONS / GEOFENCE_WORKERS: {exc}") from None
        return config

    @property
    def topology(self) -> t.Topology:
        return t.Topology(self.regions, self.workers)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}" if self.instance else self.role

    def amqp_for(self, vhost: str) -> str:
        """The AMQP URL for one vhost, with the connection named after this sidecar."""
        parts = urlsplit(self.amqp_url)
        query = parse_qs(parts.query)
        query.setdefault("name", [self.name])
        q = "&".join(f"{k}={quote(v[0], safe='')}" for k, v in sorted(query.items()))
        return urlunsplit(parts._replace(path="/" + quote(vhost, safe=""), query=q))

    def describe(self) -> str:
        return (f"{self.name}: amqp {mask_url(self.amqp_url)}, postgres {mask_url(self.postgres_url)}, "
                f"regions {','.join(self.regions)}, workers {','.join(self.workers)}, "
                f"batch <= {self.batch_max}, prefetch {self.prefetch}, drain {self.drain_s:g}s"
                + (f", journal {self.journal_dir}" if self.journal_dir else "")
                + ("" if self.persistence else ", PERSISTENCE OFF (benchmarks only)"))


def setup_logging(config: SidecarConfig) -> None:
    logging.basicConfig(level=config.log_level,
                        format=f"%(asctime)s {config.name} %(levelname)s %(message)s")


# --------------------------------------------------------------------------- counters


@dataclass
class Counters:
    """What a sidecar did, for its periodic log line and `geofence inspect`."""

    received: int = 0  # messages
    positions: int = 0
    published: int = 0
    events: int = 0
    batches: int = 0
    largest_batch: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # by reason (shortened)
    retries: int = 0
    other: Counter[str] = field(default_factory=Counter)  # a role's own counts (bump)

    def bump(self, name: str, n: int = 1) -> None:
        self.other[name] += n

    def batch(self, size: int) -> None:
        self.batches += 1
        self.received += size
        self.largest_batch = max(self.largest_batch, size)

    def to_json(self) -> dict[str, Any]:
        return {"received": self.received, "positions": self.positions, "published": self.published,
                "events": self.events, "batches": self.batches, "largest_batch": self.largest_batch,
                "dead_lettered": sum(self.dead_lettered.values()),
                "dead_letter_reasons": dict(self.dead_lettered.most_common(20)),
                "publish_retries": self.retries, **self.other}

    def line(self) -> str:
        mean = self.received / self.batches if self.batches else 0.0
        return (f"received {self.received} msgs in {self.batches} batches (mean {mean:.1f}, max "
                f"{self.largest_batch}), positions {self.positions}, published {self.published}, "
                f"events {self.events}, dead-lettered {sum(self.dead_lettered.values())}, "
                f"publish retries {self.retries}")


def reason_key(reason: str) -> str:
    """A reason without its variable parts, to count by: the text before a ':' if any, with
    numbers and quoted values blanked ("lat 91 is outside [-90, 90]" -> "lat N is outside
    [N, N]"), so the counters stay small whatever the input."""
    head = reason.split(":")[0] if ":" in reason else reason
    head = _QUOTED.sub("'…'", head)
    return _NUMBER.sub("N", head)[:60]


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")


# --------------------------------------------------------------------------- connections


class Backoff:
    def __init__(self, first: float = 0.2, cap: float = 10.0) -> None:
        self.first, self.cap, self._next = first, cap, first

    def reset(self) -> None:
        self._next = self.first

    def next(self) -> float:
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self.cap, self._next * 2)
        return delay


async def open_connection(config: SidecarConfig, vhost: str, stack: contextlib.AsyncExitStack
                          ) -> AbstractConnection:
    conn = await aio_pika.connect(config.amqp_for(vhost), timeout=10)
    stack.push_async_callback(_close_quietly, conn)
    return conn


async def _close_quietly(closable: AbstractConnection | AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closable.close(), 5)


async def open_channel(conn: AbstractConnection, stack: contextlib.AsyncExitStack,
                       prefetch: int = 0, confirms: bool = True) -> AbstractChannel:
    """A channel with publisher confirms (returned mandatory messages raise). Without
    confirms (GEOFENCE_PERSISTENCE=off, benchmarks only) what it publishes is transient."""
    ch = await conn.channel(publisher_confirms=confirms, on_return_raises=confirms)
    stack.push_async_callback(_close_quietly, ch)
    if prefetch:
        await ch.set_qos(prefetch_count=prefetch)
    return ch


class InstanceLocked(ConnectionError):
    """Another instance of this role holds its lock: this one stands by (retries)."""


class TookOver(Exception):
    """This process was locked out, then got the lock: another instance ran meanwhile, so
    what it holds in memory is stale. It ends, to be restarted and recover (crash-only)."""


class InstanceLock:
    """The single-instance guard of a routing role (two x-ingress, or two x-geo of a region,
    or two x-fence of a worker, would each see part of an object's positions). An exclusive
    queue is the lock: owned by the session's connection, deleted by the broker with it.
    Exclusive consumers alone are no guard: a role consumes several queues, and a prefetch
    change consumes again (a gap another instance can take)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.locked_out = False

    async def acquire(self, conn: AbstractConnection, stack: contextlib.AsyncExitStack) -> None:
        ch = await open_channel(conn, stack)  # its own: a refused declare closes the channel
        try:
            await ch.declare_queue(self.name, exclusive=True, auto_delete=True, durable=False)
        except aiormq.exceptions.ChannelLockedResource as exc:
            if not self.locked_out:
                log.error("another instance holds %s: standing by until it goes", self.name)
            self.locked_out = True
            raise InstanceLocked(f"{self.name} is held by another instance") from exc
        if self.locked_out:
            raise TookOver(f"got {self.name} after another instance held it: restarting to recover")


async def connection_lost(conns: Sequence[AbstractConnection]) -> None:
    """Returns (raising) when any of the connections closes. Through the close callbacks:
    aio-pika's `closed()` does not resolve when the broker closes the connection."""
    lost = asyncio.Event()
    for c in conns:
        c.close_callbacks.add(lambda *_: lost.set())
        if c.is_closed:
            lost.set()
    await lost.wait()
    raise ConnectionError("broker connection closed")


# --------------------------------------------------------------------------- intake


SUSPECT_DELIVERIES = 2  # x-delivery-count: unsettled this many times before (crashes, cuts)


def delivery_count(message: AbstractIncomingMessage) -> int:
    """How many times the broker handed this message out before without a settlement
    (a quorum queue's x-delivery-count; 0 for a first delivery)."""
    raw = (message.headers or {}).get("x-delivery-count", 0)
    return raw if isinstance(raw, int) else 0


class Intake:
    """Consumes one queue and hands out batches: everything that has arrived, up to
    `max_batch`. Under low load that is one message (no added latency); under load the
    messages that arrived while the previous batch was processed (throughput).

    Suspects: a message delivered SUSPECT_DELIVERIES times or more without a settlement
    was in flight during two crashes (or cuts); it may be what crashed the sidecar. Suspects
    are handed out one at a time, and while they come the channel's prefetch is 1, so a
    suspect that kills the process again spends only its own deliveries: the broker
    dead-letters it at the delivery limit (policy), and the messages behind it keep theirs.
    With `set_prefetch`, a session starts at prefetch 1 and opens to `prefetch` at the first
    message that is not a suspect (suspects, being returned messages, come first).

    Order across a crash (the routing roles need their queue's order: an object's positions,
    a region's handover notices). A quorum queue gives back a dead consumer's unacked
    messages in order, ahead of the rest, when it drops that consumer; two things break it:
    - a new consumer taking messages before the broker dropped the dead one (it takes newer
      messages first): `start` waits until the queue has no consumer (the instance lock
      already says no live one holds it);
    - several consumers of one process holding messages when it dies: the queue gives each
      consumer's back in turn, in the order of their tags, not of delivery. A prefetch
      change needs a new consumer (RabbitMQ applies basic.qos to consumers created after
      it), so the old one is cancelled and the new one created only once everything the old
      one delivered was handed out and settled: one consumer holds messages at any time."""

    def __init__(self, queue: AbstractQueue, max_batch: int, exclusive: bool = True, prefetch: int = 0,
                 set_prefetch: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.queue = queue
        self.max_batch = max_batch
        self.exclusive = exclusive
        self.prefetch = prefetch
        self._set_prefetch = set_prefetch
        self._opened = set_prefetch is None
        self._buf: deque[AbstractIncomingMessage] = deque()
        self._ready = asyncio.Event()
        self._tag: str | None = None
        self._stopping = False
        self.suspects = 0
        self.backlog = 0  # messages ready in the queue when the session started
        self.received = 0
        self.cancelled = asyncio.Event()  # the broker cancelled the consumer (queue deleted)
        self.current_prefetch = prefetch if set_prefetch is None else 1
        self._want: int | None = None  # a prefetch for the next consumer (see the class)
        self._fresh_seen = False  # a first delivery came in this session
        self.late_returns = 0  # returned messages that came behind a first delivery

    @classmethod
    def on(cls, queue: AbstractQueue, max_batch: int, prefetch: int, exclusive: bool = True) -> Intake:
        """An intake that manages its channel's prefetch (see the class)."""
        async def set_prefetch(n: int) -> None:
            await queue.channel.set_qos(prefetch_count=n)
        return cls(queue, max_batch, exclusive, prefetch, set_prefetch)

    # Back-pressure: when what a batch publishes takes long to be confirmed downstream (a
    # full queue refusing, a slow consumer, a broker paging), taking more in only grows the
    # messages held here; the prefetch is halved (not below PREFETCH_FLOOR) while confirms
    # take over LAG_HIGH_S, and doubled back while they come within LAG_LOW_S. The backlog
    # stays in the broker's queue, whose length limit pushes back on the publishers.
    LAG_HIGH_S = 1.0
    LAG_LOW_S = 0.2
    PREFETCH_FLOOR = 64

    async def confirm_lag(self, seconds: float) -> None:
        if self._set_prefetch is None or not self._opened:
            return
        now = self.current_prefetch
        if seconds > self.LAG_HIGH_S and now > self.PREFETCH_FLOOR:
            new = max(self.PREFETCH_FLOOR, now // 2)
        elif seconds < self.LAG_LOW_S and now < self.prefetch:
            new = min(self.prefetch, now * 2)
        else:
            return
        log.log(logging.WARNING if new < now else logging.INFO,
                "%s: confirms took %.2fs: prefetch %d -> %d", self.queue.name, seconds, now, new)
        self.current_prefetch = new
        self._want = new  # applied between batches (see _switch_consumer)

    async def _switch_consumer(self) -> None:
        """Between batches: a wanted prefetch change. The consumer is cancelled first, then
        created again with the new prefetch once what it delivered was handed out (and, the
        caller settling each batch before asking for the next, settled)."""
        if self._want is None or self._stopping or self._set_prefetch is None:
            return
        if self._tag is not None:
            await self.queue.cancel(self._tag)
            self._tag = None
            await asyncio.sleep(0)  # deliveries read before the cancel-ok land in the buffer
        if not self._buf:
            want, self._want = self._want, None
            await self._set_prefetch(want)
            self._tag = await self.queue.consume(self._on_message, exclusive=self.exclusive)

    @property
    def caught_up(self) -> bool:
        """The backlog found at the start was received, and nothing waits in the buffer."""
        return self.received >= self.backlog and not self._buf

    # How long `start` waits for the broker to drop a dead predecessor's consumer. It drops
    # it as soon as it sees the connection gone, which the instance lock already waited for.
    PREDECESSOR_WAIT_S = 30.0

    async def start(self) -> None:
        declared = getattr(self.queue, "declaration_result", None)
        if self.exclusive:
            declared = await self._without_predecessor() or declared
        self.backlog = int(getattr(declared, "message_count", 0) or 0)
        if self._set_prefetch is not None:
            await self._set_prefetch(1)
        # exclusive (the default): a second instance of a routing role would break per-object
        # ordering; services whose requests are independent (the fence API) share their queue
        self._tag = await self.queue.consume(self._on_message, exclusive=self.exclusive)
        channel = getattr(self.queue, "channel", None)
        if channel is not None:  # a real queue (the unit tests' fake has none)
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(self._on_cancel)

    async def _without_predecessor(self) -> Any:
        """Polls the queue (passive declares) until it has no consumer, or PREDECESSOR_WAIT_S
        passed (then it says so and goes on); the last declare-ok (None without a channel)."""
        channel = getattr(self.queue, "channel", None)
        if channel is None:  # the unit tests' fake queue
            return None
        started = time.monotonic()
        while True:
            declared = (await channel.declare_queue(self.queue.name, passive=True)).declaration_result
            consumers = int(getattr(declared, "consumer_count", 0) or 0)
            waited = time.monotonic() - started
            if not consumers:
                if waited > 0.05:
                    log.info("%s: the previous consumer was dropped after %.2fs; consuming", self.queue.name,
                             waited)
                return declared
            if waited > self.PREDECESSOR_WAIT_S:
                log.warning("%s still has %d consumer(s) after %.0fs: consuming anyway (the order of its "
                            "returned messages is not guaranteed)", self.queue.name, consumers, waited)
                return declared
            await asyncio.sleep(0.05)

    async def _on_cancel(self, frame: Basic.Cancel) -> None:
        if frame.consumer_tag == self._tag:
            log.warning("the broker cancelled the consumer of %s", self.queue.name)
            self.cancelled.set()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.received += 1
        self._buf.append(message)
        self._ready.set()
        if getattr(message, "redelivered", False):
            if self._fresh_seen:
                self.late_returns += 1
                if self.late_returns == 1:
                    log.warning("%s: a returned message came behind a first delivery (the broker gave "
                                "back a dead consumer's messages late): order is not guaranteed here",
                                self.queue.name)
        else:
            self._fresh_seen = True
        if not self._opened and delivery_count(message) < SUSPECT_DELIVERIES:
            self._opened = True
            self.current_prefetch = self.prefetch
            self._want = self.prefetch  # applied between batches (see _switch_consumer)

    async def stop(self) -> None:
        self._stopping = True
        self._ready.set()
        if self._tag is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.queue.cancel(self._tag), 5)

    async def batches(self) -> AsyncIterator[list[AbstractIncomingMessage]]:
        while True:
            await self._switch_consumer()
            if not self._buf:
                if self._stopping:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            await asyncio.sleep(0)  # let deliveries already read from the socket land
            if delivery_count(self._buf[0]) >= SUSPECT_DELIVERIES:
                self.suspects += 1
                yield [self._buf.popleft()]
                continue
            n = 1
            limit = min(len(self._buf), self.max_batch)
            while n < limit and delivery_count(self._buf[n]) < SUSPECT_DELIVERIES:
                n += 1
            yield [self._buf.popleft() for _ in range(n)]


def reason_of(exc: Exception, what: str) -> str:
    """The dead-letter reason for an input a role could not decode."""
    return exc.reason if isinstance(exc, InvalidMessage) else f"malformed {what}: {exc}"


class SidecarFault(RuntimeError):
    """A batch failed for a reason that is not the broker's: the process ends (crash-only:
    its state is rebuilt from durable sources at the restart) and the input comes back."""


async def run_batches(intake: Intake, handle: Callable[[list[AbstractIncomingMessage]], Awaitable[None]],
                      counters: Counters, dead_letters: AbstractExchange | None = None) -> None:
    """The loop of one input queue: each batch handled, then settled.

    A handler that raises (a bug, not bad input: bad input is dead-lettered by the handler)
    ends the process unsettled. Its messages come back, and once they are suspects (see
    Intake) one at a time: a suspect the handler fails on alone is the culprit, and goes to
    `dead_letters` with the error as its reason before the process ends."""
    async for messages in intake.batches():
        counters.batch(len(messages))
        try:
            async with settle(messages):
                await handle(messages)
        except BROKER_GONE:
            raise
        except Exception as exc:
            if isinstance(exc, ExceptionGroup) and exc.subgroup(BROKER_GONE) is not None:
                raise
            log.error("a batch of %d from %s failed: %r", len(messages), intake.queue.name, exc,
                      exc_info=exc)
            m = messages[0]
            if len(messages) == 1 and delivery_count(m) >= SUSPECT_DELIVERIES and dead_letters is not None:
                reason = (f"internal error on delivery {delivery_count(m) + 1}: {exc!r} "
                          "(the sidecar failed on this message alone)")
                await publish_all([dead_letter(dead_letters, m, reason, intake.queue.name, counters)],
                                  counters)
                await m.ack()
            raise SidecarFault(f"{intake.queue.name}: {exc!r}") from exc


@contextlib.asynccontextmanager
async def settle(messages: Sequence[AbstractIncomingMessage]) -> AsyncIterator[None]:
    """Ack in one place: after the block (and everything it published) succeeded. If the
    broker went away nothing is acked: the messages come back to the next session."""
    yield
    if messages:
        try:
            await messages[-1].ack(multiple=True)
        except Exception as exc:  # the channel or connection went away under the ack
            raise ConnectionError(f"ack failed: {exc!r}") from exc


# --------------------------------------------------------------------------- publishing


@dataclass(frozen=True)
class Out:
    """One message to publish."""

    exchange: AbstractExchange
    routing_key: str
    body: bytes
    content_type: str = "application/msgpack"
    headers: Mapping[str, Any] | None = None
    mandatory: bool = True
    correlation_id: str | None = None
    message_id: str | None = None


async def publish_all(outs: Sequence[Out], counters: Counters, deadline: float | None = None) -> None:
    """Publish concurrently and wait for every confirm; nacked or returned ones are retried
    with backoff (the caller holds its input unacked meanwhile)."""
    pending = list(outs)
    backoff = Backoff(0.05, 2.0)
    while pending:
        results = await asyncio.gather(*(_publish(o) for o in pending), return_exceptions=True)
        failed = []
        for o, r in zip(pending, results, strict=True):
            if isinstance(r, BaseException):
                if isinstance(r, PublishRefused):
                    failed.append(o)
                else:
                    raise r
        counters.published += len(pending) - len(failed)
        if failed:
            counters.retries += len(failed)
            if deadline is not None and time.monotonic() > deadline:
                raise PublishRefused(f"{len(failed)} publishes still refused at the deadline")
            delay = backoff.next()
            log.warning("%d publishes refused by the broker (full queue or no route); retrying in "
                        "%.2fs", len(failed), delay)
            await asyncio.sleep(delay)  # back-pressure: the input stays unacked meanwhile
        pending = failed


async def _publish(o: Out) -> None:
    # Straight to the aiormq channel under aio-pika's exchange, with the message properties
    # built once per content type: aio_pika.Message (and its properties) per message was
    # half of a sidecar's publishing cost (bench: 1.9k -> 4.6k confirmed msgs/s).
    channel = await o.exchange.channel.get_underlay_channel()  # type: ignore[attr-defined]
    try:
        confirm = await channel.basic_publish(o.body, exchange=o.exchange.name, routing_key=o.routing_key,
                                              properties=_properties(o, channel.publisher_confirms),
                                              mandatory=o.mandatory and channel.publisher_confirms)
    except aiormq.exceptions.DeliveryError as exc:  # returned (no route) or nacked
        raise PublishRefused(str(exc)) from None
    except Exception as exc:
        # aiormq fails the confirms a closing channel still awaits with a bare Exception:
        # the broker (or the link to it) went away, not a bug (the input stays unacked)
        if channel.is_closed or type(exc) is Exception:
            raise ConnectionError(f"publish lost with its channel: {exc!r}") from exc
        raise
    if confirm is not None and not isinstance(confirm, Basic.Ack):
        raise PublishRefused(f"broker answered {type(confirm).__name__}")


_PLAIN_PROPERTIES: dict[tuple[str, int], Basic.Properties] = {}  # (content type, mode) -> properties


def _properties(o: Out, persistent: bool = True) -> Basic.Properties:
    mode = int(PERSISTENT) if persistent else int(aio_pika.DeliveryMode.NOT_PERSISTENT)
    if o.headers is None and o.correlation_id is None and o.message_id is None:
        p = _PLAIN_PROPERTIES.get((o.content_type, mode))
        if p is None:
            p = _PLAIN_PROPERTIES[(o.content_type, mode)] = Basic.Properties(delivery_mode=mode,
                                                                             content_type=o.content_type)
        return p
    return Basic.Properties(delivery_mode=mode, content_type=o.content_type,
                            headers=dict(o.headers) if o.headers else None,
                            correlation_id=o.correlation_id, message_id=o.message_id)


def dead_letter(exchange: AbstractExchange, message: AbstractIncomingMessage, reason: str,
                source: str, counters: Counters) -> Out:
    """The message as it came, to the vhost's dead-letters exchange, with the reason."""
    counters.dead_lettered[reason_key(reason)] += 1
    headers = {**(message.headers or {}), t.REASON_HEADER: reason[:1000],
               "x-geofence-source": source, "x-geofence-routing-key": message.routing_key or "",
               "x-geofence-dead-lettered-at-ms": int(time.time() * 1000)}
    headers.pop("x-delivery-count", None)  # the broker's, about the queue it came from
    return Out(exchange, source, message.body, message.content_type or "application/octet-stream",
               headers, mandatory=False, message_id=message.message_id)


# --------------------------------------------------------------------------- lifecycle

Session = Callable[[asyncio.Event], Awaitable[None]]
EXIT_TOOK_OVER = 75  # EX_TEMPFAIL: restart me (systemd's Restart=on-failure does)


async def run_sidecar(config: SidecarConfig, instances: Sequence[str], role: str,
                      make: Callable[[SidecarConfig], Any]) -> int:
    """`main` of a sidecar that recovers its state, then serves: `make(config)` gives an
    object with `recover(stop) -> bool`, `session(stop)` and `counters`."""
    if config.instance not in instances:
        log.error("%s %r is not one of %s", role, config.instance, list(instances))
        return 2
    stop = asyncio.Event()
    install_signal_handlers(stop)
    log.info("%s", config.describe())
    sidecar = make(config)
    if not await sidecar.recover(stop):
        return 0
    try:
        await serve(config, sidecar.session, stop)
    except TookOver as exc:  # its state is stale: no close (an x-fence would snapshot it)
        log.error("%s", exc)
        return EXIT_TOOK_OVER
    close = getattr(sidecar, "close", None)
    if close is not None:
        await close()
    log.info("stopped: %s", sidecar.counters.line())
    return 0


async def serve(config: SidecarConfig, session: Session, stop: asyncio.Event) -> None:
    """Run sessions until `stop`; a session ends by raising when the broker goes away."""
    backoff = Backoff()
    while not stop.is_set():
        started = time.monotonic()
        lost: BaseException | None = None
        try:
            await session(stop)
        except* BROKER_GONE as group:
            lost = group.exceptions[0]
        if lost is None or stop.is_set():
            continue
        if time.monotonic() - started > 30:
            backoff.reset()
        delay = backoff.next()
        log.warning("broker unavailable (%s: %s); reconnecting in %.1fs", type(lost).__name__, lost, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def run_session(stop: asyncio.Event, conns: Sequence[AbstractConnection],
                      intakes: Sequence[Intake], loops: Sequence[Coroutine[Any, Any, None]],
                      background: Sequence[Coroutine[Any, Any, None]], drain_s: float) -> None:
    """Own every task of a session (TaskGroup). Ends when `stop` is set (consumers
    cancelled, loops drained within `drain_s`) or raises when a connection closes."""
    async with asyncio.TaskGroup() as tg:
        loop_tasks = [tg.create_task(c) for c in loops]
        others: list[asyncio.Task[Any]] = [tg.create_task(c) for c in background]
        watcher = tg.create_task(connection_lost(conns))
        stopper = tg.create_task(stop.wait())
        others += [watcher, stopper]
        for intake in intakes:
            await intake.start()
        others.append(tg.create_task(_cancelled(intakes)))
        await asyncio.wait([watcher, stopper, *loop_tasks, others[-1]], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            for intake in intakes:
                await intake.stop()
            _, pending = await asyncio.wait(loop_tasks, timeout=drain_s) if loop_tasks else ((), ())
            if pending:
                log.warning("drain deadline (%gs) passed with %d loops busy; their unacked "
                            "messages will be redelivered", drain_s, len(pending))
            for task in (*pending, *others):
                task.cancel()


async def _cancelled(intakes: Sequence[Intake]) -> None:
    """Raises when the broker cancels one of the consumers: the session starts again."""
    waits = [asyncio.ensure_future(i.cancelled.wait()) for i in intakes]
    if not waits:
        await asyncio.Event().wait()  # nothing to watch: wait to be cancelled with the session
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    raise ConnectionError("the broker cancelled a consumer (its queue was deleted or moved)")


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def periodic(stop: asyncio.Event, every: float, action: Callable[[], Awaitable[None] | None]
                   ) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            return
        result = action()
        if result is not None:
            await result


def reply(channel: AbstractChannel, request: AbstractIncomingMessage, payload: Any) -> Out | None:
    """The answer to a request carrying reply_to (e.g. `geofence inspect`), as JSON."""
    if not request.reply_to:
        return None
    import orjson

    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    return Out(channel.default_exchange, request.reply_to, body, "application/json", None,
               mandatory=False, correlation_id=request.correlation_id)
