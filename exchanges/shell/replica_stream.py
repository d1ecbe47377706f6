"""A role's journal shipped over a RabbitMQ stream queue (issue 38: a worker's backups): the
reader that follows a stream into a `ReplicaLog` (exchanges/replica_log.py), the probe of
another instance's lock, the standby that follows while the lock is held, and the shipping
of frames.

Invariants:
- A stream is read from where the reader stopped (`ReplicaLog.last_offset` + 1), or from its
  first offset: a redelivered offset is read once.
- A master writes a marker (a token of its own) when its session begins, its instance lock
  held; reading up to that marker is reading everything any earlier master wrote, since no
  other instance can write once the lock is ours (its connection is gone with its lock).
- A standby never takes the lock: it says when the lock has been free for `grace_s`; the
  caller then takes it in its session (where a race lost is TookOver, back to standby).

Trade-off: the lock is probed by a passive declare every POLL_S (a refused declare closes its
channel: a channel per probe) rather than told by the broker (single-active-consumer would
tell at once but is a consumer of a queue the lock's owner may leave idle): a takeover waits
up to POLL_S more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar

import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from exchanges.backoff import Backoff
from exchanges.replica_log import MASTER, SINCE, Frame, ReplicaLog, marker_frame
from exchanges.shell import publish
from exchanges.shell.config import SidecarConfig
from exchanges.shell.connections import BROKER_GONE, open_channel, open_connection
from exchanges.shell.counters import Counters

log = logging.getLogger("geofence")

POLL_S = 0.25
MARKER_TIMEOUT_S = 30.0
PROBE_S = 2.0  # how long a new reader waits for the stream's last frame (none: an empty stream)
# A new reader starts this long before the snapshot the last frame names: the writer's clock
# against the broker's chunk times (further off: the whole stream is read, replica.check_in)
SINCE_MARGIN_S = 30.0
Start = str | int | datetime  # x-stream-offset: "first", "last", an offset, a time
STREAM_PREFETCH = 16  # deliveries in flight to a reader: a snapshot part is up to 8 MiB
OFFSET_HEADER = "x-stream-offset"
# How long a frame's confirm may take (plus SHIP_BYTES_PER_S for its bytes) before the stream is
# taken for lost: 3 s ended sessions again and again at F=10,000 on two loaded cores (a stream's
# confirms there take seconds). A lost confirm is told sooner by a probe (`ship`): sent after
# PROBE_AFTER_S, it costs a small frame when the stream is only slow.
SHIP_CONFIRM_S = 30.0
SHIP_BYTES_PER_S = 10e6
PROBE_AFTER_S = 1.0
PROBE_GRACE_S = 0.5


P = ParamSpec("P")
R = TypeVar("R")


def _gone_on_bare(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The broker going away, as ConnectionError is everywhere else, so that a standby or a
    session reconnects instead of the process ending as on a bug: aiormq's bare `Exception`
    for an operation on a connection or channel that is closing, and a stream whose node has
    not started it yet (a restarting broker, a cluster node still joining: 404 "home node ...
    is down or inaccessible")."""
    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            if "down or inaccessible" in str(exc):
                raise ConnectionError(f"the stream is not available yet: {exc}") from exc
            raise
        except Exception as exc:
            if type(exc) is Exception:
                raise ConnectionError(f"the broker connection went away: {exc!r}") from exc
            raise
    return run


@_gone_on_bare
async def _channel(conn: AbstractConnection) -> AbstractChannel:
    """A plain channel (no confirms), not on a stack: a probe's, closed by its caller or by the
    broker's refusal. A connection closed meanwhile is a ConnectionError (aiormq: RuntimeError)."""
    try:
        return await conn.channel(publisher_confirms=False)
    except RuntimeError as exc:
        raise ConnectionError(f"the connection closed while a channel was opened: {exc}") from exc


