"""The durable source of fences, bindings and the worldmap: PostgreSQL (asyncpg).

Tables come from deploy/migrations/. A change is one transaction: the fence row (version
bumped, never reset) and its fence_range rows together, so x-geo recovering from
`region_bindings` and x-fence recovering from `live_fences` always see a whole version.
The control messages are sent after the commit (fence.manager): a crash in between leaves
the store ahead of the sidecars, and re-applying the change (any later version) repairs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import numpy as np

from exchanges.x_geo import FenceBinding
from fence.spec import Bindings, FenceSpec, check_geometry
from fence.state import FenceDef
from ingress.worldmap import Worldmap

log = logging.getLogger("geofence")
T = TypeVar("T")


class VersionConflict(RuntimeError):
    """The fence changed since the version the caller read (optimistic concurrency)."""


class UnknownFence(KeyError):
    pass


@dataclass(frozen=True, eq=False)
class FenceRecord:
    fence: FenceDef
    owner: str
    created_at: datetime
    updated_at: datetime
    regions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        from fence.control import fence_json

        return {**fence_json(self.fence), "owner": self.owner,
                "created_at": self.created_at.isoformat(), "updated_at": self.updated_at.isoformat(),
                "regions": list(self.regions)}


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
    from exchanges.shell import Backoff

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


async def save_fence(conn: asyncpg.Connection, spec: FenceSpec, bindings: Bindings,
                     expected_version: int | None = None, create: bool | None = None) -> FenceRecord:
    """Create or replace a fence and its bindings; returns the stored record (new version).

    `create=True` refuses an existing live fence, `create=False` an absent one;
    `expected_version` refuses a concurrent change (VersionConflict)."""
    x0, y0, x1, y1 = spec.bbox()
    async with conn.transaction():
        row = await conn.fetchrow("SELECT version, deleted_at FROM fence WHERE id = $1 FOR UPDATE",
                                  spec.fence_id)
        live = row is not None and row["deleted_at"] is None
        if create is True and live:
            raise VersionConflict(f"fence {spec.fence_id!r} exists (version {row['version']})")
        if create is False and not live:
            raise UnknownFence(spec.fence_id)
        if expected_version is not None and (not live or row["version"] != expected_version):
            have = row["version"] if live else None
            raise VersionConflict(f"fence {spec.fence_id!r} is at version {have}, "
                                  f"not {expected_version}")
        stored = await conn.fetchrow(
            """INSERT INTO fence (id, name, owner, geometry, timeout_s, version,
                                  min_lon, min_lat, max_lon, max_lat)
               VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $9)
               ON CONFLICT (id) DO UPDATE SET
                   name = EXCLUDED.name, owner = EXCLUDED.owner, geometry = EXCLUDED.geometry,
                   timeout_s = EXCLUDED.timeout_s, version = fence.version + 1,
                   min_lon = EXCLUDED.min_lon, min_lat = EXCLUDED.min_lat,
                   max_lon = EXCLUDED.max_lon, max_lat = EXCLUDED.max_lat,
                   created_at = CASE WHEN fence.deleted_at IS NULL THEN fence.created_at ELSE now() END,
                   updated_at = now(), deleted_at = NULL
               RETURNING version, created_at, updated_at""",
            spec.fence_id, spec.name, spec.owner, spec.geojson(), spec.timeout_s, x0, y0, x1, y1)
        version = stored["version"]
        await conn.execute("DELETE FROM fence_range WHERE fence_id = $1", spec.fence_id)
        await conn.executemany(
            "INSERT INTO fence_range (fence_id, region, version, bits, ranges, interior) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            [(spec.fence_id, region, version, bindings.bits,
              np.ascontiguousarray(r, "<u8").tobytes(), np.ascontiguousarray(f, np.uint8).tobytes())
             for region, (r, f) in sorted(bindings.per_region.items())])
    fence = FenceDef(spec.fence_id, version, spec.geometry, spec.timeout_s, spec.name)
    return FenceRecord(fence, spec.owner, stored["created_at"], stored["updated_at"],
                       tuple(sorted(bindings.per_region)))


async def delete_fence(conn: asyncpg.Connection, fence_id: str,
                       expected_version: int | None = None) -> tuple[int, datetime]:
    """Mark the fence deleted (version bumped) and drop its bindings: (version, when)."""
    async with conn.transaction():
        row = await conn.fetchrow("SELECT version FROM fence WHERE id = $1 AND deleted_at IS NULL "
                                  "FOR UPDATE", fence_id)
        if row is None:
            raise UnknownFence(fence_id)
        if expected_version is not None and row["version"] != expected_version:
            raise VersionConflict(f"fence {fence_id!r} is at version {row['version']}, "
                                  f"not {expected_version}")
        done = await conn.fetchrow("UPDATE fence SET version = version + 1, deleted_at = now(), "
                                   "updated_at = now() WHERE id = $1 RETURNING version, updated_at",
                                   fence_id)
        await conn.execute("DELETE FROM fence_range WHERE fence_id = $1", fence_id)
    return int(done["version"]), done["updated_at"]


def _record(row: asyncpg.Record) -> FenceRecord:
    fence = FenceDef(row["id"], int(row["version"]), check_geometry(row["geometry"]),
                     float(row["timeout_s"]), row["name"])
    return FenceRecord(fence, row["owner"], row["created_at"], row["updated_at"],
                       tuple(row["regions"] or ()))


_SELECT = """SELECT f.id, f.name, f.owner, f.geometry, f.timeout_s, f.version, f.created_at,
                    f.updated_at,
                    ARRAY(SELECT region FROM fence_range r WHERE r.fence_id = f.id
                          ORDER BY region) AS regions
             FROM fence f WHERE f.deleted_at IS NULL"""


async def get_fence(conn: asyncpg.Connection, fence_id: str) -> FenceRecord:
    row = await conn.fetchrow(_SELECT + " AND f.id = $1", fence_id)
    if row is None:
        raise UnknownFence(fence_id)
    return _record(row)


async def live_fences(conn: asyncpg.Connection) -> list[FenceRecord]:
    return [_record(r) for r in await conn.fetch(_SELECT + " ORDER BY f.id")]


async def region_bindings(conn: asyncpg.Connection, region: str) -> list[FenceBinding]:
    """What x-geo `region` must have bound (its `recover` source)."""
    rows = await conn.fetch("SELECT fence_id, version, ranges, interior FROM fence_range "
                            "WHERE region = $1 ORDER BY fence_id", region)
    return [FenceBinding(r["fence_id"], int(r["version"]),
                         np.frombuffer(r["ranges"], "<u8").astype(np.uint64).reshape(-1, 2),
                         np.frombuffer(r["interior"], np.uint8).astype(bool)) for r in rows]


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


async def save_worldmap(conn: asyncpg.Connection, worldmap: Worldmap) -> bool:
    """Store a map; False if that version exists already."""
    done = await conn.execute("INSERT INTO worldmap (version, body) VALUES ($1, $2) "
                              "ON CONFLICT (version) DO NOTHING", worldmap.version, worldmap.to_json())
    return bool(done.endswith(" 1"))
