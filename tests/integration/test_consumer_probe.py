"""deploy/consumer_probe.ConsumerProbe against the real RabbitMQ: `geofence up`'s readiness check
counts a queue's consumers by a passive declare (the management API's lists missed node 1's
consumers for minutes in a cluster): no consumer, then one, then none; a missing queue has no
answer and does not break the next one's."""

from __future__ import annotations

import uuid

import aio_pika

from deploy.consumer_probe import ConsumerProbe
from deploy.settings import ConnectionSettings, Settings, load_secrets


async def test_consumers_counted_by_the_queue_itself(stack: ConnectionSettings) -> None:
    settings = Settings.from_env()
    name = f"test.probe.{uuid.uuid4().hex[:8]}"
    missing = f"test.probe.missing.{uuid.uuid4().hex[:8]}"
    async with await aio_pika.connect(stack["amqp"]["/"]) as c:
        ch = await c.channel()
        queue = await ch.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            async with ConsumerProbe(settings, load_secrets(settings)) as probe:
                assert await probe.consumers("/", name) == 0
                assert await probe.unconsumed([("/", name)]) == [f"//{name}"]
                tag = await queue.consume(lambda m: m.ack())
                assert await probe.consumers("/", name) == 1
                assert await probe.consumers("/", missing) is None  # refused: its channel closed
                assert await probe.unconsumed([("/", missing), ("/", name)]) == [f"//{missing}"]
                await queue.cancel(tag)
                assert await probe.consumers("/", name) == 0
        finally:
            await ch.queue_delete(name)
