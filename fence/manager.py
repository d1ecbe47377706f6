"""Fence changes, end to end: validate, cover, store (one transaction), tell every x-geo.

Used by `geofence fence` now and by the HTTP / AMQP fence API later. The store is written
first and the control messages are sent after the commit, confirmed: see fence/store.py for
what a crash in between means. Every region gets every change (see fence/control.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import asyncpg
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage

from exchanges import shell
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, pack
from fence import control, store
from fence.hash_ring import HashRing
from fence.spec import FenceSpec, bindings


@dataclass(frozen=True)
class Change:
    fence_id: str
    version: int
    regions: tuple[str, ...]
    ranges: int
    bits: int
    worker: str

    def line(self) -> str:
        where = ", ".join(self.regions) if self.regions else "no region"
        return (f"fence {self.fence_id} version {self.version}: {self.ranges} ranges at {self.bits} bits "
                f"in {where}; worker {self.worker}")


DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"  # RabbitMQ's pseudo-queue: no queue to declare


class FenceManager:
    """Holds a PostgreSQL connection and one AMQP connection per region vhost."""

    def __init__(self, amqp_url: str, postgres_url: str, regions: tuple[str, ...],
                 workers: tuple[str, ...]) -> None:
        self.amqp_url, self.postgres_url = amqp_url, postgres_url
        self.regions, self.ring = regions, HashRing(list(workers))
        self.counters = shell.Counters()
        self._stack = contextlib.AsyncExitStack()
        self._control: dict[str, AbstractExchange] = {}
        self._waiting: dict[str, asyncio.Future[bytes]] = {}

    async def __aenter__(self) -> FenceManager:
        self.pg: asyncpg.Connection = await store.connect(self.postgres_url)
        self._stack.push_async_callback(self.pg.close)
        for region in self.regions:
            url = _vhost_url(self.amqp_url, t.region_vhost(region))
            conn: AbstractConnection = await aio_pika.connect(url, timeout=10)
            self._stack.push_async_callback(conn.close)
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            self._control[region] = await ch.get_exchange(t.GEO_CONTROL_EXCHANGE, ensure=False)
            replies = await ch.get_queue(DIRECT_REPLY_TO, ensure=False)
            await replies.consume(self._on_reply, no_ack=True)
        return self

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        waiter = self._waiting.pop(message.correlation_id or "", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message.body)

    async def applied(self, timeout: float = 30.0) -> None:
        """Returns once every x-geo has applied every change sent before: each one answers a
        request queued behind them on its control queue. Positions routed after that reach
        x-fence behind the fences' definitions (same federated path)."""
        loop = asyncio.get_running_loop()
        waiters = []
        for region, exchange in self._control.items():
            cid = f"{region}-{uuid.uuid4().hex}"
            self._waiting[cid] = fut = loop.create_future()
            waiters.append(fut)
            await exchange.publish(aio_pika.Message(pack(control.INSPECT, limit=0), content_type=CONTENT_TYPE,
                                                    reply_to=DIRECT_REPLY_TO, correlation_id=cid), "")
        async with asyncio.timeout(timeout):
            await asyncio.gather(*waiters)

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def put(self, spec: FenceSpec, expected_version: int | None = None,
                  create: bool | None = None) -> Change:
        """Create or replace a fence (create=True: must be new; False: must exist)."""
        wm = await store.latest_worldmap(self.pg)
        if wm is None:
            raise RuntimeError("no worldmap stored: run `geofence up`")
        b = bindings(spec.geometry, wm)
        record = await store.save_fence(self.pg, spec, b, expected_version, create)
        ts = record.updated_at.timestamp()
        empty = (_EMPTY_RANGES, _EMPTY_FLAGS)
        outs = [shell.Out(self._control[region], "", control.define_for_region(
                    record.fence, ts, b.bits, *b.per_region.get(region, empty)), CONTENT_TYPE)
                for region in self.regions]
        await shell.publish_all(outs, self.counters)
        return Change(spec.fence_id, record.fence.version, tuple(sorted(b.per_region)), b.ranges, b.bits,
                      self.ring.node_for(spec.fence_id))

    async def remove(self, fence_id: str, expected_version: int | None = None) -> Change:
        version, when = await store.delete_fence(self.pg, fence_id, expected_version)
        drop = control.drop_message(control.Drop(fence_id, version, when.timestamp()))
        outs = [shell.Out(self._control[r], "", drop, CONTENT_TYPE) for r in self.regions]
        await shell.publish_all(outs, self.counters)
        return Change(fence_id, version, (), 0, 0, self.ring.node_for(fence_id))


def _vhost_url(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


def _empty() -> tuple[Any, Any]:
    import numpy as np

    return np.empty((0, 2), np.uint64), np.empty(0, bool)


_EMPTY_RANGES, _EMPTY_FLAGS = _empty()
