"""What the routing roles read from PostgreSQL (asyncpg), and how they connect: the worldmap
(x-ingress), a region's fence bindings (x-geo's `recover`), the objects fences follow
(x-ingress taps their positions), the proximity subscriptions' changes (x-ingress routes by
them). The fence service writes these (fence/store.py, one
transaction per change); the roles only read, each retrying while PostgreSQL is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg
import numpy as np

from exchanges import ingress_partitions
from exchanges.backoff import Backoff
from exchanges.fence_binding import FenceBinding
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap

log = logging.getLogger("geofence")
T = TypeVar("T")


async def init_connection(conn: asyncpg.Connection) -> None:
    """jsonb in and out as Python objects (pass to asyncpg.connect / create_pool `init`)."""
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await init_connection(conn)
    return conn


async def read_until_stopped(dsn: str, read: Callable[[asyncpg.Connection], Awaitable[T | None]],
                             what: str, stop: asyncio.Event) -> T | None:
    """What `read` returns, retried with backoff while PostgreSQL is away or `read` finds
    nothing yet (None); None once `stop` is set. A sidecar starts with this."""
    backoff = Backoff()
    while not stop.is_set():
        try:
            conn = await connect(dsn)
            try:
                found = await read(conn)
            finally:
                await conn.close()
            if found is not None:
                return found
            log.warning("no %s stored yet", what)
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("cannot read the %s: %s", what, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())
    return None


# PostgreSQL away, not refusing: the network or the server gone (OSError, class 08), a connection
# asyncpg closed (InterfaceError), the server shutting down or starting (class 57: admin or crash
# shutdown, "cannot connect now"). What meets one is retried or answered 503, never dead-lettered.
STORE_AWAY: tuple[type[BaseException], ...] = (
    OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError)


class StoreConnection:
    """A sidecar's own PostgreSQL connection, made again when lost. `run(work, what)` is
    `work(conn)`, retried with backoff while PostgreSQL is away (a connection lost, or one a
    cancelled caller left inside a transaction: InterfaceError, or in a state asyncpg no longer
    follows: InternalClientError); the batch that needs it stays unacked meanwhile. It raises
    only once `stop` (set by the session) is set.

    One connection does one thing at a time: callers of `run` from concurrent tasks (the
    venue sidecar's notifier and its sensor watch share one) take turns. Without the turn,
    asyncpg saw two operations on one connection and, once, lost track of its protocol state
    (InternalClientError), which ended the sidecar in the middle of a demo."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None
        self.stop = asyncio.Event()
        self.turn = asyncio.Lock()

    async def connection(self) -> asyncpg.Connection:
        if self.conn is None or self.conn.is_closed():
            self.conn = await connect(self.dsn)
        return self.conn

    async def run(self, work: Callable[[asyncpg.Connection], Awaitable[T]], what: str) -> T:
        backoff = Backoff()
        while True:
            try:
                async with self.turn:
                    return await work(await self.connection())
            except (*STORE_AWAY, asyncpg.exceptions.InternalClientError) as exc:
                await self.close()
                if self.stop.is_set():
                    raise
                delay = backoff.next()
                log.warning("cannot %s (%s); retrying in %.1fs", what, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), delay)

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
        self.conn = None


def binding_of(row: asyncpg.Record) -> FenceBinding:
    cross = None
    if row.get("detect_cross"):  # (rows of fence_range alone have no flag: None)
        cross = (float(row["min_lon"]), float(row["min_lat"]), float(row["max_lon"]), float(row["max_lat"]))
    return FenceBinding(row["fence_id"], int(row["version"]),
                        np.frombuffer(row["ranges"], "<u8").astype(np.uint64).reshape(-1, 2),
                        np.frombuffer(row["interior"], np.uint8).astype(bool), cross)


# a binding and, for a fence that detects CROSS, its bounding box (x-geo tests segments on it)
_BINDING = """SELECT r.fence_id, r.version, r.ranges, r.interior,
                     coalesce((f.options->>'cross')::boolean, false) AS detect_cross,
                     f.min_lon, f.min_lat, f.max_lon, f.max_lat
              FROM fence_range r LEFT JOIN fence f ON f.id = r.fence_id"""


