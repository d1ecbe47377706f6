"""The durable source of fences, bindings and the worldmap: PostgreSQL (asyncpg).

Tables come from deploy/migrations/. A change is one transaction: the fence row (version
bumped, never reset) and its fence_range rows together, so x-geo recovering from
`region_bindings` and x-fence recovering from `fences_by_ids` always see a whole version.
The control messages are sent after the commit (fence.manager): a crash in between leaves
the store ahead of the sidecars, and re-applying the change (any later version) repairs it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import numpy as np
import orjson
from shapely.geometry import mapping

from exchanges.control import fence_json
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef, check_geometry, shown
from exchanges.fence_options import decode_options, encode_options
from exchanges.routing_store import ROAM_CHANGE_LOCK, binding_of, latest_worldmap_version
from exchanges.subscriptions import point_object
from exchanges.worldmap import Worldmap
from fence import quotas
from fence.spec import Bindings, FenceSpec, Follow

log = logging.getLogger("geofence")
T = TypeVar("T")


class VersionConflict(RuntimeError):
    """The fence changed since the version the caller read (optimistic concurrency)."""


class UnknownFence(KeyError):
    pass


class NotOwner(PermissionError):
    """The fence belongs to another user."""


class StaleMove(RuntimeError):
    """A follow move built from a position older than the one the fence stands on."""


class WorldmapChanged(RuntimeError):
    """The bindings were cut with a worldmap that is no longer the newest: cut them again."""


# Held shared by every fence change (with its check of the worldmap version) and exclusively
# by a worldmap change, so no change can store bindings cut with a map older than the newest.
WORLDMAP_LOCK = 0x676D6170  # "gmap"


@dataclass(frozen=True, eq=False)
class FenceRecord:
    fence: FenceDef
    owner: str
    created_at: datetime
    updated_at: datetime
    regions: tuple[str, ...] = ()
    follow: Follow | None = None
    follow_ts: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {**fence_json(self.fence), "owner": self.owner,
                "created_at": self.created_at.isoformat(), "updated_at": self.updated_at.isoformat(),
                "regions": list(self.regions),
                "follow": None if self.follow is None else {**self.follow.to_json(), "ts": self.follow_ts}}


@dataclass(frozen=True, eq=False)
class Saved:
    """A stored change: the new record, and what each region had bound before it."""

    record: FenceRecord
    previous: dict[str, FenceBinding]


async def save_fence(conn: asyncpg.Connection, spec: FenceSpec, bindings: Bindings,
                     expected_version: int | None = None, create: bool | None = None,
                     owner: str | None = None, follow_ts: float | None = None,
                     worldmap_version: int | None = None, quota_of: str | None = None) -> Saved:
    """Create or replace a fence and its bindings; returns the stored record (new version)
    and the bindings it replaced.

    `create=True` refuses an existing live fence, `create=False` an absent one;
    `expected_version` refuses a concurrent change (VersionConflict); `owner` refuses a live
    fence of another owner (NotOwner); `follow_ts` (a follow move) refuses a position older
    than the fence's (StaleMove); `worldmap_version`, the map the bindings were cut with, one
    that is no longer the newest (WorldmapChanged); `quota_of`, a tenant whose quotas the
    change must keep (fence/quotas.py: QuotaExceeded)."""
    x0, y0, x1, y1 = spec.bbox()
    vertices = quotas.vertices_of(spec.geometry)
    async with conn.transaction():
        if quota_of is not None:  # before the fence's row: one lock order (tenant, then fence)
            await quotas.lock_tenant(conn, quota_of)
        if worldmap_version is not None:
            await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", WORLDMAP_LOCK)
            if await latest_worldmap_version(conn) != worldmap_version:
                raise WorldmapChanged(f"the worldmap is no longer version {worldmap_version}")
        row = await conn.fetchrow("SELECT version, deleted_at, owner, follow_object, follow_ts, vertices "
                                  "FROM fence WHERE id = $1 FOR UPDATE", spec.fence_id)
        live = row is not None and row["deleted_at"] is None
        # an id stays its first owner's, deleted or not: its archived events are theirs
        if row is not None and owner is not None and row["owner"] != owner:
            raise NotOwner(spec.fence_id)
        if follow_ts is not None and live:
            if spec.follow is None or row["follow_object"] != spec.follow.object_id:
                raise StaleMove(f"fence {spec.fence_id!r} no longer follows that object")
            if row["follow_ts"] is not None and follow_ts <= row["follow_ts"]:
                raise StaleMove(f"fence {spec.fence_id!r} stands on a position of {row['follow_ts']}")
        if create is True and live:
            raise VersionConflict(f"fence {spec.fence_id!r} exists (version {row['version']})")
        if create is False and not live:
            raise UnknownFence(spec.fence_id)
        if expected_version is not None and (not live or row["version"] != expected_version):
            have = row["version"] if live else None
            raise VersionConflict(f"fence {spec.fence_id!r} is at version {have}, "
                                  f"not {expected_version}")
        if quota_of is not None:
            before = {"fences": 1, "vertices": row["vertices"],
                      "follow_fences": int(row["follow_object"] is not None)} if live else {}
            await quotas.check_fence(conn, quota_of, spec.fence_id, vertices, spec.follow is not None, before)
        stored = await conn.fetchrow(
            """INSERT INTO fence (id, name, owner, geometry, options, version,
                                  min_lon, min_lat, max_lon, max_lat, follow_object, follow_radius_m,
                                  follow_ts, cover_geometry, vertices)
               VALUES ($1, $2, $3, $4, $5, 1, $6, $7, $8, $9, $10, $11, $12, $13, $14)
               ON CONFLICT (id) DO UPDATE SET
                   name = EXCLUDED.name, owner = EXCLUDED.owner, geometry = EXCLUDED.geometry,
                   vertices = EXCLUDED.vertices,
                   options = EXCLUDED.options, version = fence.version + 1,
                   min_lon = EXCLUDED.min_lon, min_lat = EXCLUDED.min_lat,
                   max_lon = EXCLUDED.max_lon, max_lat = EXCLUDED.max_lat,
                   follow_object = EXCLUDED.follow_object, follow_radius_m = EXCLUDED.follow_radius_m,
                   follow_ts = EXCLUDED.follow_ts, cover_geometry = EXCLUDED.cover_geometry,
                   created_at = CASE WHEN fence.deleted_at IS NULL THEN fence.created_at ELSE now() END,
                   updated_at = now(), deleted_at = NULL
               RETURNING version, created_at, updated_at""",
            spec.fence_id, spec.name, spec.owner, spec.geojson(), encode_options(spec), x0, y0, x1, y1,
            spec.follow.object_id if spec.follow else None, spec.follow.radius_m if spec.follow else None,
            follow_ts if spec.follow else None,
            dict(mapping(spec.cover_geometry())) if spec.hysteresis_m else None, vertices)
        version = stored["version"]
        previous = {r["region"]: binding_of(r) for r in await conn.fetch(
            "DELETE FROM fence_range WHERE fence_id = $1 "
            "RETURNING fence_id, region, version, ranges, interior",
            spec.fence_id)}
        await conn.executemany(
            "INSERT INTO fence_range (fence_id, region, version, bits, ranges, interior) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            [(spec.fence_id, region, version, bindings.bits,
              np.ascontiguousarray(r, "<u8").tobytes(), np.ascontiguousarray(f, np.uint8).tobytes())
             for region, (r, f) in sorted(bindings.per_region.items())])
    fence = spec.definition(version)
    record = FenceRecord(fence, spec.owner, stored["created_at"], stored["updated_at"],
                         tuple(sorted(bindings.per_region)), spec.follow,
                         follow_ts if spec.follow else None)
    return Saved(record, previous)


async def delete_fence(conn: asyncpg.Connection, fence_id: str, expected_version: int | None = None,
                       owner: str | None = None) -> tuple[int, datetime]:
    """Mark the fence deleted (version bumped) and drop its bindings: (version, when)."""
    async with conn.transaction():
        row = await conn.fetchrow("SELECT version, owner FROM fence WHERE id = $1 AND deleted_at IS NULL "
                                  "FOR UPDATE", fence_id)
        if row is None:
            raise UnknownFence(fence_id)
        if owner is not None and row["owner"] != owner:
            raise NotOwner(fence_id)
        if expected_version is not None and row["version"] != expected_version:
            raise VersionConflict(f"fence {fence_id!r} is at version {row['version']}, "
                                  f"not {expected_version}")
        done = await conn.fetchrow("UPDATE fence SET version = version + 1, deleted_at = now(), "
                                   "updated_at = now() WHERE id = $1 RETURNING version, updated_at",
                                   fence_id)
        await conn.execute("DELETE FROM fence_range WHERE fence_id = $1", fence_id)
    return int(done["version"]), done["updated_at"]


def _record(row: asyncpg.Record) -> FenceRecord:
    fence = FenceDef(fence_id=row["id"], version=int(row["version"]),
                     geometry=check_geometry(row["geometry"]), name=row["name"],
                     **decode_options(row["options"]))
    follow = (None if row["follow_object"] is None
              else Follow(row["follow_object"], float(row["follow_radius_m"])))
    return FenceRecord(fence, row["owner"], row["created_at"], row["updated_at"],
                       tuple(row["regions"] or ()), follow, row["follow_ts"])


_SELECT = """SELECT f.id, f.name, f.owner, f.geometry, f.options, f.version, f.created_at, f.updated_at,
                    f.follow_object, f.follow_radius_m, f.follow_ts,
                    ARRAY(SELECT region FROM fence_range r WHERE r.fence_id = f.id
                          ORDER BY region) AS regions
             FROM fence f WHERE f.deleted_at IS NULL"""


async def get_fence(conn: asyncpg.Connection, fence_id: str) -> FenceRecord:
    row = await conn.fetchrow(_SELECT + " AND f.id = $1", fence_id)
    if row is None:
        raise UnknownFence(fence_id)
    return _record(row)


async def deleted_fences(conn: asyncpg.Connection, fence_ids: list[str]) -> list[tuple[str, int, float]]:
    """(id, version, deletion time) of those of the fences that are deleted now."""
    rows = await conn.fetch("SELECT id, version, updated_at FROM fence WHERE id = ANY($1::text[]) "
                            "AND deleted_at IS NOT NULL ORDER BY id", fence_ids)
    return [(r["id"], int(r["version"]), r["updated_at"].timestamp()) for r in rows]


async def live_fence_versions(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    """(id, version) of every live fence: what a worker compares its state with at a start,
    before it reads the definitions of those it lacks or holds older (`fences_by_ids`)."""
    return [(r["id"], int(r["version"])) for r in
            await conn.fetch("SELECT id, version FROM fence WHERE deleted_at IS NULL ORDER BY id")]


async def fences_by_ids(conn: asyncpg.Connection, fence_ids: list[str]) -> list[FenceRecord]:
    """The live fences among `fence_ids`, by id."""
    return [_record(r) for r in await conn.fetch(_SELECT + " AND f.id = ANY($1::text[]) ORDER BY f.id",
                                                 fence_ids)]


async def find_fences(conn: asyncpg.Connection, tenant: str | None = None,
                      bbox: tuple[float, float, float, float] | None = None, limit: int = 1000,
                      after: str = "") -> list[FenceRecord]:
    """Live fences of `tenant` (None: every tenant's) whose bbox meets `bbox`, by (qualified)
    id, after the qualified id `after`."""
    x0, y0, x1, y1 = bbox if bbox is not None else (-180.0, -90.0, 180.0, 90.0)
    rows = await conn.fetch(
        _SELECT + " AND ($1::text IS NULL OR f.tenant = $1) AND f.id > $2 AND f.max_lon >= $3 "
        "AND f.min_lon <= $5 AND f.max_lat >= $4 AND f.min_lat <= $6 ORDER BY f.id LIMIT $7",
        tenant, after, x0, y0, x1, y1, limit)
    return [_record(r) for r in rows]


async def counting_from(conn: asyncpg.Connection, tenant: str, counted: str) -> list[FenceRecord]:
    """Live fences of `tenant` that count `counted`'s objects (options counts_from)."""
    rows = await conn.fetch(_SELECT + " AND f.tenant = $1 AND f.options -> 'counts_from' ? $2 ORDER BY f.id",
                            tenant, counted)
    return [_record(r) for r in rows]


async def following(conn: asyncpg.Connection, object_ids: list[str] | None = None) -> list[FenceRecord]:
    """Live fences that follow an object (one of `object_ids`, or any)."""
    rows = await conn.fetch(_SELECT + " AND f.follow_object IS NOT NULL AND "
                            "($1::text[] IS NULL OR f.follow_object = ANY($1)) ORDER BY f.id", object_ids)
    return [_record(r) for r in rows]


# --------------------------------------------------------------------------- events archive

EVENT_COLUMNS = ("event_id", "fence_id", "object_id", "event", "reason", "ts")  # required on the wire
VISIT_COLUMNS = ("visit_id", "inside_s")  # optional (an older worker's events have neither)
EventRow = tuple[str, str, str, str, str, float, str | None, float | None]


async def archive_events(conn: asyncpg.Connection, rows: list[EventRow]) -> int:
    """Store events (EVENT_COLUMNS + VISIT_COLUMNS tuples), each event_id once: one INSERT of the rows as
    arrays (unnest) .. ON CONFLICT DO NOTHING (an id twice in `rows` is stored once too).
    Returns how many were new, and only once they are committed (never inside a caller's
    transaction: a savepoint is no commit). One statement, no staging table: ~10% less of
    PostgreSQL's CPU per row than COPY into a temporary table and INSERT .. SELECT from it."""
    if conn.is_in_transaction():
        raise asyncpg.InterfaceError("archive_events on a connection inside a transaction")
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in (*EVENT_COLUMNS,
                                                                                      *VISIT_COLUMNS)]
    async with conn.transaction():
        # each month's table made first, if this is its first event (migration 0029)
        await conn.execute("SELECT fence_event_month(t) FROM unnest($1::float8[]) t",
                           month_starts(columns[5]))
        done = await conn.execute(
            "INSERT INTO fence_event (event_id, fence_id, object_id, event, reason, ts, visit_id, inside_s) "
            "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], "
            "$6::float8[], $7::text[], $8::float8[]) ON CONFLICT (event_id, ts) DO NOTHING", *columns)
    return int(done.split()[-1])


