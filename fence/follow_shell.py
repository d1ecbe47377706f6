"""The follower: positions of followed objects (queue fence.follow, tapped by x-ingress) in,
fence moves out through the FenceManager (store, binding diffs, fence_changed events).

The core (fence/follow.py) decides which fence moves when; this shell refreshes the list
of following fences from the store every REFRESH_S (a fence put into follow mode through
the API is picked up at once: the API calls `refresh` itself), applies moves with at most
MOVE_CONCURRENCY in flight, and acks a batch once its moves are stored and sent. A move
waiting for its interval is held in memory only: lost with the process, the fence then waits
for its object's next position (a following fence is a "latest position" thing).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import shapely
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from exchanges import routing_store, shell
from exchanges import topology as t
from exchanges.batch import PositionBatch, unpack
from exchanges.contract import BAD_INPUT, InvalidMessage
from exchanges.fence_def import InvalidFence
from fence import store
from fence.follow import FollowCore, Move, circle
from fence.manager import FenceManager
from fence.spec import FenceSpec

log = logging.getLogger("geofence")
REFRESH_S = 2.0
DUE_EVERY_S = 0.1
MOVE_CONCURRENCY = 8
FOLLOW = "follow"


class Follower:
    def __init__(self, manager: FenceManager, counters: shell.Counters) -> None:
        self.manager, self.counters = manager, counters
        self.core = FollowCore()
        self.records: dict[str, store.FenceRecord] = {}
        self._slots = asyncio.Semaphore(MOVE_CONCURRENCY)

    def bind(self, dlx: AbstractExchange) -> None:
        self.dlx = dlx

    async def refresh(self) -> None:
        try:
            async with self.manager.pool.acquire() as conn:
                records = await store.following(conn)
        except routing_store.STORE_AWAY as exc:  # the fences it follows stay as they were read last
            self.counters.bump("follow_refresh_failures")
            log.warning("cannot read the following fences (PostgreSQL away: %s: %s)", type(exc).__name__, exc)
            return
        self.records = {r.fence.fence_id: r for r in records}
        rows = []
        for r in records:
            assert r.follow is not None
            c = shapely.centroid(r.fence.geometry)
            rows.append((r.fence.fence_id, r.follow.object_id, r.follow.radius_m,
                         (float(c.x), float(c.y)) if r.follow_ts is not None else None, r.follow_ts))
        self.core.set_fences(rows)

    async def handle(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        outs, moves = [], []
        now = time.monotonic()
        for m in messages:
            try:
                msg = unpack(m.body)
                if msg["kind"] != FOLLOW:
                    raise InvalidMessage(f"unknown message kind {msg['kind']!r} on {t.FOLLOW_QUEUE}")
                b = PositionBatch.from_wire(msg["batch"])
            except BAD_INPUT as exc:
                outs.append(shell.dead_letter(self.dlx, m, shell.reason_of(exc, "follow batch"),
                                              t.FOLLOW_QUEUE, self.counters))
                continue
            self.counters.positions += len(b)
            for i, oid in enumerate(b.ids):
                moves += self.core.observe(oid, float(b.lon[i]), float(b.lat[i]), float(b.ts[i]), now)
        await self.apply(moves)
        await shell.publish_all(outs, self.counters)

    async def due(self) -> None:
        await self.apply(self.core.due(time.monotonic()))

    async def apply(self, moves: list[Move]) -> None:
        if moves:
            await asyncio.gather(*(self._move(m) for m in moves))

    async def _move(self, move: Move) -> None:
        record = self.records.get(move.fence_id)
        if record is None or record.follow is None:
            return
        f = record.fence
        try:
            geometry = circle(move.lon, move.lat, record.follow.radius_m)
        except InvalidFence as exc:
            self.counters.bump("follow_refused")
            log.warning("fence %s cannot follow %s to (%s, %s): %s", f.fence_id, move.object_id, move.lon,
                        move.lat, exc)
            return
        spec = FenceSpec.of(f, record.owner, record.follow, geometry=geometry)
        async with self._slots:
            try:
                await self.manager.put(spec, create=False, owner=record.owner, follow_ts=move.ts)
                self.counters.bump("follow_moves")
            except store.StaleMove:
                self.counters.bump("follow_stale")
            except routing_store.STORE_AWAY as exc:  # tried again at the next `due`
                self.counters.bump("follow_store_away")
                self.core.failed(move)
                log.warning("fence %s cannot follow %s now (PostgreSQL away: %s: %s)", f.fence_id,
                            move.object_id, type(exc).__name__, exc)
            except (store.UnknownFence, store.NotOwner):
                self.core.forget(f.fence_id)  # deleted (or re-created) meanwhile
                self.records.pop(f.fence_id, None)
