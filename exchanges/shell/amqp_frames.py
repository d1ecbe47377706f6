"""AMQP 0-9-1 frames of a consuming connection, parsed in bulk (no I/O): bytes in, deliveries
and the other frames out. The pure half of exchanges/shell/bulk_consumer.py.

aio-pika hands a consumer one message at a time: aiormq reads each of a delivery's three
frames through its own awaits, locks and queues, starts a task per message, and aio-pika
wraps it in an object that parses every property. At one small MQTT position per message
that was x-ingress's cost (issue 39: 83% of a core at 3,578 positions/s). Here a whole read
of the socket (up to hundreds of deliveries) is cut into frames in one loop; a delivery keeps
its content header's raw bytes and parses them (pamqp) only when a property is asked for.

Invariants:
- Deliveries come out in the order of the wire, each exactly once, complete (method, header
  and every body frame); a delivery split across reads is held until its last body frame.
- Frames other than deliveries (replies, cancels, closes, heartbeats) come out in wire order
  relative to each other, after the deliveries parsed in the same call. A reply to a cancel
  thus comes after every delivery sent before it.
- A frame that does not parse (a wrong end octet, a body without a header) is a protocol
  error (`FrameError`): the connection cannot be trusted past it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pamqp.frame
from pamqp import commands
from pamqp.header import ContentHeader

FRAME_END = 0xCE
METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
DELIVER = (60, 60)  # basic.deliver
_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_TAG_REDELIVERED = struct.Struct(">QB")
_BODY_SIZE = struct.Struct(">Q")
_DELIVERY_COUNT = b"x-delivery-count"


class FrameError(ConnectionError):
    """The peer sent something that is not AMQP 0-9-1 as this parser knows it."""


class Delivery:
    """One message as delivered: what a routing role reads on every message (body, routing
    key, delivery tag, redelivered) as plain attributes; the properties parsed on first use.
    Duck-types the parts of aio-pika's IncomingMessage the sidecars use."""

    __slots__ = (
        "_header",
        "_props",
        "_settle",
        "body",
        "delivery_tag",
        "exchange",
        "redelivered",
        "routing_key",
    )

    def __init__(self, delivery_tag: int, redelivered: bool, exchange: str, routing_key: str, body: bytes,
                 header: bytes, settle: Callable[[int, int, bool, bool], Any]) -> None:
        self.delivery_tag, self.redelivered = delivery_tag, redelivered
        self.exchange, self.routing_key, self.body = exchange, routing_key, body
        self._header = header
        self._props: commands.Basic.Properties | None = None
        self._settle = settle  # (kind, delivery_tag, multiple, requeue), kind: ACK / NACK / REJECT

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._props is None:
            h = ContentHeader()
            h.unmarshal(self._header)
            self._props = h.properties
        return self._props

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})

    @property
    def delivery_count(self) -> int:
        """The quorum queue's x-delivery-count (0 on a first delivery), without parsing the
        properties of a message that has none."""
        if _DELIVERY_COUNT not in self._header:
            return 0
        raw = (self.properties.headers or {}).get("x-delivery-count", 0)
        return raw if isinstance(raw, int) else 0

    content_type = property(lambda self: self.properties.content_type)
    message_id = property(lambda self: self.properties.message_id)
    correlation_id = property(lambda self: self.properties.correlation_id)
    reply_to = property(lambda self: self.properties.reply_to)
    app_id = property(lambda self: self.properties.app_id)
    user_id = property(lambda self: self.properties.user_id)
    timestamp = property(lambda self: self.properties.timestamp)
    delivery_mode = property(lambda self: self.properties.delivery_mode)

    async def ack(self, multiple: bool = False) -> None:
        await self._settle(ACK, self.delivery_tag, multiple, False)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        await self._settle(NACK, self.delivery_tag, multiple, requeue)

    async def reject(self, requeue: bool = False) -> None:
        await self._settle(REJECT, self.delivery_tag, False, requeue)


ACK, NACK, REJECT = 0, 1, 2