async def followed_objects(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch("SELECT DISTINCT follow_object FROM fence WHERE deleted_at IS NULL "
                            "AND follow_object IS NOT NULL")
    return {r["follow_object"] for r in rows}


async def region_bindings(conn: asyncpg.Connection, region: str) -> list[FenceBinding]:
    """What x-geo `region` must have bound (its `recover` source)."""
    rows = await conn.fetch(f"{_BINDING} WHERE r.region = $1 ORDER BY r.fence_id", region)
    return [binding_of(r) for r in rows]


async def region_binding(conn: asyncpg.Connection, region: str, fence_id: str) -> FenceBinding | None:
    row = await conn.fetchrow(f"{_BINDING} WHERE r.region = $1 AND r.fence_id = $2", region, fence_id)
    return None if row is None else binding_of(row)


async def latest_worldmap(conn: asyncpg.Connection) -> Worldmap | None:
    row = await conn.fetchrow("SELECT body FROM worldmap ORDER BY version DESC LIMIT 1")
    return None if row is None else Worldmap.from_json(row["body"])


async def read_worldmap(dsn: str) -> Worldmap | None:
    """The worldmap in force, on a connection of its own (tools, tests, benchmarks)."""
    conn = await connect(dsn)
    try:
        return await latest_worldmap(conn)
    finally:
        await conn.close()


async def latest_worldmap_version(conn: asyncpg.Connection) -> int:
    v = await conn.fetchval("SELECT max(version) FROM worldmap")
    return int(v or 0)


async def record_worldmap_seen(conn: asyncpg.Connection, instance: str, version: int,
                               paused_for: str | None = None, partitions_version: int = 0) -> None:
    """An x-ingress routes with worldmap `version` now (and has stopped consuming for the
    pause `paused_for`), and consumes by partition map `partitions_version`."""
    await conn.execute("INSERT INTO worldmap_seen (instance, version, paused_for, partitions_version) "
                       "VALUES ($1, $2, $3, $4) ON CONFLICT (instance) DO UPDATE SET "
                       "version = EXCLUDED.version, paused_for = EXCLUDED.paused_for, "
                       "partitions_version = EXCLUDED.partitions_version, seen_at = now()",
                       instance, version, paused_for, partitions_version)


async def latest_assignment(conn: asyncpg.Connection) -> tuple[int, dict[int, str]] | None:
    """The newest partition map of the x-ingress instances (None: none stored, the first
    instance consumes every partition)."""
    row = await conn.fetchrow("SELECT version, owners FROM ingress_assignment ORDER BY version DESC LIMIT 1")
    if row is None:
        return None
    owners = row["owners"] if isinstance(row["owners"], dict) else json.loads(row["owners"])
    return int(row["version"]), {int(p): str(n) for p, n in owners.items()}


async def assignment_or_first(conn: asyncpg.Connection) -> tuple[int, dict[int, str]]:
    """The stored partition map, else version 0: the first instance owns every partition."""
    found = await latest_assignment(conn)
    return found if found is not None else (0, ingress_partitions.first_only())


async def store_assignment(conn: asyncpg.Connection, owners: dict[int, str]) -> int:
    """A new partition map, its version the next one."""
    async with conn.transaction():
        await conn.execute("LOCK TABLE ingress_assignment IN EXCLUSIVE MODE")
        version = int(await conn.fetchval("SELECT coalesce(max(version), 0) + 1 FROM ingress_assignment"))
        await conn.execute("INSERT INTO ingress_assignment (version, owners) VALUES ($1, $2::text::jsonb)",
                           version, json.dumps({str(p): n for p, n in sorted(owners.items())}))
    return version


async def subscribed_tenants(conn: asyncpg.Connection) -> frozenset[str]:
    """The tenants with a proximity subscription (their positions go to the proximity router)."""
    rows = await conn.fetch("SELECT DISTINCT tenant FROM roam_subscription")
    return frozenset(str(r["tenant"]) for r in rows)


async def ingress_pause(conn: asyncpg.Connection) -> str | None:
    """The token of the pause x-ingress is to honour (a worker handover drains the
    pipeline; a lease), or None."""
    token = await conn.fetchval("SELECT token FROM ingress_pause WHERE until > now()")
    return None if token is None else str(token)


async def region_endpoints(conn: asyncpg.Connection) -> dict[str, tuple[str, int]]:
    """The regions whose vhost is on another RabbitMQ than the pipeline's own: (host, port)."""
    return {r["region"]: (str(r["host"]), int(r["port"]))
            for r in await conn.fetch("SELECT region, host, port FROM region_broker")}


async def latest_ring(conn: asyncpg.Connection) -> tuple[int, HashRing] | None:
    """The newest stored worker ring and its version (None: none stored, GEOFENCE_WORKERS hold)."""
    row = await conn.fetchrow("SELECT version, body FROM worker_ring ORDER BY version DESC LIMIT 1")
    return None if row is None else (int(row["version"]), HashRing.from_dict(row["body"]))


async def ring_or(conn: asyncpg.Connection, workers: Sequence[str]) -> tuple[int, HashRing]:
    """The stored ring, else version 0: `workers` with weight 1 each."""
    found = await latest_ring(conn)
    return found if found is not None else (0, HashRing(list(workers)))


ROAM_CHANGE_LOCK = 0x67665F726F616D  # pg_advisory_xact_lock key of roam_change writers ("gf_roam")


async def roam_changes(conn: asyncpg.Connection, after: int, limit: int = 1000
                       ) -> list[tuple[int, str, dict[str, object] | None, float]]:
    """Proximity subscription changes after seq `after`, in order: (seq, id, definition or
    None for a delete, time of the change)."""
    rows = await conn.fetch("SELECT seq, subscription_id, definition, extract(epoch FROM at) AS at "
                            "FROM roam_change WHERE seq > $1 ORDER BY seq LIMIT $2", after, limit)
    return [(int(r["seq"]), str(r["subscription_id"]), r["definition"], float(r["at"])) for r in rows]