def month_starts(ts: Sequence[float]) -> list[float]:
    """The first instant (UTC, epoch seconds) of each month `ts` touches: the archive's
    partitions (fence_event_YYYY_MM) these events go to. Days first: a batch spans a few."""
    days = {int(t // 86400) for t in ts}
    months = {datetime.fromtimestamp(d * 86400, UTC).replace(day=1) for d in days}
    return sorted(m.timestamp() for m in months)


class BadCursor(ValueError):
    """A page cursor this API did not give out (malformed, altered, or another fence's)."""


CURSOR_VERSION = 1
MAX_CURSOR_CHARS = 2048  # a fence id (<= 64), an event id (<= 200 characters of UTF-8), a ts, a check
_CURSOR_RE = re.compile(r"[A-Za-z0-9_-]+")
_CHECK_BYTES = 6
_CHECK_PERSON = b"gf-event-cursor"


def _check(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=_CHECK_BYTES, person=_CHECK_PERSON).digest()


def event_cursor(fence_id: str, ts: float, event_id: str) -> str:
    """The opaque cursor of a fence's archived event: base64url (unpadded) of a 6-byte check
    then the JSON `[1, fence_id, ts, event_id]`. (ts, event_id) is the archive's page order, a
    total order (event_id is the primary key); orjson writes a float's shortest repr, which
    reads back to the same double, so `ts` compares equal to the stored value. The check (an
    unkeyed BLAKE2b) catches a cursor cut, mistyped or edited by hand; it is no signature,
    and needs none: a cursor only says where to start among the events its fence's owner may
    read anyway."""
    payload = orjson.dumps([CURSOR_VERSION, fence_id, ts, event_id])
    return base64.urlsafe_b64encode(_check(payload) + payload).rstrip(b"=").decode("ascii")


def read_event_cursor(cursor: Any, fence_id: str) -> tuple[float, str]:
    """(ts, event_id) of a cursor event_cursor gave for this fence; BadCursor says why not.
    Only the exact text event_cursor writes is taken (checked, decoded, encoded again and
    compared), so an altered cursor is refused, never read as something else."""
    if not isinstance(cursor, str) or not 0 < len(cursor) <= MAX_CURSOR_CHARS \
            or not _CURSOR_RE.fullmatch(cursor):
        raise BadCursor(f"cursor {shown(cursor, 60)}: not a cursor this API gave (the `next` of a page: "
                        f"up to {MAX_CURSOR_CHARS} characters of base64url)")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        check, payload = raw[:_CHECK_BYTES], raw[_CHECK_BYTES:]
        if check != _check(payload):
            raise ValueError("check")
        data = orjson.loads(payload)
    except (ValueError, binascii.Error):  # orjson.JSONDecodeError is a ValueError
        raise BadCursor(f"cursor {shown(cursor, 60)}: malformed or altered (not a cursor this API gave)"
                        ) from None
    ok = (isinstance(data, list) and len(data) == 4 and type(data[0]) is int and data[0] == CURSOR_VERSION
          and isinstance(data[1], str) and type(data[2]) is float and math.isfinite(data[2])
          and isinstance(data[3], str) and 0 < len(data[3]) <= 200 and "\x00" not in data[3])
    if not ok or event_cursor(data[1], data[2], data[3]) != cursor:
        raise BadCursor(f"cursor {shown(cursor, 60)}: malformed or altered (not a cursor this API gave)")
    if data[1] != fence_id:
        raise BadCursor(f"cursor {shown(cursor, 60)}: a cursor of another fence's events, "
                        f"not of {fence_id!r}'s")
    return data[2], data[3]


async def fence_events(conn: asyncpg.Connection, fence_id: str, since: float = 0.0,
                       limit: int = 1000, after: tuple[float, str] | None = None,
                       objects_of: str | None = None) -> list[dict[str, Any]]:
    """A fence's archived events from `since` (epoch seconds, inclusive) and strictly after
    `after` ((ts, event_id), a cursor's), oldest first: ordered by (ts, event_id), a total
    order (event_id is the primary key). The index fence_event_by_fence_page (fence_id, ts,
    event_id; migration 0022) serves it as one range scan: a page reads its own rows only,
    however many events share a ts. `objects_of`: only the events of that tenant's objects
    (a tenant reads its own; presence events of the objects of a tenant the fence counts from
    are counts, never read one by one: exchanges/fence_options/shares.py)."""
    where, args = ["fence_id = $1", "ts >= $2"], [fence_id, since]
    if after is not None:
        where.append("(ts, event_id) > ($3, $4)")
        args += [after[0], after[1]]
    if objects_of is not None:
        args.append(f"{objects_of}:")
        where.append(f"starts_with(object_id, ${len(args)})")
    args.append(limit)
    rows = await conn.fetch("SELECT event_id, fence_id, object_id, event, reason, ts, visit_id, inside_s "
                            f"FROM fence_event WHERE {' AND '.join(where)} ORDER BY ts, event_id "
                            f"LIMIT ${len(args)}", *args)
    return [dict(r) for r in rows]


async def fence_owner(conn: asyncpg.Connection, fence_id: str) -> str | None:
    """The owner of a fence, live or deleted (its events stay readable by it); None if unknown."""
    owner: str | None = await conn.fetchval("SELECT owner FROM fence WHERE id = $1", fence_id)
    return owner


async def save_worldmap(conn: asyncpg.Connection, worldmap: Worldmap) -> bool:
    """Store a map; False if that version exists already. Waits for the fence changes in
    flight (they hold WORLDMAP_LOCK shared) and makes later ones cut with this map."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", WORLDMAP_LOCK)
        done = await conn.execute("INSERT INTO worldmap (version, body) VALUES ($1, $2) "
                                  "ON CONFLICT (version) DO NOTHING", worldmap.version, worldmap.to_json())
    return bool(done.endswith(" 1"))


async def routing_versions(conn: asyncpg.Connection, within_s: float) -> dict[str, int]:
    """The worldmap version of every x-ingress that checked in within `within_s` seconds."""
    rows = await conn.fetch("SELECT instance, version FROM worldmap_seen "
                            "WHERE seen_at > now() - make_interval(secs => $1)", within_s)
    return {r["instance"]: int(r["version"]) for r in rows}


async def replace_region_bindings(
    conn: asyncpg.Connection, fence_id: str, version: int, bits: int,
    per_region: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None],
) -> FenceRecord | None:
    """Set what some regions bind of a fence (None: nothing), if the fence is still live at
    `version` (else None: a change of the API came first and stored its own bindings). The
    nightly rebuild repairs and re-splits bindings with this, through the fence row's lock."""
    async with conn.transaction():
        row = await conn.fetchrow("SELECT version FROM fence WHERE id = $1 AND deleted_at IS NULL FOR UPDATE",
                                  fence_id)
        if row is None or int(row["version"]) != version:
            return None
        await conn.execute("DELETE FROM fence_range WHERE fence_id = $1 AND region = ANY($2)",
                           fence_id, list(per_region))
        await conn.executemany(
            "INSERT INTO fence_range (fence_id, region, version, bits, ranges, interior) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            [(fence_id, region, version, bits, np.ascontiguousarray(b[0], "<u8").tobytes(),
              np.ascontiguousarray(b[1], np.uint8).tobytes())
             for region, b in sorted(per_region.items()) if b is not None])
        return await get_fence(conn, fence_id)


