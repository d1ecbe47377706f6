"""exchanges/shell/bulk_consumer.BulkQueues under an Intake, against the real RabbitMQ: several
quorum queues (x-ingress's partitions) consumed as one keep each queue's order, a batch drawn
from several of them settles with one multiple ack, and a cancel reaches every consumer."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator

import aio_pika
import pytest

from deploy.settings import ConnectionSettings
from exchanges.shell import BulkQueues, Intake
from exchanges.shell.bulk_consumer import open_bulk

QUEUES, EACH, DEADLINE_S = 3, 400, 30.0


@pytest.fixture
async def names(stack: ConnectionSettings) -> AsyncIterator[list[str]]:
    tag = uuid.uuid4().hex[:8]
    made = [f"test.bulkqueues.{tag}.p{i}" for i in range(QUEUES)]
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel()
        for name in made:
            await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            yield made
        finally:
            for name in made:
                await ch.queue_delete(name)


async def test_several_queues_as_one_intake(stack: ConnectionSettings, names: list[str]) -> None:
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel(publisher_confirms=True)
        for i in range(EACH):  # interleaved, as positions of many objects come
            for name in names:
                await ch.default_exchange.publish(aio_pika.Message(f"{name}|{i}".encode()), routing_key=name)
        declares = await c.channel()
        queues = [await declares.get_queue(name) for name in names]
        bulk = await open_bulk(stack["amqp"]["/"], 10)
        try:
            source = BulkQueues(queues, await bulk.channel(), lambda m: m.body.decode().split("|")[0])
            assert source.declaration_result.message_count == QUEUES * EACH
            intake = Intake.on(source, 150, 100)
            await intake.start()
            assert intake.backlog == QUEUES * EACH
            seen: dict[str, list[int]] = defaultdict(list)
            mixed = 0
            async with asyncio.timeout(DEADLINE_S):
                async for batch in intake.batches():
                    queues_in = {source.source_of(m) for m in batch}
                    mixed += len(queues_in) > 1
                    for m in batch:
                        name, n = m.body.decode().split("|")
                        seen[name].append(int(n))
                    await batch[-1].ack(multiple=True)  # settles every queue's share at once
                    if sum(map(len, seen.values())) == QUEUES * EACH:
                        break
            assert {n: seen[n] for n in names} == {n: list(range(EACH)) for n in names}  # each in order
            assert mixed, "no batch held more than one queue's messages"
            await intake.stop()
            for name in names:
                q = await declares.declare_queue(name, passive=True)
                assert q.declaration_result.consumer_count == 0  # every consumer cancelled
            async with asyncio.timeout(DEADLINE_S):  # and nothing left unacked: a new reader finds none
                for name in names:
                    q = await declares.get_queue(name)
                    assert await q.get(fail=False) is None
        finally:
            await bulk.close()
