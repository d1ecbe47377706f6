"""What the platform tells a tenant's admins (migration 0030, `tenant_notice`): a notice is
stored with the change that causes it (a webhook endpoint disabled: fence/webhooks/store.py
`disable`), then pushed to every admin's registered devices (`device_token`, the same Cloud
Messaging sender as the venue notifications: fence/venues/push.py), and listed to the tenant's
admins (`GET /notices`, `geofence webhook notices`).

Trade-off: a notice is stored before it is pushed, in the change's own transaction: a crash
between the commit and the push leaves it unpushed (`pushed` 0, visible in the list) rather than
pushed for a change that did not happen.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from fence.venues import push

log = logging.getLogger("geofence")
MAX_PAGE = 100
WEBHOOK_DISABLED = "webhook.disabled"


async def add(conn: asyncpg.Connection, tenant: str, kind: str, subject: str, title: str, body: str) -> int:
    """A notice stored (inside the caller's transaction, if any); its id."""
    notice_id: int = await conn.fetchval(
        "INSERT INTO tenant_notice (tenant, kind, subject, title, body) VALUES ($1, $2, $3, $4, $5) "
        "RETURNING id", tenant, kind, subject[:200], title[:200], body[:2000])
    return notice_id


async def push_to_admins(conn: asyncpg.Connection, sender: push.Sender, notice_id: int) -> int:
    """The stored notice pushed to each device of each admin of its tenant; how many took it.
    A device the push service says is gone is forgotten (as the venue notifier does)."""
    n = await conn.fetchrow("SELECT tenant, kind, subject, title, body FROM tenant_notice WHERE id = $1",
                            notice_id)
    if n is None:
        return 0
    tokens = await conn.fetch(
        "SELECT d.token FROM device_token d JOIN tenant_member m ON m.uid = d.uid "
        "WHERE m.tenant = $1 AND m.role = 'admin' ORDER BY d.token", n["tenant"])
    pushes = [push.Push(r["token"], n["title"], n["body"], "", {"kind": n["kind"], "tenant": n["tenant"],
                                                               "subject": n["subject"]},
                        collapse=f"{n['kind']}-{n['subject']}") for r in tokens]
    results = await sender.send(pushes)
    reached = sum(r.status in (push.SENT, push.LOCAL) for r in results)
    gone = [p.token for p, r in zip(pushes, results, strict=True) if r.status == push.UNREGISTERED]
    async with conn.transaction():
        if gone:
            await conn.execute("DELETE FROM device_token WHERE token = ANY($1::text[])", gone)
        await conn.execute("UPDATE tenant_notice SET pushed = $2 WHERE id = $1", notice_id, reached)
    log.info("notice %d (%s, tenant %s) pushed to %d of %d admin device(s)", notice_id, n["kind"],
             n["tenant"], reached, len(pushes))
    return reached


async def page(conn: asyncpg.Connection, tenant: str, after: int = 0,
               limit: int = MAX_PAGE) -> list[dict[str, Any]]:
    """A tenant's notices, oldest first, after the id `after` (the cursor)."""
    rows = await conn.fetch("SELECT id, kind, subject, title, body, pushed, created_at FROM tenant_notice "
                            "WHERE tenant = $1 AND id > $2 ORDER BY id LIMIT $3", tenant, after, limit)
    return [{**dict(r), "created_at": r["created_at"].isoformat()} for r in rows]
