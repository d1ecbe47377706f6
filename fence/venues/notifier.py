"""The notifier: hive occupancy (queue venue.notify, bound to venue.occupancy) in, push
notifications out. It runs in the sensor sidecar's session, on its own queue, so a slow push
service never holds up the counting.

Per batch of occupancy messages (the newest per hive counts): the definitions of those hives
(user_notification_def, with their state), `notify_rules.decide` for each, the users' device
tokens, the device's budget (`TokenBucket`), then the pushes (`push.Sender`): transient
failures retried with backoff (PUSH_TRIES), a dead token deleted. Every outcome goes to
notification_log, the definitions' new state back to PostgreSQL, in one transaction; then the
batch is acked. A crash before the commit sends the batch again: the definitions' state is
the one before it, so a user may get one message twice, never none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from exchanges import shell
from exchanges.contract import InvalidMessage
from fence.venues import notify_rules as nr
from fence.venues import push

log = logging.getLogger("geofence")
PUSH_TRIES = 3


def occupancy_of(body: bytes) -> tuple[str, int, float]:
    """(hive id, occupancy, at) of a venue.occupancy message; InvalidMessage says why not."""
    try:
        d = orjson.loads(body)
        hive_id, occupancy, at = str(d["hive_id"]), int(d["occupancy"]), float(d["at"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidMessage(f"occupancy message: {exc!r}") from None
    return hive_id, occupancy, at


class Notifier:
    def __init__(self, sender: push.Sender, counters: shell.Counters) -> None:
        self.sender = sender
        self.counters = counters
        self.buckets = nr.TokenBucket()

    async def handle(self, conn: asyncpg.Connection, messages: Sequence[AbstractIncomingMessage],
                     dead_letter: Any) -> None:
        newest: dict[str, tuple[int, float]] = {}
        for m in messages:
            try:
                hive_id, occupancy, at = occupancy_of(m.body)
            except InvalidMessage as exc:
                dead_letter(m, exc.reason)
                continue
            if hive_id not in newest or at >= newest[hive_id][1]:
                newest[hive_id] = (occupancy, at)
        if newest:
            await self.notify(conn, newest)

    async def notify(self, conn: asyncpg.Connection, newest: dict[str, tuple[int, float]]) -> None:
        rows = await conn.fetch(
            "SELECT d.id, d.uid, d.hive_id, d.threshold, d.direction, d.quiet_start, d.quiet_end, "
            "d.armed, d.last_sent_at, h.name, h.tz, h.capacity FROM user_notification_def d "
            "JOIN hive h ON h.id = d.hive_id WHERE d.hive_id = ANY($1::text[])", list(newest))
        if not rows:
            return
        tokens: dict[str, list[str]] = {}
        for r in await conn.fetch("SELECT uid, token FROM device_token WHERE uid = ANY($1::text[])",
                                  sorted({r["uid"] for r in rows})):
            tokens.setdefault(r["uid"], []).append(r["token"])
        logs: list[tuple[Any, ...]] = []
        states: list[tuple[int, bool, datetime | None]] = []
        pushes: list[tuple[int, str, str, int, push.Push]] = []
        for r in rows:
            d = nr.Definition(r["id"], r["uid"], r["hive_id"], r["threshold"], r["direction"],
                              r["quiet_start"], r["quiet_end"])
            before = (r["armed"], r["last_sent_at"].timestamp() if r["last_sent_at"] else None)
            state = nr.DefState(*before)
            occupancy, at = newest[d.hive_id]
            what = nr.decide(d, state, occupancy, r["tz"], at)
            if (state.armed, state.last_sent_at) != before:
                states.append((d.def_id, state.armed, _ts(state.last_sent_at)))
            if what == nr.QUIET:
                logs.append((d.def_id, d.uid, d.hive_id, None, occupancy, nr.QUIET, None, None, ""))
            if what != nr.SEND:
                continue
            title, body = nr.message_text(r["name"], occupancy, r["capacity"], d)
            for token in tokens.get(d.uid, []):
                if not self.buckets.take(token, at):
                    logs.append((d.def_id, d.uid, d.hive_id, token, occupancy, "throttled", None, None,
                                 title))
                    continue
                pushes.append((d.def_id, d.uid, d.hive_id, occupancy,
                               push.Push(token, title, body, d.hive_id, {"occupancy": str(occupancy)})))
        results = await self._send([p for *_, p in pushes])
        dead = []
        for (def_id, uid, hive_id, occupancy, p), res in zip(pushes, results, strict=True):
            logs.append((def_id, uid, hive_id, p.token, occupancy, res.status, res.error, res.message_id,
                         p.title))
            if res.status == push.UNREGISTERED:
                dead.append(p.token)
            self.counters.bump(f"push_{res.status}")
        async with conn.transaction():
            if states:
                await conn.executemany(
                    "UPDATE user_notification_def SET armed = $2, last_sent_at = $3 WHERE id = $1", states)
            if logs:
                await conn.executemany(
                    "INSERT INTO notification_log (def_id, uid, hive_id, token, occupancy, status, error, "
                    "message_id, title) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)", logs)
            if dead:
                await conn.execute("DELETE FROM device_token WHERE token = ANY($1::text[])", dead)

    async def _send(self, pushes: list[push.Push]) -> list[push.PushResult]:
        """Transient failures tried again (PUSH_TRIES in all, backoff 0.5 s, 1 s, ...)."""
        results: list[push.PushResult | None] = [None] * len(pushes)
        todo = list(range(len(pushes)))
        for attempt in range(PUSH_TRIES):
            if not todo:
                break
            if attempt:
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))  # backoff before a retry
            got = await self.sender.send([pushes[i] for i in todo])
            again = []
            for i, res in zip(todo, got, strict=True):
                results[i] = res
                if res.status == push.TRANSIENT and attempt + 1 < PUSH_TRIES:
                    again.append(i)
            todo = again
        return [r if r is not None else push.PushResult(push.FAILED, None, "not sent") for r in results]


def _ts(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, UTC)
