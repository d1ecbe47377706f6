"""A consuming AMQP connection that reads deliveries in bulk (exchanges/shell/amqp_frames.py
parses; this module does the socket, the handshake, the replies and the settlements).

The mirror of the batch publisher (exchanges/shell/publish.py): one read of the socket, one
parse, one call of the consumer with every delivery it held, and a batch settled with one
`ack(multiple=True)` frame. It consumes and settles only; a role publishes through aio-pika
as before, and declares its queues there (a `BulkQueue` keeps the aio-pika queue for that).

Invariants:
- One consumer per channel, one channel per queue (Intake's rule): a channel's unacked
  deliveries are exactly what its consumer was handed and not yet settled.
- Anything the broker says that ends the connection or a channel (a close, an unknown frame,
  silence for two heartbeats) closes the whole connection: every waiting reply and every
  later settlement raises ConnectionError (in BROKER_GONE: the session ends, the unacked
  input comes back to the next one), and the close callbacks run once.
- A settlement is written at once, in the order it is asked for; a write to a closed
  connection raises instead of vanishing.

Trade-off: a second connection per consuming role (aio-pika keeps the publishing side and the
declares), for a consumer that costs a few microseconds a message instead of tens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pamqp.frame
from aio_pika.abc import AbstractQueue
from pamqp import commands
from pamqp.heartbeat import Heartbeat

from exchanges.shell.amqp_frames import ACK, NACK, ChannelFrames, Delivery, FrameError, parse

log = logging.getLogger("geofence")
READ_BYTES = 1 << 18
HEARTBEAT_S = 60
FRAME_MAX = 131072
Deliveries = Callable[[list[Delivery]], None]


class BulkConnection:
    """`open` (handshake), `channel` (one per queue), `close`. `close_callbacks` and
    `is_closed` as aio-pika's connection has them (exchanges/shell/connections.connection_lost)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.close_callbacks: set[Callable[..., Any]] = set()
        self.is_closed = False
        self.frame_max = FRAME_MAX
        self.heartbeat = HEARTBEAT_S
        self._channels: dict[int, BulkChannel] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._read_at = self._wrote_at = time.monotonic()
        self._why: BaseException | None = None

    async def open(self, timeout: float) -> None:
        await asyncio.wait_for(self._open(), timeout)

    async def _open(self) -> None:
        u = urlsplit(self.url)
        query = parse_qs(u.query)
        tls: ssl.SSLContext | None = None
        if u.scheme == "amqps":
            tls = ssl.create_default_context(cafile=query.get("cafile", [None])[0])
        port = u.port or (5671 if tls else 5672)
        self._reader, self._writer = await asyncio.open_connection(u.hostname, port, ssl=tls)
        self._writer.write(b"AMQP\x00\x00\x09\x01")
        start = await self._handshake_frame(commands.Connection.Start)
        mechanisms = start.mechanisms
        mechanisms = mechanisms.decode() if isinstance(mechanisms, bytes) else str(mechanisms)
        if "PLAIN" not in mechanisms.split():
            raise ConnectionError(f"the broker offers no PLAIN login ({start.mechanisms!r})")
        name = query.get("name", ["geofence"])[0]
        props: dict[str, Any] = {
            "connection_name": f"{name} (bulk consumer)", "product": "geofence bulk consumer",
            "capabilities": {"consumer_cancel_notify": True, "basic.nack": True,
                             "authentication_failure_close": True}}
        login = f"\0{unquote(u.username or 'guest')}\0{unquote(u.password or 'guest')}"
        self._send(0, commands.Connection.StartOk(client_properties=props, response=login))
        tune = await self._handshake_frame(commands.Connection.Tune)
        self.frame_max = min(tune.frame_max or FRAME_MAX, FRAME_MAX)
        self.heartbeat = min(tune.heartbeat, HEARTBEAT_S) if tune.heartbeat else HEARTBEAT_S
        self._send(0, commands.Connection.TuneOk(tune.channel_max, self.frame_max, self.heartbeat))
        vhost = unquote(u.path[1:]) if len(u.path) > 1 else "/"
        self._send(0, commands.Connection.Open(vhost))
        await self._handshake_frame(commands.Connection.OpenOk)
        self._tasks = [asyncio.create_task(self._read(), name=f"bulk consumer {name}"),
                       asyncio.create_task(self._beat(), name=f"bulk consumer {name} heartbeat")]

    async def _handshake_frame(self, want: type[Any]) -> Any:
        assert self._reader is not None
        head = await self._reader.readexactly(7)
        if head.startswith(b"AMQP"):
            raise ConnectionError("the broker refused the protocol version")
        size = int.from_bytes(head[3:7], "big")
        raw = head + await self._reader.readexactly(size + 1)
        _n, _ch, frame = pamqp.frame.unmarshal(raw)
        if isinstance(frame, commands.Connection.Close):
            raise ConnectionError(f"the broker closed the connection: {frame.reply_code} {frame.reply_text}")
        if not isinstance(frame, want):
            raise FrameError(f"{frame!r} where {want.__name__} was expected")
        return frame

    def _send(self, channel: int, frame: Any) -> None:
        if self.is_closed or self._writer is None:
            raise ConnectionError(f"the bulk consumer's connection is closed ({self._why!r})")
        self._writer.write(pamqp.frame.marshal(frame, channel))
        self._wrote_at = time.monotonic()

    def _send_raw(self, data: bytes) -> None:
        if self.is_closed or self._writer is None:
            raise ConnectionError(f"the bulk consumer's connection is closed ({self._why!r})")
        self._writer.write(data)
        self._wrote_at = time.monotonic()

    async def channel(self) -> BulkChannel:
        number = max(self._channels, default=0) + 1
        ch = BulkChannel(self, number)
        self._channels[number] = ch
        await ch.call(commands.Channel.Open(), commands.Channel.OpenOk)
        return ch

    async def _read(self) -> None:
        assert self._reader is not None
        buf = bytearray()
        frames = {n: c.frames for n, c in self._channels.items()}
        try:
            while True:
                data = await self._reader.read(READ_BYTES)
                if not data:
                    raise ConnectionError("the broker closed the socket")
                self._read_at = time.monotonic()
                buf += data
                if len(frames) != len(self._channels):
                    frames = {n: c.frames for n, c in self._channels.items()}
                others = parse(buf, frames, self.frame_max)
                for ch in self._channels.values():
                    got = ch.frames.take()
                    if got and ch.on_deliveries is not None:
                        ch.on_deliveries(got)
                for number, frame in others:
                    self._dispatch(number, frame)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the socket, a close from the broker, a protocol error
            self._lost(exc)

    def _dispatch(self, number: int, frame: Any) -> None:
        if isinstance(frame, commands.Connection.Close):
            with contextlib.suppress(Exception):
                self._send(0, commands.Connection.CloseOk())
            raise ConnectionError(f"the broker closed the connection: {frame.reply_code} {frame.reply_text}")
        if isinstance(frame, commands.Connection.Blocked | commands.Connection.Unblocked):
            return  # about publishing: this connection never publishes
        ch = self._channels.get(number)
        if ch is None:
            raise FrameError(f"{frame!r} on channel {number}, which is not open")
        if isinstance(frame, commands.Channel.Close):
            with contextlib.suppress(Exception):
                self._send(number, commands.Channel.CloseOk())
            raise ConnectionError(f"the broker closed channel {number}: {frame.reply_code} "
                                  f"{frame.reply_text}")
        if isinstance(frame, commands.Basic.Cancel):  # the queue went (deleted, or its node)
            for cb in list(ch.cancel_callbacks):
                cb(frame)
            return
        ch.reply(frame)

    async def _beat(self) -> None:
        every = max(self.heartbeat / 2, 0.5)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            if now - self._read_at > 2 * self.heartbeat:
                self._lost(ConnectionError(f"no frame from the broker for {now - self._read_at:.0f}s"))
                return
            if now - self._wrote_at >= every:
                with contextlib.suppress(ConnectionError):
                    self._send(0, Heartbeat())

    def _lost(self, why: BaseException, ours: bool = False) -> None:
        if self.is_closed:
            return
        self.is_closed, self._why = True, why
        if not ours:
            log.warning("bulk consumer connection lost: %r", why)
        for ch in self._channels.values():
            ch.fail(why)
        if self._writer is not None:
            self._writer.close()
        for cb in list(self.close_callbacks):
            with contextlib.suppress(Exception):
                cb(self, why)

    async def close(self) -> None:
        """Cancels the reader, closes politely if the broker is still there, then the socket."""
        if not self.is_closed and self._writer is not None:
            with contextlib.suppress(Exception):
                self._send(0, commands.Connection.Close(200, "bye"))
                await asyncio.wait_for(self._writer.drain(), 2)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self._lost(ConnectionError("closed by this process"), ours=True)


