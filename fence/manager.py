"""Fence changes, end to end: validate, cover, store (one transaction), tell every x-geo.

The covering (Hilbert ranges of a fence, per region) and the diffs sent to the regions are CPU
work, up to a second for a wide fence: they run on the manager's own small thread pool
(COVER_THREADS), never in the event loop, so a request covering a big fence does not stall the
API's other requests, and coverings queue there rather than take every thread (the token
checks use the loop's default pool). The C kernel and shapely release the GIL.

Used by `geofence fence`, the HTTP and AMQP fence API and the follower. The store is written
first and the control messages are sent after the commit, confirmed: see fence/store.py for
what a crash in between means. A change reaches the regions the fence touched or touches, as
a diff where a region keeps it (see exchanges/control.py); a delete reaches every region.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import asyncpg
import orjson
from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage

from exchanges import binding_diff, control, routing_store, shell
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, pack
from exchanges.fence_binding import FenceBinding
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap
from fence import store
from fence.spec import Bindings, FenceSpec, bindings


@dataclass(frozen=True)
class Change:
    fence_id: str
    version: int
    regions: tuple[str, ...]
    ranges: int
    bits: int
    worker: str
    sent_ranges: int = 0  # ranges on the wire to x-geo (a diff sends only what changed)
    record: store.FenceRecord | None = None

    def line(self) -> str:
        where = ", ".join(self.regions) if self.regions else "no region"
        return (f"fence {self.fence_id} version {self.version}: {self.ranges} ranges at {self.bits} bits "
                f"in {where}; worker {self.worker}")


REGIONS_POLL_S = 1.0
log = logging.getLogger("geofence")
DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"  # RabbitMQ's pseudo-queue: it exists (passive declare)
POOL_SIZE = 4
COVER_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))


class FenceManager:
    """Holds a PostgreSQL pool and one AMQP connection per region vhost plus one to gf-fences
    (x-fence's control queues: occupants). Safe for concurrent use by the API's requests."""

    def __init__(self, amqp_url: str, postgres_url: str, regions: tuple[str, ...],
                 workers: tuple[str, ...], follow_worldmap: bool = True) -> None:
        self.amqp_url, self.postgres_url = amqp_url, postgres_url
        self.regions, self.workers, self.ring = regions, workers, HashRing(list(workers))
        self.ring_version = 0  # the stored ring replaces the one of `workers` on entering
        self.counters = shell.Counters()
        self._stack = contextlib.AsyncExitStack()
        self._control: dict[str, AbstractExchange] = {}
        self._waiting: dict[str, asyncio.Future[bytes]] = {}
        self._worldmap: Worldmap | None = None
        self._conns: dict[str, AbstractConnection] = {}
        self._endpoints: dict[str, tuple[str, int]] = {}
        self._regions_lock = asyncio.Lock()
        self._cpu = ThreadPoolExecutor(COVER_THREADS, thread_name_prefix="covering")
        self._stack.callback(self._cpu.shutdown, wait=False, cancel_futures=True)
        # False: the regions given stay (`geofence region`, which changes the worldmap itself)
        self.follow_worldmap = follow_worldmap

    async def __aenter__(self) -> FenceManager:
        try:
            self.pool: asyncpg.Pool = await asyncpg.create_pool(
                self.postgres_url, min_size=1, max_size=POOL_SIZE, init=routing_store.init_connection)
            self._stack.push_async_callback(self.pool.close)
            async with self.pool.acquire() as conn:  # the stored worker ring, if any
                self.ring_version, self.ring = await routing_store.ring_or(conn, self.workers)
                self._endpoints = await routing_store.region_endpoints(conn)  # regions on other brokers
            self.workers = self.ring.nodes
            for vhost in (*(t.region_vhost(r) for r in self.regions), t.FENCES_VHOST):
                await self._open(vhost)
            if self.follow_worldmap:
                watcher = asyncio.create_task(self._watch_regions(), name="fence-manager-regions")
                self._stack.push_async_callback(_cancel, watcher)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _open(self, vhost: str) -> None:
        # robust: a long-lived API process outlives broker restarts (channels and the
        # reply consumer come back by themselves)
        endpoint = self._endpoints.get(vhost.removeprefix(t.REGION_VHOST_PREFIX)) \
            if vhost.startswith(t.REGION_VHOST_PREFIX) else None
        conn: AbstractConnection = await aio_pika.connect_robust(_vhost_url(self.amqp_url, vhost, endpoint),
                                                                 timeout=10)
        self._conns[vhost] = conn
        self._stack.push_async_callback(_close_quietly, conn)
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        # declared (passively), not just named (get_queue(ensure=False)): only a declared
        # queue is restored with its consumer when the robust channel reopens. Without
        # the direct reply-to consumer every inspect request after a broker restart
        # closed the channel (PRECONDITION_FAILED "fast reply consumer does not exist").
        replies = await ch.declare_queue(DIRECT_REPLY_TO, passive=True)
        await replies.consume(self._on_reply, no_ack=True)
        if vhost == t.FENCES_VHOST:
            self._fence_control = await ch.get_exchange(t.FENCE_CONTROL_EXCHANGE, ensure=False)
        else:
            region = vhost.removeprefix(t.REGION_VHOST_PREFIX)
            self._control[region] = await ch.get_exchange(t.GEO_CONTROL_EXCHANGE, ensure=False)

    async def _watch_regions(self) -> None:
        """Follow the worldmap's regions between changes too (a long-lived API process lets
        go of a removed region before its vhost is deleted), and the stored worker ring
        (`geofence worker add / remove`: which worker has a fence)."""
        while True:
            await asyncio.sleep(REGIONS_POLL_S)
            try:
                async with self.pool.acquire() as conn:
                    version = await routing_store.latest_worldmap_version(conn)
                    if self._worldmap is None or self._worldmap.version != version:
                        self._worldmap = await routing_store.latest_worldmap(conn)
                    ring = await routing_store.latest_ring(conn)
                if ring is not None and ring[0] != self.ring_version:
                    self.ring_version, self.ring = ring
                    self.workers = self.ring.nodes
                if self._worldmap is not None:
                    await self.follow_regions(self._worldmap.regions)
            except (OSError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError) as exc:
                log.warning("cannot follow the worldmap's regions: %s", exc)

    async def follow_regions(self, regions: tuple[str, ...]) -> None:
        """Regions come and go live (`geofence region add / remove`): reach every region of
        the worldmap in force, and let go of one it no longer names (its vhost goes next)."""
        if set(regions) == set(self._control):
            return
        async with self._regions_lock:
            async with self.pool.acquire() as conn:  # where a new region's vhost is
                self._endpoints = await routing_store.region_endpoints(conn)
            for region in regions:
                if region not in self._control:
                    await self._open(t.region_vhost(region))
            if self.follow_worldmap:
                for region in set(self._control) - set(regions):
                    del self._control[region]
                    await _close_quietly(self._conns.pop(t.region_vhost(region)))
            self.regions = tuple(self._control)

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        waiter = self._waiting.pop(message.correlation_id or "", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(message.body)

    async def _ask(self, exchange: AbstractExchange, routing_key: str, request: dict[str, Any],
                   kind: str = control.INSPECT) -> asyncio.Future[bytes]:
        cid = uuid.uuid4().hex
        self._waiting[cid] = fut = asyncio.get_running_loop().create_future()
        try:
            message = aio_pika.Message(pack(kind, **request), content_type=CONTENT_TYPE,
                                       reply_to=DIRECT_REPLY_TO, correlation_id=cid)
            await exchange.publish(message, routing_key)
        except BaseException:
            self._waiting.pop(cid, None)
            raise
        return fut

    async def applied(self, timeout: float = 30.0) -> None:
        """Returns once every x-geo has applied every change sent before: each one answers a
        request queued behind them on its control queue. Positions routed after that reach
        x-fence behind the fences' definitions (same federated path)."""
        waiters = [await self._ask(ex, "", {"limit": 0}) for ex in self._control.values()]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*waiters)
        finally:
            for w in waiters:
                w.cancel()

    async def ask_regions(self, kind: str, request: dict[str, Any], timeout: float = 10.0
                          ) -> dict[str, dict[str, Any]]:
        """Every region's x-geo's answer to a request of `kind` (a spatial query)."""
        waiters = {r: await self._ask(ex, "", request, kind) for r, ex in self._control.items()}
        try:
            async with asyncio.timeout(timeout):
                answers = await asyncio.gather(*waiters.values())
        except TimeoutError:
            late = [r for r, w in waiters.items() if not w.done()]
            raise WorkerUnavailable(f"x-geo {', '.join(late)} did not answer within {timeout:g}s") from None
        finally:
            for w in waiters.values():
                w.cancel()
        return {r: orjson.loads(a) for r, a in zip(waiters, answers, strict=True)}

    async def ask_worker(self, worker: str, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """One x-fence worker's answer to an inspect request (occupants, an object's fences)."""
        fut = await self._ask(self._fence_control, worker, request)
        try:
            async with asyncio.timeout(timeout):
                answer: dict[str, Any] = orjson.loads(await fut)
                return answer
        except TimeoutError:
            raise WorkerUnavailable(f"x-fence worker {worker} did not answer within {timeout:g}s") from None
        finally:
            fut.cancel()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def put(self, spec: FenceSpec, expected_version: int | None = None,
                  create: bool | None = None, owner: str | None = None,
                  follow_ts: float | None = None, quota_of: str | None = None) -> Change:
        """Create or replace a fence (create=True: must be new; False: must exist); `owner`
        refuses another user's fence, `follow_ts` a follow move older than the fence's,
        `quota_of` a change past that tenant's quotas (fence/quotas.py)."""
        async with self.pool.acquire() as conn:
            for attempt in range(3):  # a worldmap change (nightly re-split) in between: cut again
                version = await routing_store.latest_worldmap_version(conn)
                if self._worldmap is None or self._worldmap.version != version:
                    self._worldmap = await routing_store.latest_worldmap(conn)  # parsed once per version
                wm = self._worldmap
                if wm is None:
                    raise RuntimeError("no worldmap stored: run `geofence up`")
                await self.follow_regions(wm.regions)
                b = await asyncio.get_running_loop().run_in_executor(self._cpu, _cover, spec, wm)
                try:
                    saved = await store.save_fence(conn, spec, b, expected_version, create, owner,
                                                   follow_ts, worldmap_version=wm.version, quota_of=quota_of)
                    break
                except store.WorldmapChanged:
                    if attempt == 2:
                        raise
        record = saved.record
        # the regions the fence touched or touches: each gets the change and forwards it
        told = [r for r in self.regions if saved.previous.get(r) is not None or r in b.per_region]
        assert set(b.per_region) <= set(told), "a region of the worldmap without a connection"
        bodies, sent = await asyncio.get_running_loop().run_in_executor(
            self._cpu, _region_bodies, record, b, saved.previous, told)
        outs = [shell.Out(self._control[region], "", body, CONTENT_TYPE) for region, body in bodies]
        await shell.publish_all(outs, self.counters)
        return Change(spec.fence_id, record.fence.version, tuple(sorted(b.per_region)), b.ranges, b.bits,
                      self.ring.node_for(spec.fence_id), sent, record)

    async def rebind(self, fence_id: str, version: int, bits: int,
                     per_region: dict[str, tuple[Any, Any] | None]) -> bool:
        """Set what some regions bind of an unchanged fence (the nightly rebuild's repairs and
        re-splits): stored, then a whole "define" to each of those regions, as `put` sends.
        False when the fence changed since `version` (nothing done: that change's bindings
        stand)."""
        return (await self.rebind_many([(fence_id, version, bits, per_region)]))[0]

    async def rebind_many(self, items: Sequence[tuple[str, int, int, dict[str, tuple[Any, Any] | None]]]
                          ) -> list[bool]:
        """`rebind` for many fences: stored in one transaction (each fence under its own
        version guard), then every define sent and confirmed at once (a live region change
        moves thousands of fences)."""
        async with self.pool.acquire() as conn, conn.transaction():
            records = [await store.replace_region_bindings(conn, fid, version, bits, per_region)
                       for fid, version, bits, per_region in items]
        await self.follow_regions(tuple({*self._control, *(r for item in items for r in item[3])}))
        outs = []
        for (_, _, bits, per_region), record in zip(items, records, strict=True):
            if record is None:
                continue
            ts = record.updated_at.timestamp()  # the fence's own change time: x-fence sees no change
            told = sorted(per_region)
            outs += [shell.Out(self._control[region], "", control.define_for_region(
                        record.fence, ts, bits, *(b or (_EMPTY_RANGES, _EMPTY_FLAGS)), regions=told),
                        CONTENT_TYPE) for region, b in sorted(per_region.items())]
        await shell.publish_all(outs, self.counters)
        return [r is not None for r in records]

    async def remove(self, fence_id: str, expected_version: int | None = None,
                     owner: str | None = None) -> Change:
        async with self.pool.acquire() as conn:
            wm = await routing_store.latest_worldmap(conn)
            version, when = await store.delete_fence(conn, fence_id, expected_version, owner)
        if wm is not None:
            await self.follow_regions(wm.regions)
        drop = control.drop_message(control.Drop(fence_id, version, when.timestamp()))
        outs = [shell.Out(x, "", drop, CONTENT_TYPE) for x in self._control.values()]
        await shell.publish_all(outs, self.counters)
        return Change(fence_id, version, (), 0, 0, self.ring.node_for(fence_id))


def _cover(spec: FenceSpec, wm: Worldmap) -> Bindings:
    return bindings(spec.cover_geometry(), wm)


def _region_bodies(record: store.FenceRecord, b: Bindings, previous: dict[str, FenceBinding],
                   told: list[str]) -> tuple[list[tuple[str, bytes]], int]:
    """Each told region's control message (a diff where the region keeps the fence and the diff
    is smaller, else the whole covering, or an empty one where it no longer binds it), and the
    ranges on the wire."""
    ts = record.updated_at.timestamp()
    bodies, sent = [], 0
    for region in told:
        old, new = previous.get(region), b.per_region.get(region)
        d = None if new is None or old is None else binding_diff.diff(old.ranges, old.interior, *new)
        if d is not None and old is not None and new is not None and d.size < len(new[0]):  # smaller
            body = control.rebind_for_region(record.fence, ts, b.bits, old.version, d, told)
            sent += d.size
        elif new is not None:  # new in the region, or a diff no smaller than the covering
            body = control.define_for_region(record.fence, ts, b.bits, *new, regions=told)
            sent += len(new[0])
        else:
            body = control.define_for_region(record.fence, ts, b.bits, _EMPTY_RANGES, _EMPTY_FLAGS,
                                             regions=told)
        bodies.append((region, body))
    return bodies, sent


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _close_quietly(conn: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 5)


class WorkerUnavailable(RuntimeError):
    pass


def _vhost_url(url: str, vhost: str, endpoint: tuple[str, int] | None = None) -> str:
    parts = urlsplit(url)
    if endpoint is not None:  # the vhost is on another broker (same user)
        userinfo = parts.netloc.rpartition("@")[0]
        parts = parts._replace(netloc=f"{userinfo}@{endpoint[0]}:{endpoint[1]}")
    return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))


def _empty() -> tuple[Any, Any]:
    import numpy as np

    return np.empty((0, 2), np.uint64), np.empty(0, bool)


_EMPTY_RANGES, _EMPTY_FLAGS = _empty()
