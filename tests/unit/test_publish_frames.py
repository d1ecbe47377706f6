"""The hand-encoded publish frames (exchanges/shell/frames.py) against pamqp's marshalling, and
the one-write publish of plain messages (exchanges/shell/publish.py) against a fake aiormq
channel: tags in step, confirms awaited, a nack refused, a lost channel a ConnectionError."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import aiormq
import pamqp.frame
import pytest
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from exchanges import shell
from exchanges.shell import frames
from exchanges.shell.counters import Counters


def pamqp_message(channel: int, exchange: str, key: str, content_type: str, mode: int, body: bytes,
                  frame_max: int) -> bytes:
    props = Basic.Properties(content_type=content_type, delivery_mode=mode)
    out = [pamqp.frame.marshal(Basic.Publish(exchange=exchange, routing_key=key), channel),
           pamqp.frame.marshal(ContentHeader(0, len(body), props), channel)]
    room = frame_max - 8
    out += [pamqp.frame.marshal(ContentBody(body[i:i + room]), channel) for i in range(0, len(body), room)]
    return b"".join(out)


@pytest.mark.parametrize("size", [0, 1, 200, 4_088, 4_089, 12_000])
@pytest.mark.parametrize("channel", [1, 7, 300])
def test_frames_match_pamqp(size: int, channel: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    ours = b"".join(frames.messages(channel, "fence.events", ["fence-events.f1.enter.o-1"], [body],
                                    "application/json", 2, 4_096))
    assert ours == pamqp_message(channel, "fence.events", "fence-events.f1.enter.o-1",
                                 "application/json", 2, body, 4_096)


def test_frames_default_exchange_and_transient_mode() -> None:
    ours = b"".join(frames.messages(2, "", ["reply-q"], [b"x" * 10], "application/msgpack", 1, 131_072))
    assert ours == pamqp_message(2, "", "reply-q", "application/msgpack", 1, b"x" * 10, 131_072)


def test_a_routing_key_over_255_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 255 bytes"):
        frames.messages(1, "fence.events", ["k" * 256], [b""], "application/json", 2, 131_072)


# --------------------------------------------------------------------------- one write


class Tune:
    frame_max = 131_072


class FakeChannel:
    """What _publish_plain uses of aiormq's Channel; confirms answered by `answer`."""

    def __init__(self, answer: Any = "ack", closed: bool = False) -> None:
        self.publisher_confirms = True
        self.delivery_tag = 5  # earlier publishes on the channel
        self.confirmations: OrderedDict[int, Any] = OrderedDict()
        self.lock = asyncio.Lock()
        self.number = 3
        self.is_closed = closed
        self.connection = type("C", (), {"connection_tune": Tune()})()
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.answer = answer
        self.writes: list[bytes] = []
        self.store: list[asyncio.Future[Any]] = []
        self.task = asyncio.get_running_loop().create_task(self.broker())

    def create_future(self) -> asyncio.Future[Any]:  # in aiormq's store: a lost channel fails them
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.store.append(f)
        return f

    async def broker(self) -> None:
        while True:
            frame = await self.write_queue.get()
            self.writes.append(frame.payload)
            frame.drain_future.set_result(None)
            if self.answer == "lost":  # aiormq rejects its future store, not the confirmations
                for f in self.store:
                    if not f.done():
                        f.set_exception(Exception("channel closed"))
                continue
            for tag, f in list(self.confirmations.items()):
                self.confirmations.pop(tag)
                if self.answer == "ack":
                    f.set_result(Basic.Ack(delivery_tag=tag))
                elif self.answer == "nack-even" and tag % 2 == 0:
                    f.set_exception(aiormq.exceptions.DeliveryError(None, Basic.Nack(delivery_tag=tag)))
                else:
                    f.set_result(Basic.Ack(delivery_tag=tag))


class FakeExchange:
    def __init__(self, underlay: FakeChannel, name: str = "fence.events") -> None:
        self.name = name
        underlay_ = underlay

        class Ch:
            async def get_underlay_channel(self) -> FakeChannel:
                return underlay_

        self.channel = Ch()


def outs(ex: Any, n: int) -> list[shell.Out]:
    return [shell.Out(ex, f"fence-events.f.enter.o{i}", b'{"i":%d}' % i, "application/json",
                      mandatory=False) for i in range(n)]


async def test_plain_messages_go_out_in_one_write_with_their_tags() -> None:
    ch = FakeChannel()
    counters = Counters()
    await shell.publish_all(outs(FakeExchange(ch), 50), counters)
    assert len(ch.writes) == 1 and ch.delivery_tag == 55 and counters.published == 50
    expected = b"".join(pamqp_message(3, "fence.events", f"fence-events.f.enter.o{i}", "application/json", 2,
                                      b'{"i":%d}' % i, 131_072) for i in range(50))
    assert ch.writes[0] == expected
    ch.task.cancel()