class BulkChannel:
    """One channel: `qos`, `consume` (deliveries to a callback, a list per read of the
    socket), `cancel`, and the settlements its deliveries ask for."""

    def __init__(self, conn: BulkConnection, number: int) -> None:
        self.conn, self.number = conn, number
        self.frames = ChannelFrames(self._settle)
        self.on_deliveries: Deliveries | None = None
        self.cancel_callbacks: set[Callable[[commands.Basic.Cancel], Any]] = set()
        self._waiting: list[tuple[type[Any], asyncio.Future[Any]]] = []
        self._ack = bytearray(b"\x01" + number.to_bytes(2, "big") + (13).to_bytes(4, "big")
                              + b"\x00\x3c\x00\x50" + bytes(9) + b"\xce")

    async def call(self, method: Any, reply: type[Any]) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((reply, fut))
        self.conn._send(self.number, method)
        return await fut

    def reply(self, frame: Any) -> None:
        if not self._waiting or not isinstance(frame, self._waiting[0][0]):
            raise FrameError(f"{frame!r} on channel {self.number}, which waits for "
                             f"{self._waiting[0][0].__name__ if self._waiting else 'nothing'}")
        _want, fut = self._waiting.pop(0)
        if not fut.done():
            fut.set_result(frame)

    def fail(self, why: BaseException) -> None:
        for _want, fut in self._waiting:
            if not fut.done():
                fut.set_exception(ConnectionError(f"the bulk consumer's connection closed: {why!r}"))
        self._waiting = []

    async def qos(self, prefetch: int) -> None:
        await self.call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    async def consume(self, queue: str, on_deliveries: Deliveries, exclusive: bool = False) -> str:
        self.on_deliveries = on_deliveries
        ok = await self.call(commands.Basic.Consume(queue=queue, exclusive=exclusive),
                             commands.Basic.ConsumeOk)
        return str(ok.consumer_tag)

    async def cancel(self, tag: str) -> None:
        await self.call(commands.Basic.Cancel(consumer_tag=tag), commands.Basic.CancelOk)

    async def _settle(self, kind: int, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        if kind == ACK:  # the hot one, written without pamqp: class 60 method 80, tag, multiple bit
            self._ack[11:19] = delivery_tag.to_bytes(8, "big")
            self._ack[19] = 1 if multiple else 0
            self.conn._send_raw(bytes(self._ack))
        elif kind == NACK:
            self.conn._send(self.number, commands.Basic.Nack(delivery_tag, multiple, requeue))
        else:
            self.conn._send(self.number, commands.Basic.Reject(delivery_tag, requeue))
        writer = self.conn._writer
        if writer is not None and writer.transport.get_write_buffer_size() > READ_BYTES:
            await writer.drain()


async def open_bulk(url: str, timeout: float) -> BulkConnection:
    conn = BulkConnection(url)
    try:
        await conn.open(timeout)
    except BaseException:
        await conn.close()
        raise
    return conn


class BulkQueue:
    """What Intake uses of an aio-pika queue, its consumer on a BulkChannel. The aio-pika
    queue stays for what is not consuming: its name, its declare-ok, and the channel the
    Intake's passive declares go through."""

    def __init__(self, queue: AbstractQueue, channel: BulkChannel) -> None:
        self.inner, self.bulk = queue, channel
        self.name = queue.name
        self.channel = queue.channel

    @property
    def declaration_result(self) -> Any:
        return getattr(self.inner, "declaration_result", None)

    async def consume_many(self, on_deliveries: Deliveries, exclusive: bool) -> str:
        return await self.bulk.consume(self.name, on_deliveries, exclusive)

    async def cancel(self, tag: str) -> None:
        await self.bulk.cancel(tag)

    async def set_qos(self, prefetch: int) -> None:
        await self.bulk.qos(prefetch)


class BulkQueues:
    """Several queues consumed as one, on one BulkChannel: x-ingress's partition queues
    (exchanges/ingress_partitions.py). One consumer per queue, every delivery to one callback
    in the order the broker sent them (an object's positions are in one queue, so they stay in
    order); the delivery tags are the channel's, so a batch drawn from several queues still
    settles with one ack(multiple=True) once everything before it is settled."""

    def __init__(self, queues: Sequence[AbstractQueue], channel: BulkChannel,
                 source_of: Callable[[Any], str] | None = None) -> None:
        if not queues:
            raise ValueError("BulkQueues needs at least one queue")
        self.inner, self.bulk = list(queues), channel
        # the queue a delivery came from (a dead letter's source, where a replay goes): a
        # delivery does not say, the caller knows from its routing key (x-ingress: the hash)
        self.source_of = source_of or (lambda _m: self.names[0])
        self.names = [q.name for q in queues]
        self.name = f"{self.names[0]} (+{len(self.names) - 1})" if len(self.names) > 1 else self.names[0]
        self.channel = queues[0].channel

    @property
    def declaration_result(self) -> Any:
        found = [getattr(q, "declaration_result", None) for q in self.inner]
        return SimpleNamespace(message_count=sum(int(getattr(d, "message_count", 0) or 0) for d in found),
                               consumer_count=sum(int(getattr(d, "consumer_count", 0) or 0) for d in found))

    async def consume_many(self, on_deliveries: Deliveries, exclusive: bool) -> str:
        """One tag per queue, joined by spaces (Intake keeps one tag and hands it back to cancel)."""
        return " ".join([await self.bulk.consume(name, on_deliveries, exclusive) for name in self.names])

    async def cancel(self, tag: str) -> None:
        for one in tag.split():
            await self.bulk.cancel(one)

    async def set_qos(self, prefetch: int) -> None:
        await self.bulk.qos(prefetch)  # per consumer (RabbitMQ applies basic.qos to each new one)