class StreamFollower:
    """Reads one stream queue into a ReplicaLog, across connections."""

    def __init__(self, queue: str, replica: ReplicaLog | None = None) -> None:
        self.queue = queue
        self.log = replica if replica is not None else ReplicaLog()
        self.read = 0  # deliveries read
        self.refused = 0  # frames that were no frames of ours (counted, skipped)
        self._changed = asyncio.Event()
        self._channel: AbstractChannel | None = None
        self._consumer: tuple[AbstractQueue, str] | None = None
        self._closing = False  # no ack once set: an ack behind the channel's close is a connection error

    @_gone_on_bare
    async def attach(self, conn: AbstractConnection, stack: contextlib.AsyncExitStack,
                     start: Start | None = None) -> Start:
        """Consume from `start` ("first", "last", an offset, a time), by default from where
        this reader stopped (or, new to the stream, `fresh_start`); returns where it began."""
        if start is None:
            start = self.log.last_offset + 1 if self.log.last_offset >= 0 else await self.fresh_start(conn)
        self._closing = False
        ch = await open_channel(conn, stack, prefetch=STREAM_PREFETCH)
        queue = await ch.get_queue(self.queue, ensure=False)
        self._consumer = (queue, await queue.consume(self._on, arguments={OFFSET_HEADER: start}))
        self._channel = ch
        return start

    @_gone_on_bare
    async def fresh_start(self, conn: AbstractConnection) -> Start:
        """Where a reader new to the stream begins: SINCE_MARGIN_S before the newest snapshot
        the stream's last frame names (its SINCE), else at the first offset."""
        ch = await _channel(conn)
        try:
            await ch.set_qos(prefetch_count=1)
            queue = await ch.get_queue(self.queue, ensure=False)
            seen: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

            async def first(message: AbstractIncomingMessage) -> None:  # never acked: the channel goes
                if not seen.done():
                    seen.set_result(dict(message.headers or {}))

            await queue.consume(first, arguments={OFFSET_HEADER: "last"})
            try:
                headers = await asyncio.wait_for(seen, PROBE_S)
            except TimeoutError:
                return "first"  # an empty stream
        finally:
            if not ch.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(ch.close(), 5)
        since = headers.get(SINCE)
        if not isinstance(since, int) or since <= 0:
            return "first"
        return datetime.fromtimestamp(since / 1000 - SINCE_MARGIN_S, tz=UTC)

    async def detach(self) -> None:
        """Stop reading: the consumer cancelled (nothing more is delivered), then its channel
        closed; what was delivered and not read yet is read again at the next attach."""
        self._closing = True
        ch, self._channel = self._channel, None
        consumer, self._consumer = self._consumer, None
        if ch is None or ch.is_closed:
            return
        with contextlib.suppress(Exception):
            if consumer is not None:
                await asyncio.wait_for(consumer[0].cancel(consumer[1]), 5)
            await asyncio.wait_for(ch.close(), 5)

    async def _on(self, message: AbstractIncomingMessage) -> None:
        # the channel closed under the ack (a session's end): read again from last_offset
        with contextlib.suppress(aiormq.exceptions.ChannelInvalidStateError):
            await self._read(message)

    async def _read(self, message: AbstractIncomingMessage) -> None:
        if self._closing:
            return  # not read, not acked: read again from last_offset at the next attach
        async with message.process(requeue=False):  # on a stream, an ack is credit: nothing goes
            headers = dict(message.headers or {})
            offset = headers.get(OFFSET_HEADER)
            try:
                if not isinstance(offset, int):
                    raise ValueError(f"a delivery without its {OFFSET_HEADER}")
                self.log.feed(offset, headers, message.body)
            except ValueError as exc:
                self.refused += 1
                log.error("%s: a frame refused: %s", self.queue, exc)
            self.read += 1
            self._changed.set()

    async def until_marker(self, token: str, stop: asyncio.Event | None = None,
                           timeout: float = MARKER_TIMEOUT_S) -> tuple[bool, str | None]:
        """Reads until the marker `token`: (read, the master of the frame before it). A stream
        that delivers nothing new for `timeout` (its consumer cancelled by a restarting broker)
        is a ConnectionError: the session starts again."""
        quiet_since, last = time.monotonic(), self.read
        while True:
            if self.read != last:
                quiet_since, last = time.monotonic(), self.read
            elif time.monotonic() - quiet_since > timeout:
                raise ConnectionError(f"{self.queue}: nothing delivered for {timeout:g}s before the marker")
            seen, before = self.log.writer_before(token)
            if seen or (stop is not None and stop.is_set()):
                return seen, before
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)
            if self._channel is not None and self._channel.is_closed:
                raise ConnectionError(f"{self.queue}: the stream's channel closed while reading")


def _published(exchange: AbstractExchange, queue: str, frames: Sequence[Frame],
               counters: Counters) -> asyncio.Future[None]:
    """The frames published, persistent, in order; done when all are confirmed. Through the
    module: a test's patch of publish.publish_all reaches it."""
    return asyncio.ensure_future(publish.publish_all(
        [publish.Out(exchange, queue, f.body, "application/msgpack", headers=f.headers) for f in frames],
        counters))


