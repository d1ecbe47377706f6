"""exchanges/shell/bulk_consumer.py against the real RabbitMQ: a quorum queue consumed in bulk
gives every message once, in order, with its properties; a batch settled by one multiple ack
leaves nothing behind; unacked deliveries come back (redelivered, counted) to the next
consumer; a cancel returns after the deliveries sent before it; the broker's own close (the
queue deleted, the connection closed from the management API) ends the connection loudly;
a wrong password is refused at the handshake."""

from __future__ import annotations

import asyncio
import urllib.parse
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from deploy.settings import ConnectionSettings
from exchanges.shell.amqp_frames import Delivery
from exchanges.shell.bulk_consumer import BulkChannel, BulkConnection, open_bulk
from tests.integration.clients import api, close_connection

DEADLINE_S = 20.0


@pytest.fixture
async def queue(stack: ConnectionSettings) -> AsyncIterator[str]:
    name = f"test.bulk.{uuid.uuid4().hex[:10]}"
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel()
        await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            yield name
        finally:
            await ch.queue_delete(name)


async def publish(stack: ConnectionSettings, queue: str, bodies: list[bytes], **props: object) -> None:
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel(publisher_confirms=True)
        for b in bodies:
            await ch.default_exchange.publish(aio_pika.Message(b, delivery_mode=2, **props),  # type: ignore[arg-type]
                                              routing_key=queue)


class Collect:
    def __init__(self) -> None:
        self.got: list[Delivery] = []
        self.reads = 0
        self.changed = asyncio.Event()

    def __call__(self, deliveries: list[Delivery]) -> None:
        self.got += deliveries
        self.reads += 1
        self.changed.set()

    async def until(self, n: int) -> list[Delivery]:
        async with asyncio.timeout(DEADLINE_S):
            while len(self.got) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.got


async def consuming(stack: ConnectionSettings, queue: str, prefetch: int
                    ) -> tuple[BulkConnection, BulkChannel, Collect]:
    """A bulk connection consuming `queue` at `prefetch`, what it gets collected."""
    conn = await open_bulk(stack["amqp"]["/"], 10)
    ch = await conn.channel()
    await ch.qos(prefetch)
    seen = Collect()
    await ch.consume(queue, seen)
    return conn, ch, seen


async def ready_and_unacked(stack: ConnectionSettings, queue: str) -> tuple[int, int]:
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel()
        q = await ch.declare_queue(queue, passive=True)
        ready = int(q.declaration_result.message_count or 0)
    got = api(stack, f"api/queues/%2F/{urllib.parse.quote(queue, safe='')}")
    return ready, int((got or {}).get("messages_unacknowledged") or 0)


async def test_every_message_once_in_order_with_its_properties_then_one_ack_settles_them(
        stack: ConnectionSettings, queue: str) -> None:
    bodies = [f'{{"lon": {i}, "lat": 1, "ts": 2}}'.encode() for i in range(3000)] + [b"x" * 300_000]
    await publish(stack, queue, bodies, content_type="application/json", message_id="m",
                  headers={"h": "v"})
    conn, _, seen = await consuming(stack, queue, 5000)
    try:
        got = await seen.until(len(bodies))
        assert [d.body for d in got] == bodies  # the last spans several frames
        assert [d.delivery_tag for d in got] == list(range(1, len(bodies) + 1))
        assert seen.reads < len(bodies) / 10, "deliveries came one read at a time"
        assert {(d.content_type, d.message_id, d.headers.get("h"), d.routing_key, d.redelivered,
                 d.delivery_count) for d in got} == {("application/json", "m", "v", queue, False, 0)}
        await got[-1].ack(multiple=True)
        async with asyncio.timeout(DEADLINE_S):
            while await ready_and_unacked(stack, queue) != (0, 0):
                await asyncio.sleep(0.5)  # the management figures refresh every 5 s: polled
    finally:
        await conn.close()


async def test_unacked_deliveries_come_back_redelivered_and_counted_to_the_next_consumer(
        stack: ConnectionSettings, queue: str) -> None:
    await publish(stack, queue, [b"a", b"b", b"c"])
    first, _, seen = await consuming(stack, queue, 10)
    got = await seen.until(3)
    await got[0].ack()
    await first.close()  # b and c unacked
    second, _, again = await consuming(stack, queue, 10)
    try:
        back = await again.until(2)
        assert [(d.body, d.redelivered, d.delivery_count) for d in back] == [(b"b", True, 1), (b"c", True, 1)]
        await back[-1].ack(multiple=True)
    finally:
        await second.close()


async def test_a_cancel_returns_after_what_was_delivered_before_it(stack: ConnectionSettings,
                                                                   queue: str) -> None:
    await publish(stack, queue, [str(i).encode() for i in range(500)])
    conn = await open_bulk(stack["amqp"]["/"], 10)
    try:
        ch = await conn.channel()
        await ch.qos(100)
        seen = Collect()
        tag = await ch.consume(queue, seen)
        await seen.until(100)
        await ch.cancel(tag)
        n = len(seen.got)
        assert n == 100  # the prefetch: nothing more came, nothing came after the cancel-ok
        await seen.got[-1].ack(multiple=True)
        await asyncio.sleep(0)
        assert len(seen.got) == n
    finally:
        await conn.close()


async def test_the_broker_deleting_the_queue_cancels_the_consumer_and_a_forced_close_ends_the_connection(
        stack: ConnectionSettings, queue: str) -> None:
    conn = await open_bulk(stack["amqp"]["/"] + "?name=bulk-test-" + queue, 10)
    lost = asyncio.Event()
    conn.close_callbacks.add(lambda *_: lost.set())
    try:
        ch = await conn.channel()
        cancelled = asyncio.Event()
        ch.cancel_callbacks.add(lambda frame: cancelled.set())
        await ch.consume(queue, Collect())
        async with await aio_pika.connect(stack["amqp"]["/"]) as c:
            await (await c.channel()).queue_delete(queue)
        async with asyncio.timeout(DEADLINE_S):
            await cancelled.wait()
        assert not conn.is_closed
        named = await connection_named(stack, "bulk-test-" + queue)
        close_connection(stack, named)
        async with asyncio.timeout(DEADLINE_S):
            await lost.wait()
        assert conn.is_closed
        with pytest.raises(ConnectionError):
            await ch.qos(1)
    finally:
        await conn.close()


async def connection_named(stack: ConnectionSettings, name: str) -> str:
    async with asyncio.timeout(DEADLINE_S):
        while True:
            for c in api(stack, "api/connections") or []:
                if str(c.get("client_properties", {}).get("connection_name", "")).startswith(name):
                    return str(c["name"])
            await asyncio.sleep(0.5)  # the management API lists a connection a moment after it opens


async def test_an_unknown_login_is_refused_at_the_handshake(stack: ConnectionSettings) -> None:
    u = urllib.parse.urlsplit(stack["amqp"]["/"])  # a user of its own: lock-outs are per user
    wrong = u._replace(netloc=f"nobody-{uuid.uuid4().hex[:8]}:not-a-password@{u.hostname}:{u.port}").geturl()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await open_bulk(wrong, 10)


async def test_an_open_connection_closes_cleanly(stack: ConnectionSettings) -> None:
    conn = BulkConnection(stack["amqp"]["/"])
    await conn.open(10)
    await conn.channel()
    await conn.close()
    assert conn.is_closed