# -- proximity subscriptions ----------------------------------------------------------------------


class UnknownSubscription(LookupError):
    pass


def _subscription(row: asyncpg.Record) -> dict[str, Any]:
    d: dict[str, Any] = {"id": row["id"], "radius_m": row["radius_m"]}
    if row["point_lon"] is None:
        d["object"] = row["object_id"]
    else:  # a fixed point's (object_id holds its synthetic subscriber)
        d["point"] = [row["point_lon"], row["point_lat"]]
    if row["match"] != "*":
        d["match"] = row["match"]
    if row["where_json"]:
        d["where"] = row["where_json"]
    d.update(owner=row["owner"], created_at=row["created_at"].timestamp(),
             updated_at=row["updated_at"].timestamp())
    return d


async def put_subscription(conn: asyncpg.Connection, owner: str,
                           definition: dict[str, Any], quota_of: str | None = None) -> dict[str, Any]:
    """Store a subscription (new, or changed) and its change, in one transaction serialised
    with every other change (the advisory lock): x-ingress reads the changes in seq order, so a
    seq must never commit after a higher one. Its id is qualified by its tenant
    (exchanges/tenancy.py): who may change it was decided by the caller; `owner` is who
    created or last changed it; `quota_of`, a tenant whose subscription quota a new one must
    keep (QuotaExceeded)."""
    async with conn.transaction():
        if quota_of is not None:
            await quotas.lock_tenant(conn, quota_of)
        await conn.execute("SELECT pg_advisory_xact_lock($1)", ROAM_CHANGE_LOCK)
        if quota_of is not None:
            await quotas.check_subscription(conn, quota_of, definition["id"])
        row = await conn.fetchrow(
            "INSERT INTO roam_subscription (id, owner, object_id, radius_m, match, where_json, point_lon, "
            "point_lat) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) "
            "ON CONFLICT (id) DO UPDATE SET owner = $2, object_id = $3, "
            "radius_m = $4, match = $5, where_json = $6, point_lon = $7, point_lat = $8, "
            "updated_at = now() RETURNING *",
            definition["id"], owner, definition.get("object", point_object(definition["id"])),
            float(definition["radius_m"]), definition.get("match", "*"), definition.get("where", []),
            *(definition.get("point") or (None, None)))
        await conn.execute("INSERT INTO roam_change (subscription_id, definition) VALUES ($1, $2)",
                           definition["id"], definition)
    return _subscription(row)


