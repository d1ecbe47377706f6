"""exchanges/shell/amqp_frames.py: a consuming connection's bytes cut into deliveries and other
frames, whatever the reads' boundaries; properties parsed on demand; bad frames refused."""

from __future__ import annotations

import random
from typing import Any

import pamqp.frame
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from exchanges.shell.amqp_frames import ACK, ChannelFrames, Delivery, FrameError, parse

FRAME_MAX = 4096


def delivery(tag: int, key: str, body: bytes, props: commands.Basic.Properties | None = None,
             redelivered: bool = False, channel: int = 1, frame_max: int = FRAME_MAX) -> bytes:
    out = pamqp.frame.marshal(commands.Basic.Deliver("ctag-1", tag, redelivered, "amq.topic", key), channel)
    out += pamqp.frame.marshal(ContentHeader(0, len(body), props or commands.Basic.Properties()), channel)
    step = frame_max - 8
    for i in range(0, len(body), step):
        out += pamqp.frame.marshal(ContentBody(body[i:i + step]), channel)
    return out


def settled() -> tuple[list[tuple[int, int, bool, bool]], Any]:
    calls: list[tuple[int, int, bool, bool]] = []

    async def settle(kind: int, tag: int, multiple: bool, requeue: bool) -> None:
        calls.append((kind, tag, multiple, requeue))
    return calls, settle


def feed(wire: bytes, cuts: list[int], channels: dict[int, ChannelFrames]
         ) -> tuple[list[Delivery], list[Any]]:
    buf, got, others, at = bytearray(), [], [], 0
    for cut in [*sorted(cuts), len(wire)]:
        buf += wire[at:cut]
        at = cut
        others += parse(buf, channels, FRAME_MAX)
        got += channels[1].take()
    assert not buf
    return got, others


def test_deliveries_come_out_whole_in_wire_order_whatever_the_reads() -> None:
    bodies = [b'{"lon": 1, "lat": 2, "ts": 3}', b"", bytes(range(256)) * 40, b"x"]  # one spans 3 frames
    wire = b"".join(delivery(i + 1, f"positions.t.o{i}", b) for i, b in enumerate(bodies))
    rng = random.Random(7)
    for trial in range(200):
        cuts = [] if trial == 0 else list(range(len(wire))) if trial == 1 else \
            rng.sample(range(1, len(wire)), rng.randint(1, 30))
        _, settle = settled()
        got, others = feed(wire, cuts, {1: ChannelFrames(settle)})
        assert [(d.delivery_tag, d.routing_key, d.body, d.exchange) for d in got] == \
            [(i + 1, f"positions.t.o{i}", b, "amq.topic") for i, b in enumerate(bodies)]
        assert others == []


def test_properties_are_parsed_on_demand_and_the_delivery_count_without_them() -> None:
    props = commands.Basic.Properties(content_type="application/json", message_id="m-1", reply_to="r",
                                      correlation_id="c", headers={"x-mqtt-publish-qos": 1})
    again = commands.Basic.Properties(headers={"x-delivery-count": 3})
    wire = delivery(1, "k", b"a", props) + delivery(2, "k", b"b", again, redelivered=True)
    _, settle = settled()
    (first, second), _ = feed(wire, [], {1: ChannelFrames(settle)})
    assert first.delivery_count == 0 and first._props is None  # decided from the raw bytes
    assert (first.content_type, first.message_id, first.reply_to, first.correlation_id) == \
        ("application/json", "m-1", "r", "c")
    assert first.headers == {"x-mqtt-publish-qos": 1}
    assert second.redelivered and not first.redelivered
    assert second.delivery_count == 3


async def test_a_settlement_goes_to_its_channel_with_the_delivery_tag() -> None:
    calls, settle = settled()
    (d,), _ = feed(delivery(41, "k", b"a"), [], {1: ChannelFrames(settle)})
    await d.ack(multiple=True)
    await d.nack(requeue=False)
    await d.reject(requeue=True)
    assert calls == [(ACK, 41, True, False), (1, 41, False, False), (2, 41, False, True)]


def test_other_frames_come_out_in_order_after_the_deliveries_and_other_channels_are_left_alone() -> None:
    wire = (delivery(1, "k", b"a") + pamqp.frame.marshal(commands.Basic.CancelOk("ctag-1"), 1)
            + pamqp.frame.marshal(commands.Basic.QosOk(), 2) + pamqp.frame.marshal(commands.Connection.Close(
                320, "CONNECTION_FORCED", 0, 0), 0) + b"\x08\x00\x00\x00\x00\x00\x00\xce")
    _, settle = settled()
    got, others = feed(wire, [], {1: ChannelFrames(settle)})
    assert [d.delivery_tag for d in got] == [1]
    assert [(ch, type(f).__name__) for ch, f in others] == [(1, "CancelOk"), (2, "QosOk"), (0, "Close")]


@pytest.mark.parametrize("wire, why", [
    (delivery(1, "k", b"abc")[:-1] + b"\x00", "frame end"),
    (pamqp.frame.marshal(ContentHeader(0, 1, commands.Basic.Properties()), 1), "outside a delivery"),
    (pamqp.frame.marshal(ContentBody(b"x"), 1), "outside a delivery"),
    (pamqp.frame.marshal(commands.Basic.Deliver("c", 1, False, "", "k"), 1) * 2, "before the previous"),
    (b"\x03\x00\x01" + (FRAME_MAX + 1).to_bytes(4, "big"), "above the negotiated"),
    (b"\x01\x00\x00\x00\x00\x00\x04\x00\x63\x00\x01\xce", "does not parse"),
])
def test_a_frame_that_is_not_amqp_is_a_protocol_error(wire: bytes, why: str) -> None:
    _, settle = settled()
    with pytest.raises(FrameError, match=why):
        parse(bytearray(wire), {1: ChannelFrames(settle)}, FRAME_MAX)


def test_a_body_longer_than_its_header_said_is_refused() -> None:
    wire = (pamqp.frame.marshal(commands.Basic.Deliver("c", 1, False, "", "k"), 1)
            + pamqp.frame.marshal(ContentHeader(0, 2, commands.Basic.Properties()), 1)
            + pamqp.frame.marshal(ContentBody(b"abc"), 1))
    _, settle = settled()
    with pytest.raises(FrameError, match="header said 2"):
        parse(bytearray(wire), {1: ChannelFrames(settle)}, FRAME_MAX)
