"""The webhooks' PostgreSQL tables (deploy/migrations/0028_webhooks.sql): the tenants' endpoints
(read and written by the API and `geofence webhook`, read by the sidecar) and the outbox, each
endpoint's events still to deliver (written by the sidecar's intake, drained by its lanes).

Every read and change of an endpoint names its tenant: an endpoint of another tenant is not
found, whether it exists or not. A change of the endpoints is announced with NOTIFY on
CHANNEL, which the sidecar listens to (it also reloads them periodically).
"""

from __future__ import annotations

import secrets as random_ids
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from fence.webhooks import notices
from fence.webhooks.endpoints import MAX_ENDPOINTS, Endpoint
from fence.webhooks.fanout import OutboxRow

CHANNEL = "webhook_endpoints"
TO_DELIVER, DELIVERED, DEAD = 0, 1, 2
KEEP_DELIVERED_S = 3600.0  # a delivered row stays this long: a redelivered event meets it
KEEP_DEAD_S = 7 * 86_400.0
MAX_PAGE = 500
_COLUMNS = ("id, tenant, url, fences, kinds, objects, batch, enabled, disabled_reason, description, "
            "secrets, timeout_s, retry_for_s, local_ok")


class UnknownEndpoint(LookupError):
    pass


class TooManyEndpoints(ValueError):
    pass


def new_id() -> str:
    return "wh-" + random_ids.token_hex(8)


def _endpoint(r: asyncpg.Record) -> Endpoint:
    return Endpoint(r["id"], r["tenant"], r["url"], tuple(r["fences"]), tuple(r["kinds"]),
                    tuple(r["objects"]), r["batch"], r["enabled"], r["disabled_reason"], r["description"],
                    tuple(r["secrets"]), r["timeout_s"], r["retry_for_s"], r["local_ok"])


# --------------------------------------------------------------------------- endpoints


async def create(conn: asyncpg.Connection, ep: Endpoint) -> Endpoint:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('webhook_endpoint:' || $1))", ep.tenant)
        n = await conn.fetchval("SELECT count(*) FROM webhook_endpoint WHERE tenant = $1", ep.tenant)
        if n >= MAX_ENDPOINTS:
            raise TooManyEndpoints(f"tenant {ep.tenant!r} has {n} webhook endpoints, the most there may be; "
                                   "remove one first")
        await conn.execute(
            "INSERT INTO webhook_endpoint (id, tenant, url, fences, kinds, objects, batch, description, "
            "secrets, timeout_s, retry_for_s, local_ok) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
            ep.id, ep.tenant, ep.url, list(ep.fences), list(ep.kinds), list(ep.objects), ep.batch,
            ep.description, list(ep.secrets), ep.timeout_s, ep.retry_for_s, ep.local_ok)
        await conn.execute(f"NOTIFY {CHANNEL}")
    return ep


async def listed(conn: asyncpg.Connection, tenant: str | None) -> list[Endpoint]:
    """A tenant's endpoints (None: every tenant's, for the operator and the sidecar)."""
    if tenant is None:
        rows = await conn.fetch(f"SELECT {_COLUMNS} FROM webhook_endpoint ORDER BY tenant, created_at, id")
    else:
        rows = await conn.fetch(f"SELECT {_COLUMNS} FROM webhook_endpoint WHERE tenant = $1 "
                                "ORDER BY created_at, id", tenant)
    return [_endpoint(r) for r in rows]


