"""An app user's own venue data (Firebase uid only): favourite and recent hives, notification
definitions, device tokens. The API's `/me/...` routes call these; each refuses bad input
with `UserError(status, message)`."""

from __future__ import annotations

from datetime import time
from typing import Any

import asyncpg

MAX_DEFINITIONS = 50  # per user
MAX_TOKENS = 20  # per user: the oldest go first
MAX_THRESHOLD = 100_000


class UserError(ValueError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def _hive_exists(conn: asyncpg.Connection, hive_id: str) -> None:
    if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM hive WHERE id = $1)", hive_id):
        raise UserError(404, f"no hive {hive_id!r}")


async def set_favourite(pool: asyncpg.Pool, uid: str, hive_id: str, favourite: bool) -> None:
    async with pool.acquire() as conn:
        await _hive_exists(conn, hive_id)
        await conn.execute("INSERT INTO user_hive (uid, hive_id, favourite) VALUES ($1, $2, $3) "
                           "ON CONFLICT (uid, hive_id) DO UPDATE SET favourite = EXCLUDED.favourite",
                           uid, hive_id, favourite)


async def viewed(pool: asyncpg.Pool, uid: str, hive_id: str) -> None:
    async with pool.acquire() as conn:
        await _hive_exists(conn, hive_id)
        await conn.execute("INSERT INTO user_hive (uid, hive_id, last_viewed_at) VALUES ($1, $2, now()) "
                           "ON CONFLICT (uid, hive_id) DO UPDATE SET last_viewed_at = now()", uid, hive_id)


async def my_hives(pool: asyncpg.Pool, uid: str, recent: int = 20) -> dict[str, list[str]]:
    rows = await pool.fetch("SELECT hive_id, favourite, last_viewed_at FROM user_hive WHERE uid = $1", uid)
    favourites = sorted(r["hive_id"] for r in rows if r["favourite"])
    seen = sorted((r for r in rows if r["last_viewed_at"] is not None), key=lambda r: r["last_viewed_at"],
                  reverse=True)
    return {"favourites": favourites, "recent": [r["hive_id"] for r in seen[:recent]]}


def _time(value: Any, name: str) -> time | None:
    if value is None:
        return None
    try:
        h, m = str(value).split(":")
        return time(int(h), int(m))
    except ValueError:
        raise UserError(422, f"{name}: HH:MM expected, not {value!r}") from None


async def add_definition(pool: asyncpg.Pool, uid: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise UserError(422, "a JSON object expected")
    unknown = set(body) - {"hive_id", "threshold", "direction", "quiet_start", "quiet_end"}
    if unknown:
        raise UserError(422, f"unknown field(s): {', '.join(sorted(unknown))}")
    hive_id, threshold, direction = body.get("hive_id"), body.get("threshold"), body.get("direction")
    if not isinstance(hive_id, str) or not hive_id:
        raise UserError(422, "hive_id: a hive id expected")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 0 <= threshold <= MAX_THRESHOLD:
        raise UserError(422, f"threshold: people, an integer in [0, {MAX_THRESHOLD}]")
    if direction not in ("above", "below"):
        raise UserError(422, "direction: above or below")
    qs, qe = _time(body.get("quiet_start"), "quiet_start"), _time(body.get("quiet_end"), "quiet_end")
    if (qs is None) != (qe is None):
        raise UserError(422, "quiet_start and quiet_end go together")
    async with pool.acquire() as conn:
        await _hive_exists(conn, hive_id)
        have = await conn.fetchval("SELECT count(*) FROM user_notification_def WHERE uid = $1", uid)
        if have >= MAX_DEFINITIONS:
            raise UserError(409, f"at most {MAX_DEFINITIONS} notifications per user")
        def_id = await conn.fetchval(
            "INSERT INTO user_notification_def (uid, hive_id, threshold, direction, quiet_start, "
            "quiet_end) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (uid, hive_id, threshold, direction) "
            "DO UPDATE SET quiet_start = EXCLUDED.quiet_start, quiet_end = EXCLUDED.quiet_end "
            "RETURNING id",
            uid, hive_id, threshold, direction, qs, qe)
    return {"id": def_id, "hive_id": hive_id, "threshold": threshold, "direction": direction,
            "quiet_start": body.get("quiet_start"), "quiet_end": body.get("quiet_end")}


async def definitions(pool: asyncpg.Pool, uid: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT id, hive_id, threshold, direction, quiet_start, quiet_end, armed, "
                            "last_sent_at FROM user_notification_def WHERE uid = $1 ORDER BY id", uid)
    return [{"id": r["id"], "hive_id": r["hive_id"], "threshold": r["threshold"],
             "direction": r["direction"],
             "quiet_start": r["quiet_start"].strftime("%H:%M") if r["quiet_start"] else None,
             "quiet_end": r["quiet_end"].strftime("%H:%M") if r["quiet_end"] else None,
             "armed": r["armed"],
             "last_sent_at": r["last_sent_at"].timestamp() if r["last_sent_at"] else None}
            for r in rows]


async def remove_definition(pool: asyncpg.Pool, uid: str, def_id: int) -> None:
    done = await pool.execute("DELETE FROM user_notification_def WHERE id = $1 AND uid = $2", def_id, uid)
    if done.endswith(" 0"):
        raise UserError(404, f"no notification {def_id} of yours")


async def add_token(pool: asyncpg.Pool, uid: str, token: Any, platform: Any) -> None:
    """A device token for the user (a token moves to the user who registers it last)."""
    if not isinstance(token, str) or not 1 <= len(token) <= 4096:
        raise UserError(422, "token: an FCM registration token expected")
    if platform is not None and (not isinstance(platform, str) or len(platform) > 32):
        raise UserError(422, "platform: android, ios, web or other")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("INSERT INTO device_token (token, uid, platform) VALUES ($1, $2, $3) "
                           "ON CONFLICT (token) DO UPDATE SET uid = EXCLUDED.uid, "
                           "platform = EXCLUDED.platform, last_seen_at = now()", token, uid, platform or "")
        await conn.execute("DELETE FROM device_token WHERE uid = $1 AND token IN (SELECT token FROM "
                           "device_token WHERE uid = $1 ORDER BY last_seen_at DESC OFFSET $2)",
                           uid, MAX_TOKENS)


async def remove_token(pool: asyncpg.Pool, uid: str, token: str) -> None:
    done = await pool.execute("DELETE FROM device_token WHERE token = $1 AND uid = $2", token, uid)
    if done.endswith(" 0"):
        raise UserError(404, "no such device token of yours")
