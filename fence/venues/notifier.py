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

Owner alerts (`watch_sensors`, every WATCH_EVERY_S): every sensor's health against
sensor_alerts.decide; a new alert is stored, pushed to the hive owner's devices and logged in
one transaction (so, as above, a crash may push it twice, never lose it); an ended one cleared.
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
from fence.venues import sensor_alerts as sa

log = logging.getLogger("geofence")
PUSH_TRIES = 3
WATCH_EVERY_S = 60.0


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
        self.open_alerts = {sa.SILENT: 0, sa.LOW_BATTERY: 0}  # as of the last watch (for /metrics)

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
        results, dead = await self._deliver([p for *_, p in pushes])
        for (def_id, uid, hive_id, occupancy, p), res in zip(pushes, results, strict=True):
            logs.append((def_id, uid, hive_id, p.token, occupancy, res.status, res.error, res.message_id,
                         p.title))
        async with conn.transaction():
            if states:
                await conn.executemany(
                    "UPDATE user_notification_def SET armed = $2, last_sent_at = $3 WHERE id = $1", states)
            if logs:
                await conn.executemany(
                    "INSERT INTO notification_log (def_id, uid, hive_id, token, occupancy, status, error, "
                    "message_id, title) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)", logs)
            await _forget(conn, dead)

    async def watch_sensors(self, conn: asyncpg.Connection, now: float,
                            hive_ids: Sequence[str] | None = None) -> tuple[int, int]:
        """Raise and clear owner alerts (of `hive_ids`' sensors, default all); (raised, cleared)."""
        rows = await conn.fetch(
            "SELECT s.id, s.hive_id, h.name, h.owner_uid, s.report_interval_min, s.low_battery_mv, "
            "s.created_at, s.last_report_at, "
            "(SELECT x.battery_mv FROM sensor_status x WHERE x.sensor_id = s.id "
            " ORDER BY x.received_at DESC LIMIT 1) AS battery_mv, "
            "ARRAY(SELECT a.kind FROM sensor_alert a WHERE a.sensor_id = s.id AND a.cleared_at IS NULL) "
            "AS open_kinds FROM sensor s JOIN hive h ON h.id = s.hive_id "
            "WHERE $1::text[] IS NULL OR s.hive_id = ANY($1::text[])",
            None if hive_ids is None else list(hive_ids))
        raised: list[tuple[sa.SensorHealth, str, str]] = []
        cleared: list[tuple[str, str]] = []
        open_now = {sa.SILENT: 0, sa.LOW_BATTERY: 0}
        for r in rows:
            h = sa.SensorHealth(r["id"], r["hive_id"], r["name"], r["owner_uid"], r["report_interval_min"],
                                r["low_battery_mv"], r["created_at"].timestamp(),
                                r["last_report_at"].timestamp() if r["last_report_at"] else None,
                                r["battery_mv"])
            up, down = sa.decide(h, set(r["open_kinds"]), now)
            raised += [(h, kind, detail) for kind, detail in up]
            cleared += [(h.sensor_id, kind) for kind in down]
            for kind in (set(r["open_kinds"]) - set(down)) | {k for k, _ in up}:
                open_now[kind] = open_now.get(kind, 0) + 1
        if hive_ids is None:
            self.open_alerts = open_now
        if cleared:
            await conn.executemany("UPDATE sensor_alert SET cleared_at = now() WHERE sensor_id = $1 "
                                   "AND kind = $2 AND cleared_at IS NULL", cleared)
        if not raised:
            return 0, len(cleared)
        owners = sorted({h.owner_uid for h, _, _ in raised if h.owner_uid})
        tokens: dict[str, list[str]] = {}
        for r in await conn.fetch("SELECT uid, token FROM device_token WHERE uid = ANY($1::text[])", owners):
            tokens.setdefault(r["uid"], []).append(r["token"])
        async with conn.transaction():
            pushes: list[tuple[int, sa.SensorHealth, push.Push]] = []
            logs: list[tuple[Any, ...]] = []
            stored = 0
            for h, kind, detail in raised:
                alert_id = await conn.fetchval(
                    "INSERT INTO sensor_alert (sensor_id, hive_id, kind, detail) VALUES ($1, $2, $3, $4) "
                    "ON CONFLICT (sensor_id, kind) WHERE cleared_at IS NULL DO NOTHING RETURNING id",
                    h.sensor_id, h.hive_id, kind, detail)
                if alert_id is None:  # raised meanwhile (another instance during a handover)
                    continue
                stored += 1
                if h.owner_uid is None:
                    continue
                title, body = sa.message_text(h, kind, detail)
                for token in tokens.get(h.owner_uid, []):
                    if not self.buckets.take(token, now):
                        logs.append((alert_id, h.owner_uid, h.hive_id, token, "throttled", None, None, title))
                        continue
                    pushes.append((alert_id, h, push.Push(token, title, body, h.hive_id,
                                                          {"sensor_id": h.sensor_id, "alert": kind})))
            results, dead = await self._deliver([p for _, _, p in pushes])
            for (alert_id, h, p), res in zip(pushes, results, strict=True):
                logs.append((alert_id, h.owner_uid, h.hive_id, p.token, res.status, res.error, res.message_id,
                             p.title))
            if logs:
                await conn.executemany(
                    "INSERT INTO notification_log (alert_id, uid, hive_id, token, status, error, message_id, "
                    "title) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", logs)
            await _forget(conn, dead)
        self.counters.bump("sensor_alerts", stored)
        return stored, len(cleared)

    async def _deliver(self, pushes: list[push.Push]) -> tuple[list[push.PushResult], list[str]]:
        """Send (with retries), count the outcomes; the results and the dead tokens."""
        results = await self._send(pushes)
        for res in results:
            self.counters.bump(f"push_{res.status}")
        return results, [p.token for p, res in zip(pushes, results, strict=True)
                         if res.status == push.UNREGISTERED]

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


async def _forget(conn: asyncpg.Connection, tokens: list[str]) -> None:
    """FCM said these tokens are dead (the app was uninstalled, the token rotated)."""
    if tokens:
        await conn.execute("DELETE FROM device_token WHERE token = ANY($1::text[])", tokens)


def _ts(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, UTC)
