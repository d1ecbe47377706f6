"""Public venue reads (`GET /hives`, `GET /hives/{id}`, no token): memcached first, PostgreSQL
the source of truth.

    gf:hive-status:<id>   a hive's live status (JSON). The sensor sidecar writes it after each
                          commit that moved the hive; a read that misses fills it from
                          hive_status for STATUS_TTL_S.
    gf:hives:index        every hive's public card (zlib-compressed JSON), filled from
                          PostgreSQL by a read that misses, for INDEX_TTL_S.

Staleness: a status is at most STATUS_TTL_S (60 s) behind PostgreSQL when the sidecar is down
or memcached lost a write, and LOCAL_STATUS_S (1 s) behind the last batch when both are up
(each API process keeps what it read for a second: a busy hive is read many times a second); a hive's card (a
new hive, a changed name) at most INDEX_TTL_S + LOCAL_INDEX_S (130 s): "a couple of minutes"
at worst (a new hive is found by id at once: `GET /hives/{id}` reads it from PostgreSQL).

    gf:hive-usual:<id>    a hive's "popular times" profile (the nightly venue analytics,
                          venue_profile) for PROFILE_TTL_S: a card shows the usual figure for
                          now and whether it is busier than usual. The profile changes once a
                          night, so it is at most PROFILE_TTL_S + LOCAL_PROFILE_S behind.

Memcached down, slow (CACHE_TIMEOUT_S) or flushed: every failure is a miss, counted; reads go
to PostgreSQL, at most PG_CONCURRENCY at once (the others wait their turn), so a cold cache
cannot flood the database. PostgreSQL down too: 503, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import aiomcache
import asyncpg
import orjson

from fence.venues.hive_index import HiveCard, HiveIndex, SearchError, parse_near
from fence.venues.occupancy import busyness, usual_now

log = logging.getLogger("geofence")
STATUS_TTL_S = 60
INDEX_TTL_S = 120
LOCAL_INDEX_S = 10.0  # the index parsed once per process for this long (it is read by every request)
LOCAL_STATUS_S = 1.0  # a status this process read, kept this long (hot hives are read many times a second)
CACHE_TIMEOUT_S = 0.5
CACHE_CONNECTIONS = 16
PG_CONCURRENCY = 8
PROFILE_TTL_S = 3600
LOCAL_PROFILE_S = 300.0
STATUS_KEY, INDEX_KEY, PROFILE_KEY = "gf:hive-status:", "gf:hives:index", "gf:hive-usual:"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CARD_COLUMNS = "id, name, type, address, lon, lat, tz, capacity, opening_hours"


class Unavailable(RuntimeError):
    """Neither the cache nor PostgreSQL could answer (the API says 503)."""


class VenueCache:
    """memcached through aiomcache; a failure is a miss (or a lost write), never an error."""

    def __init__(self, url: str, timeout: float = CACHE_TIMEOUT_S) -> None:
        parts = urlsplit(url)
        self.client = aiomcache.Client(parts.hostname or "127.0.0.1", parts.port or 11211,
                                       pool_size=CACHE_CONNECTIONS)
        self.timeout = timeout
        self.failures = 0
        self.hits = 0
        self.misses = 0

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            async with asyncio.timeout(self.timeout):
                got = list(await self.client.multi_get(*(k.encode() for k in keys)))
        except (OSError, TimeoutError, aiomcache.exceptions.ClientException) as exc:
            self._failed("get", exc)
            return [None] * len(keys)
        hits = sum(g is not None for g in got)
        self.hits += hits
        self.misses += len(keys) - hits
        return got

    async def set(self, key: str, value: bytes, ttl: int) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self.client.set(key.encode(), value, exptime=ttl)
        except (OSError, TimeoutError, aiomcache.exceptions.ClientException) as exc:
            self._failed("set", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures += 1
        if self.failures in (1, 10, 100) or self.failures % 1000 == 0:
            log.warning("memcached %s failed (%d failures so far): %r; reading PostgreSQL", what,
                        self.failures, exc)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()


def status_json(row: Any, capacity: int | None) -> dict[str, Any]:
    occupancy = int(row["occupancy"])
    return {"day": row["day"].isoformat(), "entries": int(row["entries"]), "exits": int(row["exits"]),
            "occupancy": occupancy, "raw": int(row["raw"]), "app_occupancy": row["app_occupancy"],
            "percent": round(100.0 * occupancy / capacity, 1) if capacity else None,
            "updated_at": row["updated_at"].timestamp()}


def open_now(opening_hours: dict[str, Any], tz: str, now: float) -> bool | None:
    """Open at `now` by its hours ({"mon": [["11:00", "23:00"]], ...}; a range past midnight
    runs into the next day); None when the hive gave none."""
    if not opening_hours:
        return None
    local = datetime.fromtimestamp(now, UTC).astimezone(ZoneInfo(tz))
    minute = local.hour * 60 + local.minute
    for offset, day in ((0, DAYS[local.weekday()]), (1, DAYS[(local.weekday() - 1) % 7])):
        for start, end in opening_hours.get(day, []):
            a, b = _minutes(start), _minutes(end)
            if b <= a:  # past midnight
                if (offset == 0 and minute >= a) or (offset == 1 and minute < b):
                    return True
            elif offset == 0 and a <= minute < b:
                return True
    return False


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


class VenueReads:
    def __init__(self, pool: asyncpg.Pool, cache: VenueCache | None, local_status_s: float = LOCAL_STATUS_S
                 ) -> None:
        self.pool = pool
        self.cache = cache
        self.local_status_s = local_status_s
        self.pg_slots = asyncio.Semaphore(PG_CONCURRENCY)
        self.pg_reads = 0
        self._index: HiveIndex | None = None
        self._index_at = -math.inf
        self._index_lock = asyncio.Lock()
        self._statuses: dict[str, tuple[float, dict[str, Any]]] = {}  # hive -> (read at, status)
        self._profiles: dict[str, tuple[float, dict[str, Any]]] = {}  # hive -> (read at, profile)

    async def _pg(self, query: str, *args: Any) -> list[Any]:
        async with self.pg_slots:
            self.pg_reads += 1
            try:
                rows: list[Any] = await self.pool.fetch(query, *args)
                return rows
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise Unavailable(f"the venue store is unavailable: {exc}") from None

    async def index(self) -> HiveIndex:
        """The hive index: this process's copy while younger than LOCAL_INDEX_S, else memcached's,
        else PostgreSQL's (one request rebuilds it; the others wait for it)."""
        if self._index is not None and time.monotonic() - self._index_at < LOCAL_INDEX_S:
            return self._index
        async with self._index_lock:
            if self._index is None or time.monotonic() - self._index_at >= LOCAL_INDEX_S:
                self._index = await self._load_index()
                self._index_at = time.monotonic()
            return self._index

    async def invalidate_index(self) -> None:
        """A hive was created or changed: the next read rebuilds the index from PostgreSQL."""
        self._index = None
        if self.cache is not None:
            with contextlib.suppress(OSError, TimeoutError, aiomcache.exceptions.ClientException):
                async with asyncio.timeout(self.cache.timeout):
                    await self.cache.client.delete(INDEX_KEY.encode())

    async def _load_index(self) -> HiveIndex:
        if self.cache is not None:
            (raw,) = await self.cache.get_many([INDEX_KEY])
            if raw is not None:
                with contextlib.suppress(ValueError, zlib.error, KeyError, TypeError):
                    return HiveIndex.from_json(orjson.loads(zlib.decompress(raw)))
        rows = await self._pg(f"SELECT {CARD_COLUMNS} FROM hive")
        index = HiveIndex(HiveCard(r["id"], r["name"], r["type"], r["address"], r["lon"], r["lat"], r["tz"],
                                   r["capacity"], _json(r["opening_hours"])) for r in rows)
        if self.cache is not None:
            await self.cache.set(INDEX_KEY, zlib.compress(orjson.dumps(index.to_json())), INDEX_TTL_S)
        return index

    async def statuses(self, cards: Sequence[HiveCard]) -> dict[str, dict[str, Any]]:
        """Each card's live status: this process's copy if younger than LOCAL_STATUS_S, else
        memcached's, else PostgreSQL's (then put in memcached)."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        fetch = []
        for c in cards:
            held = self._statuses.get(c.hive_id)
            if held is not None and now - held[0] < self.local_status_s:
                out[c.hive_id] = held[1]
            else:
                fetch.append(c)
        if fetch:
            got = await self._fetch_statuses(fetch)
            if len(self._statuses) > 100_000:
                self._statuses.clear()
            for hive_id, st in got.items():
                self._statuses[hive_id] = (now, st)
            out.update(got)
        return out

    async def _fetch_statuses(self, cards: Sequence[HiveCard]) -> dict[str, dict[str, Any]]:
        keys = [STATUS_KEY + c.hive_id for c in cards]
        got = await self.cache.get_many(keys) if self.cache is not None else [None] * len(cards)
        out: dict[str, dict[str, Any]] = {}
        missing = []
        for c, raw in zip(cards, got, strict=True):
            if raw is None:
                missing.append(c)
            else:
                with contextlib.suppress(ValueError):
                    out[c.hive_id] = orjson.loads(raw)
        if missing:
            capacity = {c.hive_id: c.capacity for c in missing}
            rows = await self._pg("SELECT hive_id, day, entries, exits, occupancy, raw, app_occupancy, "
                                  "updated_at FROM hive_status WHERE hive_id = ANY($1::text[])",
                                  list(capacity))
            for r in rows:
                st = status_json(r, capacity[r["hive_id"]])
                out[r["hive_id"]] = st
                if self.cache is not None:
                    await self.cache.set(STATUS_KEY + r["hive_id"], orjson.dumps(st), STATUS_TTL_S)
        return out

    async def profiles(self, cards: Sequence[HiveCard]) -> dict[str, dict[str, Any]]:
        """Each card's "popular times" profile ({} for a hive without one): this process's copy
        if younger than LOCAL_PROFILE_S, else memcached's, else PostgreSQL's."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        fetch = []
        for c in cards:
            held = self._profiles.get(c.hive_id)
            if held is not None and now - held[0] < LOCAL_PROFILE_S:
                out[c.hive_id] = held[1]
            else:
                fetch.append(c.hive_id)
        if not fetch:
            return out
        got = await self.cache.get_many([PROFILE_KEY + h for h in fetch]) if self.cache is not None \
            else [None] * len(fetch)
        missing = []
        for hive_id, raw in zip(fetch, got, strict=True):
            try:
                cached = orjson.loads(raw) if raw is not None else None
            except ValueError:
                cached = None
            if isinstance(cached, dict):
                out[hive_id] = cached
            else:
                missing.append(hive_id)
        if missing:
            loaded: dict[str, dict[str, Any]] = {h: {} for h in missing}
            rows = await self._pg(
                "SELECT p.hive_id, h.reset_hour, p.weekday, p.hour, p.occupancy, p.phones, p.samples, "
                "p.as_of FROM venue_profile p JOIN hive h ON h.id = p.hive_id "
                "WHERE p.hive_id = ANY($1::text[])", missing)
            for r in rows:
                prof = loaded[r["hive_id"]]
                prof.setdefault("reset_hour", r["reset_hour"])
                prof["as_of"] = max(prof.get("as_of", ""), r["as_of"].isoformat())
                prof.setdefault("hours", {})[f"{r['weekday']}-{r['hour']}"] = [r["occupancy"], r["phones"],
                                                                                r["samples"]]
            for hive_id, prof in loaded.items():
                out[hive_id] = prof
                if self.cache is not None:
                    await self.cache.set(PROFILE_KEY + hive_id, orjson.dumps(prof), PROFILE_TTL_S)
        if len(self._profiles) > 100_000:
            self._profiles.clear()
        for hive_id in fetch:
            self._profiles[hive_id] = (now, out[hive_id])
        return out

    def _card(self, c: HiveCard, status: dict[str, Any] | None, now: float, distance: float | None = None,
              profile: dict[str, Any] | None = None) -> dict[str, Any]:
        usual = usual_now(profile, c.tz, now) if profile else None
        if usual is not None:
            usual["busyness"] = busyness(status["occupancy"] if status else 0, float(usual["occupancy"]),
                                         int(usual["samples"]))
        out = {**c.to_json(), "open_now": open_now(c.opening_hours, c.tz, now),
               "occupancy": status, "usual": usual}
        if distance is not None:
            out["distance_m"] = round(distance, 1)
        return out

    async def hive(self, hive_id: str, now: float) -> dict[str, Any] | None:
        index = await self.index()
        card = index.by_id.get(hive_id)
        if card is None:  # created since the index was cached?
            rows = await self._pg(f"SELECT {CARD_COLUMNS} FROM hive WHERE id = $1", hive_id)
            if not rows:
                return None
            r = rows[0]
            card = HiveCard(r["id"], r["name"], r["type"], r["address"], r["lon"], r["lat"], r["tz"],
                            r["capacity"], _json(r["opening_hours"]))
        status = (await self.statuses([card])).get(hive_id)
        profile = (await self.profiles([card])).get(hive_id)
        return self._card(card, status, now, profile=profile)

    async def hives(self, near: str | None, radius_m: float | None, type_: str | None, q: str | None,
                    limit: int, now: float) -> dict[str, Any]:
        where = parse_near(near, radius_m)
        if q is not None and len(q) > 100:
            raise SearchError("q: at most 100 characters")
        found = (await self.index()).search(where, type_, q, limit)
        statuses = await self.statuses([c for c, _ in found])
        profiles = await self.profiles([c for c, _ in found])
        return {"hives": [self._card(c, statuses.get(c.hive_id), now, d, profiles.get(c.hive_id))
                          for c, d in found],
                "count": len(found)}


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, str | bytes):
        got: dict[str, Any] = orjson.loads(value)
        return got
    return dict(value or {})


async def publish_status(cache: VenueCache, hive_id: str, status: dict[str, Any]) -> None:
    """The sensor sidecar's write after a commit (a failure leaves the read to PostgreSQL)."""
    await cache.set(STATUS_KEY + hive_id, orjson.dumps(status), STATUS_TTL_S)