async def delete_subscription(conn: asyncpg.Connection, sub_id: str) -> None:
    """Delete a subscription (its qualified id) and record the change."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", ROAM_CHANGE_LOCK)
        found = await conn.fetchval("SELECT owner FROM roam_subscription WHERE id = $1", sub_id)
        if found is None:
            raise UnknownSubscription(sub_id)
        await conn.execute("DELETE FROM roam_subscription WHERE id = $1", sub_id)
        await conn.execute("INSERT INTO roam_change (subscription_id, definition) VALUES ($1, NULL)", sub_id)


async def get_subscription(conn: asyncpg.Connection, sub_id: str) -> dict[str, Any]:
    row = await conn.fetchrow("SELECT * FROM roam_subscription WHERE id = $1", sub_id)
    if row is None:
        raise UnknownSubscription(sub_id)
    return _subscription(row)


async def list_subscriptions(conn: asyncpg.Connection, tenant: str | None, limit: int = 1000
                             ) -> list[dict[str, Any]]:
    """A tenant's subscriptions (None: every tenant's, for the operator's command line)."""
    rows = await conn.fetch("SELECT * FROM roam_subscription WHERE $1::text IS NULL OR tenant = $1 "
                            "ORDER BY id LIMIT $2", tenant, limit)
    return [_subscription(r) for r in rows]
