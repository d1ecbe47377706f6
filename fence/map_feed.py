"""The live map's feed in the API process: reads x-ingress's position samples (fence.map-positions)
and the workers' event samples (fence.map-events) through queues of its own, asks the workers
for their counts, keeps the map's state (fence/map_view.py) and sends every open map the same
frame twice a second over its websocket.

It costs nothing while no map is open: the queues exist only while a map is open (and
`LINGER_S` after the last one closed), so the broker copies nothing to it otherwise. The queues
are exclusive (they go with the connection) and the gf-map-taps policy keeps them short,
dropping the oldest (deploy/rabbitmq/definitions.py): the pipeline never waits for a map.

Both samples are taken at the source (ingress/map_tap.py; fence/x_fence/sidecar.py keeps its
newest events): however fast positions and events come, the feed gets a few messages a second,
and neither the broker nor this process carries the whole stream for a map.

Tenants: a map is its caller's (`MapClient.tenant`: the tenant whose objects, counts and events
it gets, names unqualified; None for an operator's map of every tenant). Each tick the one
frame is scoped once per distinct tenant with a map open (fence/map_view.py `scoped`) and
encoded once per tenant, whatever the number of its maps; snapshots are encoded once per
tenant per frame period likewise. A tenant with nothing new in a tick gets nothing but the
heartbeat.

One map, one `MapClient`: a mailbox of one frame. A frame the browser did not take before the
next one is dropped, and the map gets a snapshot when it is ready again (at most one per
`RESYNC_S`: a map too slow even for that gets the newest delta and misses some moves). So a map
gets at most 2 messages a second, and a slow one never holds the others up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import orjson
from aio_pika.abc import AbstractIncomingMessage

from exchanges import shell
from exchanges import topology as t
from exchanges.batch import PositionBatch, unpack
from exchanges.tenancy import name_of, qualify
from fence import store
from fence.manager import FenceManager, WorkerUnavailable
from fence.map_view import FRAME_EVERY_S, MapView, has_news, parse_events, scoped
from fence.service import feature

log = logging.getLogger("geofence")
COUNTS_EVERY_S = 2.0
HEARTBEAT_S = 5.0
LINGER_S = 30.0  # the feed keeps its queues this long after the last map closed
RESYNC_S = 5.0
PREFETCH = 32
MAX_FENCES_PAGE = 5_000


class ClientGone(Exception):
    """The feed closed: the map's websocket ends."""


