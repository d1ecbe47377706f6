"""What one tenant may hold at most (issue 37): live fences, their vertices in all, follow fences
and proximity subscriptions (a venue owner's hives: fence/venues/owner_store.py HIVES_PER_OWNER,
hives belonging to an account, not a tenant). A tenant's limits are
the platform's defaults unless an operator set its own (`geofence tenant quota`, the table
tenant_quota); a tenant's admin reads them with what is used (`GET /tenants/{t}/quota`).

Each quota is checked inside the transaction that would exceed it, after taking the tenant's
row lock (`FOR NO KEY UPDATE`: two requests of one tenant check one after the other, so two
concurrent creations can never both take the last one; other tenants, and the foreign-key
checks of the pipeline's own writes, do not wait). A change that does not grow what it holds
(a rename, a smaller polygon, a follow fence moving) is never refused, even over a lowered
quota: a quota stops growth, it never takes away what is held.

Applied to the tenants' requests (the HTTP and AMQP fence API: fence/service.py); the
platform's own tools (the CLI, the demo, the benchmarks, the follower's moves) are the
operators' and are not limited.

Trade-off: counts are computed at each check (an indexed count and sum over the tenant's live
fences) rather than kept in counters: nothing can drift, at the cost of a scan of a tenant's
fences per creation (milliseconds for 10,000; fence creation is not a hot path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import shapely
from shapely.geometry.base import BaseGeometry


@dataclass(frozen=True)
class Resource:
    default: int
    what: str  # in a message: "{n} {what}"


RESOURCES: dict[str, Resource] = {
    "fences": Resource(10_000, "live fences"),
    "vertices": Resource(2_000_000, "vertices in its live fences"),
    "follow_fences": Resource(1_000, "follow fences"),
    "subscriptions": Resource(1_000, "proximity subscriptions"),
}


class QuotaExceeded(Exception):
    """A change that would take a tenant past its quota; the message says which and how far."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownResource(ValueError):
    pass


def vertices_of(geometry: BaseGeometry) -> int:
    """A fence's vertices as the quota counts them: every position of every ring (the closing
    one included), as the migration counts the stored GeoJSON."""
    return int(shapely.get_num_coordinates(geometry))


async def lock_tenant(conn: asyncpg.Connection, tenant: str) -> None:
    """Take the tenant's quota lock for the rest of the caller's transaction."""
    await conn.execute("SELECT 1 FROM tenant WHERE id = $1 FOR NO KEY UPDATE", tenant)


async def limits(conn: asyncpg.Connection, tenant: str) -> dict[str, int]:
    rows = await conn.fetch("SELECT resource, max FROM tenant_quota WHERE tenant = $1", tenant)
    own = {r["resource"]: int(r["max"]) for r in rows}
    return {k: own.get(k, r.default) for k, r in RESOURCES.items()}


async def usage(conn: asyncpg.Connection, tenant: str, without_fence: str = "") -> dict[str, int]:
    """What the tenant holds, leaving out the fence `without_fence` (the one being changed)."""
    row = await conn.fetchrow(
        "SELECT count(*) AS fences, coalesce(sum(vertices), 0) AS vertices, "
        "count(*) FILTER (WHERE follow_object IS NOT NULL) AS follow_fences "
        "FROM fence WHERE tenant = $1 AND deleted_at IS NULL AND id <> $2", tenant, without_fence)
    return {"fences": int(row["fences"]), "vertices": int(row["vertices"]),
            "follow_fences": int(row["follow_fences"]), "subscriptions": await _subscriptions(conn, tenant)}


async def _subscriptions(conn: asyncpg.Connection, tenant: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM roam_subscription WHERE tenant = $1", tenant))


def exceeded(tenant: str, held: dict[str, int], adding: dict[str, int], before: dict[str, int],
             caps: dict[str, int]) -> str | None:
    """Pure: the message for the first resource `adding` (what the tenant would hold of the
    changed thing) takes past its cap, where it also grows over `before` (what the thing held
    until now); None when within."""
    for k, n in adding.items():
        total = held[k] + n
        if total > caps[k] and n > before.get(k, 0):
            return (f"tenant {tenant!r} would hold {total:,} {RESOURCES[k].what}; its quota is "
                    f"{caps[k]:,} (an operator changes it: geofence tenant quota {tenant} --set {k}=N)")
    return None


async def check_fence(conn: asyncpg.Connection, tenant: str, fence_id: str, vertices: int, follow: bool,
                      before: dict[str, int]) -> None:
    """In the caller's transaction, after `lock_tenant`: a fence of `vertices` (following an
    object or not) stored under `fence_id`, which held `before` until now ({} for a new one);
    QuotaExceeded when it takes the tenant past a quota."""
    adding = {"fences": 1, "vertices": vertices, "follow_fences": int(follow)}
    held, caps = await usage(conn, tenant, fence_id), await limits(conn, tenant)
    message = exceeded(tenant, held, adding, before, caps)
    if message is not None:
        raise QuotaExceeded(message)


async def check_subscription(conn: asyncpg.Connection, tenant: str, sub_id: str) -> None:
    """In the caller's transaction, after `lock_tenant`: one more subscription (none if `sub_id`
    exists: a change)."""
    if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM roam_subscription WHERE id = $1)", sub_id):
        return
    held = {"subscriptions": await _subscriptions(conn, tenant)}  # the fences need no count here
    message = exceeded(tenant, held, {"subscriptions": 1}, {}, await limits(conn, tenant))
    if message is not None:
        raise QuotaExceeded(message)


async def set_quota(conn: asyncpg.Connection, tenant: str, resource: str, maximum: int | None) -> None:
    """Set a tenant's quota of `resource` (None: back to the platform's default)."""
    if resource not in RESOURCES:
        raise UnknownResource(f"no quota {resource!r}; quotas: {', '.join(RESOURCES)}")
    if maximum is None:
        await conn.execute("DELETE FROM tenant_quota WHERE tenant = $1 AND resource = $2", tenant, resource)
        return
    if maximum < 0:
        raise ValueError(f"{resource}: a quota is 0 or more, not {maximum}")
    await conn.execute("INSERT INTO tenant_quota (tenant, resource, max) VALUES ($1, $2, $3) "
                       "ON CONFLICT (tenant, resource) DO UPDATE SET max = EXCLUDED.max",
                       tenant, resource, maximum)


async def report(conn: asyncpg.Connection, tenant: str) -> dict[str, Any]:
    """Each quota of the tenant: its limit, what is used, whether the limit is the default."""
    caps, held = await limits(conn, tenant), await usage(conn, tenant)
    own = {r["resource"] for r in await conn.fetch("SELECT resource FROM tenant_quota WHERE tenant = $1",
                                                   tenant)}
    return {k: {"max": caps[k], "used": held[k], "default": k not in own} for k in RESOURCES}