async def ship(exchange: AbstractExchange, queue: str, frames: Sequence[Frame], counters: Counters) -> None:
    """Frames published to the stream `queue` (through the default exchange `exchange`),
    persistent and confirmed, in order. RabbitMQ 3.10 never confirms a frame whose stream
    changed leader while it was in flight (its resend after the change uses the channel's
    sequence numbers for the stream's: found by the fault suite, a cluster node killed). So a
    frame not confirmed within PROBE_AFTER_S (and the time its bytes take) is followed by a
    probe, a marker frame of its own: a stream confirms its writes in order, so the probe
    confirmed before the frames means theirs are lost (a stream only slow confirms the
    frames first). Lost, or nothing confirmed within SHIP_CONFIRM_S: a ConnectionError, the
    session ends and its next one ships again."""
    if not frames:
        return
    size = sum(len(f.body) for f in frames)
    transfer = size / SHIP_BYTES_PER_S
    shipping = _published(exchange, queue, frames, counters)
    probing: asyncio.Future[None] | None = None
    started = time.monotonic()
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(shipping), PROBE_AFTER_S + transfer)
        if not shipping.done():
            head = frames[0].headers
            probe = marker_frame(str(head.get(MASTER, "")), f"probe:{uuid.uuid4().hex}",
                                 int(head.get(SINCE, 0) or 0))
            probing = _published(exchange, queue, [probe], counters)
            left = SHIP_CONFIRM_S + transfer - (time.monotonic() - started)
            finished, _ = await asyncio.wait({shipping, probing}, timeout=max(left, 0.0),
                                             return_when=asyncio.FIRST_COMPLETED)
            if shipping not in finished and probing in finished:
                probing.result()
                with contextlib.suppress(TimeoutError):  # both acks may be in one read
                    await asyncio.wait_for(asyncio.shield(shipping), PROBE_GRACE_S)
            if not shipping.done():
                counters.bump("replica_confirms_lost")
                why = (f"nothing confirmed within {SHIP_CONFIRM_S + transfer:.1f}s" if probing not in finished
                       else "a probe sent after them was confirmed first: the stream changed leader")
                raise ConnectionError(f"{queue}: {len(frames)} frames ({size:,} bytes) not confirmed ({why})")
        shipping.result()
        took = time.monotonic() - started
        if took > PROBE_AFTER_S:  # a stream electing a leader, or a slow one: said, for the operator
            log.info("%s: %d frames confirmed after %.1fs", queue, len(frames), took)
    finally:
        for task in (shipping, probing):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    counters.bump("replica_frames", len(frames))
    counters.bump("replica_bytes", size)


@_gone_on_bare
async def hold(conn: AbstractConnection, stack: contextlib.AsyncExitStack, name: str) -> None:
    """The exclusive queue `name`, owned by `conn` (gone with it)."""
    ch = await open_channel(conn, stack)  # its own: a refused declare closes the channel
    try:
        await ch.declare_queue(name, exclusive=True, auto_delete=True, durable=False)
    except aiormq.exceptions.ChannelLockedResource:  # an older instance still going away
        log.info("%s is held by another connection: not holding it", name)


@_gone_on_bare
async def lock_held(conn: AbstractConnection, name: str) -> bool:
    """Whether another connection holds the exclusive queue `name` (an instance lock)."""
    ch = await _channel(conn)
    try:
        await ch.declare_queue(name, passive=True)
    except aiormq.exceptions.ChannelLockedResource:
        return True  # the broker closed the channel with its refusal: closing it again is an error
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    with contextlib.suppress(Exception):  # ours (a lock left by this connection): closed by us
        await asyncio.wait_for(ch.close(), 5)
    return True


async def stand_by(config: SidecarConfig, vhost: str, follower: StreamFollower, lock: str, grace_s: float,
                   stop: asyncio.Event, unseen_grace_s: float | None = None, home: str = "",
                   present: bool = False) -> bool:
    """Follows the stream while another instance holds `lock`; True once the lock has been
    free for `grace_s` (the caller takes it), False when `stop` is set first. A lock not
    seen held since the standby's last connect must be free for `unseen_grace_s` (default:
    `grace_s`): at a stack's start or after a broker restart, the instance whose lock it is
    gets there first. `home`: an exclusive queue
    this standby holds while it stands by (`present`: the lock's own instance, which takes the
    lock at once), or that blocks it while another holds it (a backup yields to the owner)."""
    backoff = Backoff(cap=2.0)
    said = False
    unseen_grace_s = grace_s if unseen_grace_s is None else unseen_grace_s
    while not stop.is_set():
        try:
            async with contextlib.AsyncExitStack() as stack:
                conn = await open_connection(config, vhost, stack)
                if home and present:
                    await hold(conn, stack, home)
                await follower.attach(conn, stack)
                # seen on this connection only: after the standby's own reconnect (a broker
                # restart) every master reconnects too, and their locks are free meanwhile
                free_since: float | None = None
                seen = False
                while not stop.is_set():
                    if conn.is_closed:
                        raise ConnectionError("broker connection closed")
                    held = await lock_held(conn, lock) or bool(home and not present
                                                               and await lock_held(conn, home))
                    now = time.monotonic()
                    if held:
                        free_since, seen = None, True
                        if not said:
                            log.info("%s is held by another instance: standing by, following %s", lock,
                                     follower.queue)
                            said = True
                    else:
                        free_since = free_since if free_since is not None else now
                        if now - free_since >= (grace_s if seen else unseen_grace_s):
                            await follower.detach()
                            return True
                    backoff.reset()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), POLL_S)
        except BROKER_GONE as exc:
            delay = backoff.next()
            log.warning("standby of %s: broker unavailable (%s: %s); again in %.1fs", lock,
                        type(exc).__name__, exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
    return False
