"""AMQP 0-9-1 frames of a plain publish (basic.publish, its content header and body frames),
encoded by hand so a batch of messages is one bytes object: one socket write for the batch
instead of aiormq's per-message marshalling, lock and queue put.

Plain means: no headers, no message id, no correlation id, not mandatory; properties are a
content type and a delivery mode, so the header frame is the same for every message but for
its body size (patched in at a fixed offset). Anything else goes through aiormq's
basic_publish (exchanges/shell/publish.py decides). tests/unit/test_publish_frames.py checks
every frame against pamqp's marshalling.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import pamqp.frame
from pamqp.commands import Basic
from pamqp.header import ContentHeader

FRAME_END = b"\xce"
_PUBLISH_METHOD = struct.pack(">HHH", 60, 40, 0)  # basic.publish, reserved ticket 0
_FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_BODY_SIZE_AT = 7 + 4  # frame head, then class id and weight: the 8-byte body size
_BODY_SIZE = struct.Struct(">Q")
METHOD, HEADER, BODY = 1, 2, 3
FRAME_OVERHEAD = 8  # head (7) and end (1): a body frame carries frame_max - 8 bytes


def short_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"AMQP short strings are at most 255 bytes, got {len(raw)}: {text[:60]!r}...")
    return bytes((len(raw),)) + raw


@lru_cache(maxsize=64)
def _header_template(channel: int, content_type: str, delivery_mode: int) -> bytes:
    props = Basic.Properties(content_type=content_type, delivery_mode=delivery_mode)
    return pamqp.frame.marshal(ContentHeader(0, 0, props), channel)


def body_frames(channel: int, body: bytes, frame_max: int) -> list[bytes]:
    """The body in frames of at most frame_max bytes each (an empty body has none)."""
    room = frame_max - FRAME_OVERHEAD
    out: list[bytes] = []
    for at in range(0, len(body), room):
        chunk = body[at:at + room]
        out += (_FRAME_HEAD.pack(BODY, channel, len(chunk)), chunk, FRAME_END)
    return out


def messages(channel: int, exchange: str, routing_keys: Sequence[str], bodies: Sequence[bytes],
             content_type: str, delivery_mode: int, frame_max: int) -> list[bytes]:
    """The frames of many plain publishes to one exchange, as parts to join: the method
    frame's fixed part and the header template are made once (a key per event: nothing to
    cache per key); a body over frame_max - 8 bytes is split into several body frames."""
    head = _PUBLISH_METHOD + short_string(exchange)
    template = _header_template(channel, content_type, delivery_mode)
    before, after = template[:_BODY_SIZE_AT], template[_BODY_SIZE_AT + 8:]
    pack_head, pack_size, room = _FRAME_HEAD.pack, _BODY_SIZE.pack, frame_max - FRAME_OVERHEAD
    method_tail = b"\x00" + FRAME_END
    parts: list[bytes] = []
    add = parts.extend
    for key, body in zip(routing_keys, bodies, strict=True):
        k = short_string(key)
        add((pack_head(METHOD, channel, len(head) + len(k) + 1), head, k, method_tail,
             before, pack_size(len(body)), after))
        if len(body) <= room:
            if body:
                add((pack_head(BODY, channel, len(body)), body, FRAME_END))
        else:
            add(body_frames(channel, body, frame_max))
    return parts