async def test_nacked_plain_messages_are_retried_alone() -> None:
    ch = FakeChannel("nack-even")
    counters = Counters()
    first = asyncio.get_running_loop().create_task(shell.publish_all(outs(FakeExchange(ch), 4), counters))
    await asyncio.wait_for(_until(lambda: len(ch.writes) >= 1), 5)
    ch.answer = "ack"  # the broker takes them on the retry
    await asyncio.wait_for(first, 10)
    assert counters.retries == 2 and counters.published == 4 and len(ch.writes) == 2
    ch.task.cancel()


async def test_a_channel_lost_under_a_plain_batch_is_a_connection_error() -> None:
    ch = FakeChannel("lost")
    with pytest.raises(ConnectionError, match="lost with its channel"):
        await shell.publish_all(outs(FakeExchange(ch), 3), Counters())
    ch.task.cancel()


async def test_a_closed_channel_takes_no_plain_batch() -> None:
    ch = FakeChannel(closed=True)
    with pytest.raises(ConnectionError, match="closed channel"):
        await shell.publish_all(outs(FakeExchange(ch), 3), Counters())
    assert ch.delivery_tag == 5 and not ch.confirmations
    ch.task.cancel()


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0)


async def test_aiormqs_own_confirm_path_settles_a_batch() -> None:
    """_Confirm meets aiormq's Channel._confirm_delivery (the code that runs on the broker's
    ack or nack) as its own futures do: acks count down, a nack is kept by message."""
    from types import SimpleNamespace

    from exchanges.shell import publish

    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    batch = publish._Batch(3, done)
    holder = SimpleNamespace(confirmations=OrderedDict(
        (tag, publish._Confirm(batch, i)) for i, tag in enumerate((7, 8, 9))))
    aiormq.Channel._confirm_delivery(holder, 7, Basic.Ack(delivery_tag=7))  # type: ignore[arg-type]
    aiormq.Channel._confirm_delivery(holder, 8, Basic.Nack(delivery_tag=8))  # type: ignore[arg-type]
    assert not done.done()
    aiormq.Channel._confirm_delivery(holder, 9, Basic.Ack(delivery_tag=9))  # type: ignore[arg-type]
    assert done.done() and list(batch.refused) == [1]
    assert isinstance(batch.refused[1], aiormq.exceptions.DeliveryError)
    assert not holder.confirmations


@pytest.mark.parametrize("size", [0, 1, 300, 4_088, 4_089, 9_000])
def test_many_messages_frame_like_one_at_a_time(size: int) -> None:
    keys = [f"fence-events.f{i}.enter.o-{i}" for i in range(5)]
    bodies = [bytes([i]) * size for i in range(5)]
    many = b"".join(frames.messages(9, "fence.events", keys, bodies, "application/json", 2, 4_096))
    assert many == b"".join(pamqp_message(9, "fence.events", k, "application/json", 2, b, 4_096)
                            for k, b in zip(keys, bodies, strict=True))


def test_many_messages_refuse_a_long_key() -> None:
    with pytest.raises(ValueError, match="at most 255 bytes"):
        frames.messages(1, "x", ["ok", "k" * 256], [b"", b""], "application/json", 2, 131_072)


async def test_plains_and_plain_outs_share_one_write_in_order() -> None:
    ch = FakeChannel()
    ex = FakeExchange(ch)
    plains = shell.Plains(ex, ["a", "b"], [b"1", b"2"])  # type: ignore[arg-type]
    out = shell.Out(ex, "c", b"3", "application/json", mandatory=False)  # type: ignore[arg-type]
    counters = Counters()
    await shell.publish_all([plains, out], counters)
    assert counters.published == 3 and len(ch.writes) == 1 and ch.delivery_tag == 8
    assert ch.writes[0] == b"".join(pamqp_message(3, "fence.events", k, "application/json", 2, b, 131_072)
                                    for k, b in (("a", b"1"), ("b", b"2"), ("c", b"3")))
    ch.task.cancel()


async def test_a_nacked_message_of_plains_is_retried_alone() -> None:
    ch = FakeChannel("nack-even")
    ex = FakeExchange(ch)
    counters = Counters()
    task = asyncio.get_running_loop().create_task(shell.publish_all(
        [shell.Plains(ex, ["k0", "k1", "k2"], [b"0", b"1", b"2"])], counters))  # type: ignore[arg-type]
    await asyncio.wait_for(_until(lambda: len(ch.writes) >= 1), 5)
    ch.answer = "ack"
    await asyncio.wait_for(task, 10)
    assert counters.published == 3 and counters.retries == 2  # tags 6 and 8 of 6..8 were nacked
    assert ch.writes[1] == b"".join(pamqp_message(3, "fence.events", k, "application/json", 2, b, 131_072)
                                    for k, b in (("k0", b"0"), ("k2", b"2")))
    ch.task.cancel()