class MapClient:
    def __init__(self, tenant: str | None = None) -> None:
        self.tenant = tenant  # whose map (None: an operator's, every tenant's)
        self._frame: bytes | None = None
        self._ready = asyncio.Event()
        self._ready.set()  # the first thing a map gets is a snapshot
        self.resync = True
        self.last_snapshot = float("-inf")
        self.sent = self.dropped = 0
        self.closed = False

    def offer(self, frame: bytes) -> None:
        if self._frame is not None:
            self.dropped += 1
            self.resync = True
        self._frame = frame
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def next(self, snapshot: Callable[[], bytes]) -> bytes:
        """The next message for this map: a snapshot after a drop, else the newest frame."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            if self.closed:
                raise ClientGone
            now = time.monotonic()
            if self.resync and now - self.last_snapshot >= RESYNC_S:
                self.resync, self._frame, self.last_snapshot = False, None, now
                self.sent += 1
                return snapshot()
            if self._frame is not None:
                frame, self._frame = self._frame, None
                self.sent += 1
                return frame


class MapFeed:
    def __init__(self, config: shell.SidecarConfig, manager: FenceManager, counters: shell.Counters,
                 view: MapView | None = None) -> None:
        self.config, self.manager, self.counters = config, manager, counters
        self.view = view if view is not None else MapView()  # an empty view is falsy (len 0)
        self.clients: set[MapClient] = set()
        self.process = f"{socket.gethostname()}-{os.getpid()}"
        self._wanted = asyncio.Event()
        self._worker_counts: dict[str, dict[str, int]] = {}
        self._snapshots: dict[str | None, tuple[float, bytes]] = {}  # per tenant (None: everyone's)
        self._last_sent: dict[str | None, float] = {}  # per tenant: the last message, for heartbeats
        self.live = False  # consuming now

    # -- maps ------------------------------------------------------------------------------

    def join(self, tenant: str | None = None) -> MapClient:
        """A new map of `tenant` (None: an operator's map of every tenant)."""
        client = MapClient(tenant)
        self.clients.add(client)
        self._wanted.set()
        self.counters.gauge("map_clients", len(self.clients))
        return client

    def leave(self, client: MapClient) -> None:
        self.clients.discard(client)
        self.counters.gauge("map_clients", len(self.clients))
        if not self.clients:
            self._wanted.clear()
        open_ = {c.tenant for c in self.clients}
        for gone in (self._snapshots.keys() | self._last_sent.keys()) - open_:  # no map of it left
            self._snapshots.pop(gone, None)
            self._last_sent.pop(gone, None)

    def snapshot(self, tenant: str | None = None) -> bytes:
        """The current snapshot of `tenant`'s map (None: every tenant's), encoded once per frame
        period per tenant whoever asks."""
        now = time.time()
        cached = self._snapshots.get(tenant)
        if cached is None or now - cached[0] >= FRAME_EVERY_S:
            snap = self.view.snapshot(now, tenant)
            if tenant is not None:
                snap = scoped(snap, tenant, snap["stats"])
            cached = self._snapshots[tenant] = (now, orjson.dumps(snap | {"live": self.live}))
        self.counters.bump("map_snapshots")
        return cached[1]

    async def fences(self, after: str = "", limit: int = MAX_FENCES_PAGE, tenant: str | None = None
                     ) -> dict[str, Any]:
        """Live fences, a page at a time (by id), as GeoJSON: `tenant`'s, ids as the tenant names
        them (`after` one of them); None: every tenant's, ids qualified so they stay unique
        (`after` qualified too), properties.tenant saying whose."""
        qualified_after = qualify(tenant, after) if tenant is not None and after else after
        async with self.manager.pool.acquire() as conn:
            records = await store.find_fences(conn, tenant, None, limit, qualified_after)
        features = [feature(r) for r in records]
        if tenant is None:
            for f, r in zip(features, records, strict=True):
                f["id"] = r.fence.fence_id
        out: dict[str, Any] = {"type": "FeatureCollection", "features": features}
        if len(records) == limit:
            last = records[-1].fence.fence_id
            out["next_after"] = last if tenant is None else name_of(last)
        return out

    # -- the feed --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume while maps are open; until `stop`."""
        backoff = shell.Backoff()
        while not stop.is_set():
            waiter = asyncio.ensure_future(self._wanted.wait())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                stopper.cancel()
            if stop.is_set():
                break
            try:
                await self._session(stop)
                backoff.reset()
            except* shell.BROKER_GONE as group:
                log.warning("map feed: broker away (%s); again", group.exceptions[0])
                self.counters.bump("map_feed_reconnects")
                self.live = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff.next())
            except* Exception as group:  # a bug in the feed: logged, the API goes on serving
                log.error("map feed failed; again", exc_info=group.exceptions[0])
                self.counters.bump("map_feed_failures")
                self.live = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff.next())
            self.live = False
        for client in list(self.clients):
            client.close()

    async def _session(self, stop: asyncio.Event) -> None:
        cfg = self.config
        async with contextlib.AsyncExitStack() as stack:
            ingress = await shell.open_connection(cfg, t.INGRESS_VHOST, stack)
            fences = await shell.open_connection(cfg, t.FENCES_VHOST, stack)
            pos_ch = await shell.open_channel(ingress, stack, prefetch=PREFETCH, confirms=False)
            ev_ch = await shell.open_channel(fences, stack, prefetch=PREFETCH, confirms=False)
            positions = await pos_ch.declare_queue(t.map_tap_queue(self.process, "positions"), exclusive=True)
            await positions.bind(t.MAP_POSITIONS_EXCHANGE)
            events = await ev_ch.declare_queue(t.map_tap_queue(self.process, "events"), exclusive=True)
            await events.bind(t.MAP_EVENTS_EXCHANGE)
            await positions.consume(self._on_sample)
            await events.consume(self._on_events)
            self.live = True
            log.info("map feed: consuming %s and %s for %d map(s)", positions.name, events.name,
                     len(self.clients))
            idle_since: float | None = None
            lost = asyncio.ensure_future(shell.connection_lost([ingress, fences]))
            stack.callback(_settle, lost)
            done = asyncio.Event()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(shell.periodic(done, COUNTS_EVERY_S, self._ask_counts))
                await self._ask_counts()
                while not stop.is_set() and not lost.done():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), FRAME_EVERY_S)
                    now = time.monotonic()
                    self.tick(time.time(), now)
                    if self.clients:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = now
                    elif now - idle_since >= LINGER_S:
                        break
                done.set()
                if lost.done():
                    lost.result()  # raises: the broker went away
            log.info("map feed: %s", "stopping" if stop.is_set() else "no map open: queues closed")

    def tick(self, wall: float, now: float) -> None:
        """One frame period: the view's frame, scoped and encoded once per tenant with a map open
        (the whole frame once for the operators' maps) and offered to its maps; a tenant with
        nothing new for HEARTBEAT_S gets a stats heartbeat (the map knows the feed is alive).
        `wall`: epoch seconds (the frame's time), `now`: monotonic seconds."""
        groups: dict[str | None, list[MapClient]] = {}
        for client in self.clients:
            groups.setdefault(client.tenant, []).append(client)
        frame = self.view.frame(wall)  # taken every tick, a map open or not: the moves drain
        tenants = [k for k in groups if k is not None]
        stats = self.view.tenant_stats(tenants) if tenants else {}
        for key, clients in groups.items():
            msg: dict[str, Any] | None = None
            if frame is not None:
                msg = frame if key is None else scoped(frame, key, stats[key])
                if key is not None and not has_news(msg):
                    msg = None
            if msg is None:
                if now - self._last_sent.setdefault(key, now) < HEARTBEAT_S:
                    continue
                msg = {"type": "stats", "t": wall, "live": True,
                       "stats": self.view.stats(wall) if key is None else stats[key]}
            self._send(clients, orjson.dumps(msg))
            self._last_sent[key] = now

    def _send(self, clients: list[MapClient], data: bytes) -> None:
        for client in clients:
            client.offer(data)
        self.counters.bump("map_frames")
        self.counters.bump("map_frame_bytes", len(data) * len(clients))

    async def _on_sample(self, message: AbstractIncomingMessage) -> None:
        async with message.process(requeue=False):
            try:
                msg = unpack(message.body)
                batch = PositionBatch.from_wire(msg["batch"])
                self.view.add_sample(batch.ids, batch.lon, batch.lat, batch.ts, int(msg["positions"]),
                                     time.time())
            except (ValueError, KeyError, TypeError) as exc:
                self._bad("position sample", exc)

    async def _on_events(self, message: AbstractIncomingMessage) -> None:
        async with message.process(requeue=False):
            try:
                msg = orjson.loads(message.body)
                events = parse_events(msg["events"])
                self.view.add_events(events, max(int(msg["seen"]), len(events)), time.time())
            except (ValueError, KeyError, TypeError) as exc:
                self._bad("event sample", exc)

    async def _ask_counts(self) -> None:
        async def one(worker: str) -> None:
            try:
                answer = await self.manager.ask_worker(worker, {"counts": True}, timeout=COUNTS_EVERY_S * 2)
                self._worker_counts[worker] = dict(answer.get("counts") or {})
            except WorkerUnavailable as exc:  # its last counts stay
                log.debug("map feed: %s", exc)
            except shell.BROKER_GONE as exc:  # the manager reconnects on its own; counts stay
                log.debug("map feed: counts of %s: %s", worker, exc)

        for gone in set(self._worker_counts) - set(self.manager.workers):  # a worker removed
            del self._worker_counts[gone]
        async with asyncio.TaskGroup() as tg:
            for w in self.manager.workers:
                tg.create_task(one(w))
        merged: dict[str, int] = {}
        for counts in self._worker_counts.values():  # a hot fence's masters each count theirs
            for f, k in counts.items():
                merged[f] = merged.get(f, 0) + k
        self.view.set_counts(merged)

    def _bad(self, what: str, exc: Exception) -> None:
        # these come from our own sidecars, not from users: a bad one is a bug, logged and
        # counted; the tap queue has no dead-letter exchange (samples are not kept)
        self.counters.bump("map_bad_messages")
        log.error("map feed: a %s it cannot read (%s)", what, str(exc)[:200])


def _settle(task: asyncio.Future[None]) -> None:
    """Cancel the watcher; if it had already ended, take its result (nobody else will)."""
    if task.done() and not task.cancelled():
        task.exception()
    task.cancel()
