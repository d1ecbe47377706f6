"""A tenant application's events over AMQP: its own durable queue in gf-fences,
`app.<tenant>.<app>.<name>` (what `geofence app add APP --tenant T` permits it to declare),
bound to fence.tenant-batches with its tenant (every fence event of the tenant, a message per
worker batch) and, with `proximity`, to fence.events `roam-events.<tenant>.#` (its proximity
events). Iterating gives each event typed, in the order of its message; a message is acked
once the loop has taken all its events, so an application that stops mid-message gets that
message again (drop what it already handled by `event_id`).

    async with EventStream(amqp_url, tenant="fleet", app="dispatch") as stream:
        async for event in stream:
            ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

from geofence_client.events import Event, parse

TENANT_BATCHES_EXCHANGE = "fence.tenant-batches"  # exchanges/topology.py (a unit test holds them equal)
EVENTS_EXCHANGE = "fence.events"
ROAM_EVENTS_PREFIX = "roam-events"


class EventStream:
    def __init__(self, amqp_url: str, tenant: str, app: str, name: str = "events", proximity: bool = True,
                 prefetch: int = 100) -> None:
        self.amqp_url, self.tenant, self.proximity, self.prefetch = amqp_url, tenant, proximity, prefetch
        self.queue_name = f"app.{tenant}.{app}.{name}"

    async def __aenter__(self) -> EventStream:
        self._conn: AbstractConnection = await aio_pika.connect_robust(self.amqp_url, timeout=10)
        try:
            self._channel: AbstractChannel = await self._conn.channel()
            await self._channel.set_qos(prefetch_count=self.prefetch)
            self._queue: AbstractQueue = await self._channel.declare_queue(self.queue_name, durable=True)
            await self._queue.bind(TENANT_BATCHES_EXCHANGE, self.tenant)
            if self.proximity:
                await self._queue.bind(EVENTS_EXCHANGE, f"{ROAM_EVENTS_PREFIX}.{self.tenant}.#")
        except BaseException:
            await self._conn.close()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._conn.close()

    async def __aiter__(self) -> AsyncIterator[Event]:
        async with self._queue.iterator() as messages:
            async for message in messages:
                async with message.process(requeue=True):
                    for event in parse(message.body):
                        yield event
