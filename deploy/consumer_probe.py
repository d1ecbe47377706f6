"""Which queues have a consumer, as the broker counts them now: a passive declare per queue,
as the administrator, one connection per vhost (reopened when it fails).

Trade-off: a round trip per queue on each poll (about 30 queues, a few milliseconds), instead of
one management API call per vhost. The management API's consumer list is built from each node's
statistics; on RabbitMQ 3.10 in a cluster it missed every consumer whose channel was on node 1
for minutes (CI, `test_broker_cluster`: the sidecars on node 1 logged "consuming", the list had
only those on nodes 2 and 3). A passive declare answers from the queue itself (a quorum queue's
Raft state), so it cannot lag or lose a node's share.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import TracebackType

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection

from deploy.settings import Secrets, Settings, amqp_url

DECLARE_TIMEOUT_S = 5.0  # a quorum queue without a leader answers no declare


class ConsumerProbe:
    def __init__(self, settings: Settings, pw: Secrets) -> None:
        self.settings = settings
        self.pw = pw
        self._conns: dict[str, AbstractConnection] = {}
        self._channels: dict[str, AbstractChannel] = {}

    async def __aenter__(self) -> ConsumerProbe:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        for vhost in list(self._conns):
            await self._drop(vhost)

    async def _drop(self, vhost: str) -> None:
        self._channels.pop(vhost, None)
        conn = self._conns.pop(vhost, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _channel(self, vhost: str) -> AbstractChannel:
        ch = self._channels.get(vhost)
        if ch is not None and not ch.is_closed:
            return ch
        conn = self._conns.get(vhost)
        if conn is None or conn.is_closed:
            url = amqp_url(self.settings, self.pw.rabbitmq_password, vhost)
            conn = self._conns[vhost] = await aio_pika.connect(url, timeout=DECLARE_TIMEOUT_S)
        ch = self._channels[vhost] = await conn.channel()
        return ch

    async def consumers(self, vhost: str, queue: str) -> int | None:
        """The queue's consumers; None when there is no answer (the broker away, the queue
        missing or without a leader)."""
        try:
            ch = await self._channel(vhost)
            q = await asyncio.wait_for(ch.declare_queue(queue, passive=True), DECLARE_TIMEOUT_S)
            return int(q.declaration_result.consumer_count or 0)
        except (TimeoutError, aio_pika.exceptions.AMQPError, OSError):
            # a refused declare closes its channel; a timeout leaves a reply pending on it
            stale = self._channels.pop(vhost, None)
            if stale is not None:
                with contextlib.suppress(Exception):
                    await stale.close()
            conn = self._conns.get(vhost)
            if conn is None or conn.is_closed:
                await self._drop(vhost)
            return None

    async def unconsumed(self, queues: Sequence[tuple[str, str]]) -> list[str]:
        """`vhost/queue` of each queue with no consumer (or no answer)."""
        return [f"{v}/{q}" for v, q in queues if not await self.consumers(v, q)]