def _shortstr(buf: bytes | memoryview, at: int) -> tuple[str, int]:
    n = buf[at]
    return bytes(buf[at + 1:at + 1 + n]).decode("utf-8", "replace"), at + 1 + n


class ChannelFrames:
    """One channel's deliveries being put together across reads."""

    def __init__(self, settle: Callable[[int, int, bool, bool], Any]) -> None:
        self.settle = settle
        self._deliver: tuple[int, bool, str, str] | None = None
        self._header: bytes | None = None
        self._size = 0
        self._parts: list[bytes] = []
        self._have = 0
        self.deliveries: list[Delivery] = []

    def method(self, payload: memoryview) -> bool:
        """True if the method frame was a delivery's (taken here), False for any other."""
        if _CLASS_METHOD.unpack_from(payload) != DELIVER:
            return False
        if self._deliver is not None:
            raise FrameError("a delivery began before the previous one was complete")
        _tag, at = _shortstr(payload, 4)
        delivery_tag, redelivered = _TAG_REDELIVERED.unpack_from(payload, at)
        exchange, at = _shortstr(payload, at + 9)
        routing_key, _ = _shortstr(payload, at)
        self._deliver = (delivery_tag, bool(redelivered & 1), exchange, routing_key)
        return True

    def header(self, payload: memoryview) -> bool:
        if self._deliver is None or self._header is not None:
            raise FrameError("a content header outside a delivery")
        self._header = bytes(payload)
        (self._size,) = _BODY_SIZE.unpack_from(payload, 4)
        self._parts, self._have = [], 0
        if self._size == 0:
            self._complete()
        return True

    def body(self, payload: memoryview) -> bool:
        if self._header is None:
            raise FrameError("a content body outside a delivery")
        self._parts.append(bytes(payload))
        self._have += len(payload)
        if self._have >= self._size:
            if self._have > self._size:
                raise FrameError(f"a body of {self._have} bytes, the header said {self._size}")
            self._complete()
        return True

    def _complete(self) -> None:
        assert self._deliver is not None and self._header is not None
        tag, redelivered, exchange, key = self._deliver
        body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self.deliveries.append(Delivery(tag, redelivered, exchange, key, body, self._header, self.settle))
        self._deliver, self._header, self._parts, self._have = None, None, [], 0

    def take(self) -> list[Delivery]:
        out, self.deliveries = self.deliveries, []
        return out


def parse(buf: bytearray, channels: dict[int, ChannelFrames], frame_max: int) -> list[tuple[int, Any]]:
    """Cuts the complete frames off the front of `buf` (what remains is the start of the next
    one). Deliveries go to their channel's ChannelFrames; every other frame is returned, as
    (channel, the pamqp frame), in order. A frame for a channel not in `channels` is returned
    too (a close of a channel being opened, say)."""
    view = memoryview(buf)
    at, end, others = 0, len(buf), []
    try:
        while end - at >= 7:
            kind, ch, size = _HEAD.unpack_from(view, at)
            if size > frame_max:
                raise FrameError(f"a frame of {size} bytes, above the negotiated {frame_max}")
            stop = at + 7 + size
            if stop >= end:
                break
            if view[stop] != FRAME_END:
                raise FrameError(f"frame end {view[stop]:#x} instead of {FRAME_END:#x}")
            cf = channels.get(ch)
            with view[at + 7:stop] as payload:  # released at once: `buf` is cut below
                if kind == METHOD and cf is not None and cf.method(payload):
                    taken = True
                elif kind == HEADER and cf is not None:
                    taken = cf.header(payload)
                elif kind == BODY and cf is not None:
                    taken = cf.body(payload)
                else:
                    taken = kind == HEARTBEAT  # the reader counts every read as a sign of life
            if not taken:
                try:
                    _n, _ch, frame = pamqp.frame.unmarshal(bytes(view[at:stop + 1]))
                except Exception as exc:  # pamqp's UnmarshalingException and the struct errors beneath
                    raise FrameError(f"a frame that does not parse: {exc!r}") from exc
                others.append((ch, frame))
            at = stop + 1
    finally:
        view.release()
    del buf[:at]
    return others