async def get(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> Endpoint:
    r = await conn.fetchrow(f"SELECT {_COLUMNS} FROM webhook_endpoint WHERE id = $1 AND tenant = $2",
                            endpoint_id, tenant)
    if r is None:
        raise UnknownEndpoint(f"no webhook endpoint {endpoint_id[:40]!r} in tenant {tenant!r}")
    return _endpoint(r)


async def _change(conn: asyncpg.Connection, tenant: str, endpoint_id: str, sql: str, *args: Any) -> None:
    async with conn.transaction():
        done = await conn.execute(sql + " WHERE id = $1 AND tenant = $2", endpoint_id, tenant, *args)
        if done.endswith(" 0"):
            raise UnknownEndpoint(f"no webhook endpoint {endpoint_id[:40]!r} in tenant {tenant!r}")
        await conn.execute(f"NOTIFY {CHANNEL}")


async def remove(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> None:
    """The endpoint and its undelivered events (ON DELETE CASCADE)."""
    await _change(conn, tenant, endpoint_id, "DELETE FROM webhook_endpoint")


async def enable(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> None:
    await _change(conn, tenant, endpoint_id, "UPDATE webhook_endpoint SET enabled = true, "
                  "disabled_reason = NULL, disabled_at = NULL, failing_since = NULL")


async def rotate(conn: asyncpg.Connection, tenant: str, endpoint_id: str, secret: str) -> None:
    """A new signing secret; the previous one signs too until the next rotation (so a receiver
    can switch over without losing a request)."""
    await _change(conn, tenant, endpoint_id,
                  "UPDATE webhook_endpoint SET secrets = ARRAY[$3::text, secrets[1]]", secret)


async def disable(conn: asyncpg.Connection, endpoint_id: str, reason: str) -> int | None:
    """The sidecar's: an endpoint that answered 410 or failed for too long, disabled, and its
    tenant's admins' notice stored with it (fence/webhooks/notices.py); the notice's id (None: the
    endpoint is gone)."""
    async with conn.transaction():
        row = await conn.fetchrow("UPDATE webhook_endpoint SET enabled = false, disabled_reason = $2, "
                                  "disabled_at = now() WHERE id = $1 RETURNING tenant, url", endpoint_id,
                                  reason[:500])
        await conn.execute(f"NOTIFY {CHANNEL}")
        if row is None:
            return None
        return await notices.add(
            conn, row["tenant"], notices.WEBHOOK_DISABLED, endpoint_id,
            f"Webhook endpoint {endpoint_id} disabled",
            f"{row['url']} is disabled: {reason[:500]}. Its events wait for it: enable it (POST "
            f"/webhooks/{endpoint_id}/enable) once it answers again.")


async def set_failing(conn: asyncpg.Connection, endpoint_id: str, since: float | None) -> None:
    await conn.execute("UPDATE webhook_endpoint SET failing_since = $2 WHERE id = $1", endpoint_id, since)


async def failing_since(conn: asyncpg.Connection) -> dict[str, float]:
    rows = await conn.fetch("SELECT id, failing_since FROM webhook_endpoint WHERE failing_since IS NOT NULL")
    return {r["id"]: r["failing_since"] for r in rows}


@dataclass(frozen=True)
class Stats:
    to_deliver: int
    dead: int
    oldest_queued_at: float | None
    last_error: str | None
    failing_since: float | None
    disabled_at: str | None

    def to_json(self) -> dict[str, Any]:
        return {"to_deliver": self.to_deliver, "dead": self.dead,
                "oldest_queued_at": self.oldest_queued_at, "last_error": self.last_error,
                "failing_since": self.failing_since, "disabled_at": self.disabled_at}


async def stats(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> Stats:
    await get(conn, tenant, endpoint_id)
    # each by its partial index (state = 0: webhook_outbox_due; state = 2: webhook_outbox_dead)
    todo = await conn.fetchrow("SELECT count(*) AS n, min(queued_at) AS oldest FROM webhook_outbox "
                               "WHERE endpoint_id = $1 AND state = 0", endpoint_id)
    dead = await conn.fetchval("SELECT count(*) FROM webhook_outbox WHERE endpoint_id = $1 AND state = 2",
                               endpoint_id)
    last = await conn.fetchval("SELECT reason FROM webhook_outbox WHERE endpoint_id = $1 AND state = 0 "
                               "AND reason IS NOT NULL ORDER BY seq DESC LIMIT 1", endpoint_id)
    if last is None:
        last = await conn.fetchval("SELECT reason FROM webhook_outbox WHERE endpoint_id = $1 AND state = 2 "
                                   "ORDER BY seq DESC LIMIT 1", endpoint_id)
    e = await conn.fetchrow("SELECT failing_since, disabled_at FROM webhook_endpoint WHERE id = $1",
                            endpoint_id)
    return Stats(todo["n"], dead, todo["oldest"], last, e["failing_since"],
                 e["disabled_at"].isoformat() if e["disabled_at"] else None)


async def dead(conn: asyncpg.Connection, tenant: str, endpoint_id: str, after: int = 0,
               limit: int = 100) -> list[dict[str, Any]]:
    """The endpoint's given-up events, oldest first, from after seq `after` (a cursor)."""
    await get(conn, tenant, endpoint_id)
    rows = await conn.fetch(
        "SELECT seq, event_id, msg_id, attempts, reason, done_at, convert_from(body, 'UTF8') AS event "
        "FROM webhook_outbox WHERE endpoint_id = $1 AND state = 2 AND seq > $2 ORDER BY seq LIMIT $3",
        endpoint_id, after, min(max(limit, 1), MAX_PAGE))
    return [{**dict(r), "event": orjson.loads(r["event"])} for r in rows]


async def replay(conn: asyncpg.Connection, tenant: str, endpoint_id: str) -> int:
    """Every given-up event of the endpoint queued again (under its webhook-id); how many."""
    await get(conn, tenant, endpoint_id)
    async with conn.transaction():
        done = await conn.execute(
            "UPDATE webhook_outbox SET state = 0, attempts = 0, first_attempt = NULL, next_attempt = 0, "
            "done_at = NULL WHERE endpoint_id = $1 AND state = 2", endpoint_id)
        await conn.execute(f"NOTIFY {CHANNEL}")
    return int(done.split()[-1])


# --------------------------------------------------------------------------- the outbox


async def queue(conn: asyncpg.Connection, rows: Sequence[OutboxRow], now: float) -> list[tuple[str, int]]:
    """The rows queued, their seqs in the order given (an event already queued for an endpoint
    is not queued again; an endpoint removed meanwhile gets nothing); the (endpoint, lane) of
    each new one."""
    got = await conn.fetch(  # ORDER BY: the semi-join may reorder the rows, and seq is the order
        "INSERT INTO webhook_outbox (endpoint_id, event_id, lane, body, event_ts, queued_at) "
        "SELECT e, i, l, b, ts, $6 FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bytea[], "
        "$5::float8[]) WITH ORDINALITY AS r(e, i, l, b, ts, n) "
        "WHERE EXISTS (SELECT 1 FROM webhook_endpoint w WHERE w.id = r.e) ORDER BY n "
        "ON CONFLICT (endpoint_id, event_id) DO NOTHING RETURNING endpoint_id, lane",
        [r.endpoint_id for r in rows], [r.event_id for r in rows], [r.lane for r in rows],
        [r.body for r in rows], [r.event_ts for r in rows], now)
    return [(r["endpoint_id"], r["lane"]) for r in got]


@dataclass(frozen=True)
class Due:
    seq: int
    event_id: str
    msg_id: str | None
    body: bytes
    event_ts: float
    attempts: int
    first_attempt: float | None
    next_attempt: float


async def head(conn: asyncpg.Connection, endpoint_id: str, lane: int, limit: int) -> list[Due]:
    rows = await conn.fetch(
        "SELECT seq, event_id, msg_id, body, event_ts, attempts, first_attempt, next_attempt "
        "FROM webhook_outbox WHERE endpoint_id = $1 AND lane = $2 AND state = 0 ORDER BY seq LIMIT $3",
        endpoint_id, lane, limit)
    return [Due(*r) for r in rows]


async def pin(conn: asyncpg.Connection, endpoint_id: str, seqs: Sequence[int], msg_id: str,
              now: float) -> None:
    await conn.execute("UPDATE webhook_outbox SET msg_id = $3, first_attempt = $4 "
                       "WHERE seq = ANY($2::bigint[]) AND endpoint_id = $1", endpoint_id, list(seqs),
                       msg_id, now)


async def delivered(conn: asyncpg.Connection, endpoint_id: str, seqs: Sequence[int], now: float) -> None:
    await conn.execute("UPDATE webhook_outbox SET state = 1, attempts = attempts + 1, done_at = $3 "
                       "WHERE seq = ANY($2::bigint[]) AND endpoint_id = $1", endpoint_id, list(seqs), now)


async def failed(conn: asyncpg.Connection, endpoint_id: str, seqs: Sequence[int], reason: str,
                 next_attempt: float, msg_id: str, first_attempt: float) -> None:
    """A failed attempt; the request's id and first attempt are pinned here if they were not
    before it (a single event's id is a function of the event, so it needs no pin to be sent)."""
    await conn.execute("UPDATE webhook_outbox SET attempts = attempts + 1, reason = $3, next_attempt = $4, "
                       "msg_id = coalesce(msg_id, $5), first_attempt = coalesce(first_attempt, $6) "
                       "WHERE seq = ANY($2::bigint[]) AND endpoint_id = $1", endpoint_id, list(seqs),
                       reason[:500], next_attempt, msg_id, first_attempt)


async def give_up(conn: asyncpg.Connection, endpoint_id: str, seqs: Sequence[int], reason: str,
                  now: float, msg_id: str) -> None:
    await conn.execute("UPDATE webhook_outbox SET state = 2, attempts = attempts + 1, reason = $3, "
                       "done_at = $4, msg_id = coalesce(msg_id, $5) WHERE seq = ANY($2::bigint[]) "
                       "AND endpoint_id = $1", endpoint_id, list(seqs), reason[:500], now, msg_id)


async def backlogs(conn: asyncpg.Connection) -> dict[str, tuple[int, float | None]]:
    """Per endpoint: events to deliver and when the oldest was queued."""
    rows = await conn.fetch("SELECT endpoint_id, count(*) AS n, min(queued_at) AS oldest FROM webhook_outbox "
                            "WHERE state = 0 GROUP BY endpoint_id")
    return {r["endpoint_id"]: (r["n"], r["oldest"]) for r in rows}


async def purge(conn: asyncpg.Connection, now: float, limit: int = 20_000) -> int:
    """Delivered rows older than KEEP_DELIVERED_S and dead ones older than KEEP_DEAD_S (a
    bounded number per call); how many went."""
    gone = 0
    for state, before in ((DELIVERED, now - KEEP_DELIVERED_S), (DEAD, now - KEEP_DEAD_S)):
        done = await conn.execute(
            "DELETE FROM webhook_outbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM webhook_outbox "
            "WHERE state = $1 AND done_at < $2 LIMIT $3))", state, before, limit)
        gone += int(done.split()[-1])
    return gone
