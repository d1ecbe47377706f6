"""Occupancy notifications on the live stack. Through the API (a Firebase user from the Auth
emulator) a user favourites a hive, registers a device token and asks to be told when it has
40 people or more; a sensor's reports cross the threshold; the sidecar's notifier logs one
message (`local`: the local stack has no FCM credentials) and disarms the definition.

Cloud Messaging has no emulator, so the notifier's handling of FCM's answers runs here in the
test process against the real PostgreSQL with a recording sender: a transient failure is
retried, a dead token is deleted, a device past its budget is throttled, every outcome logged.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import httpx
import pytest

from deploy import firebase_emulator as fe
from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges.shell import Counters
from fence.venues import notify_rules as nr
from fence.venues import push
from fence.venues import sensor_frames as sf
from fence.venues.notifier import Notifier
from tests.integration.clients import DEADLINE, Device, MqttDevice

pytestmark = pytest.mark.integration
WAIT = 60.0


@pytest.fixture
async def place(stack: ConnectionSettings) -> AsyncIterator[tuple[str, str, str, asyncpg.Connection]]:
    """(hive id, sensor id, sensor password, a PostgreSQL connection)."""
    run = uuid.uuid4().hex[:8]
    hive_id, sensor_id = f"nt-{run}", f"nt-{run}-s"
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    await pg.execute("INSERT INTO hive (id, name, type, lon, lat, tz, capacity) "
                     "VALUES ($1, $2, 'bar', 9.52, 47.14, 'Europe/Vaduz', 60)",
                     hive_id, f"Notify bar {run}")
    await pg.execute("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)", sensor_id, hive_id)
    settings = Settings.from_env()
    password = devices.add_sensor(settings, load_secrets(settings), sensor_id, None, lambda *_: None)
    try:
        yield hive_id, sensor_id, password, pg
    finally:
        await pg.execute("DELETE FROM sensor_report WHERE sensor_id = $1", sensor_id)
        await pg.execute("DELETE FROM sensor WHERE id = $1", sensor_id)
        for table in ("notification_log", "user_notification_def", "user_hive", "hive_status", "hive_day"):
            await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
        await pg.close()
        devices.remove_sensor(settings, load_secrets(settings), sensor_id, lambda *_: None)


def user(stack: ConnectionSettings) -> tuple[str, dict[str, str]]:
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    email = f"{uuid.uuid4().hex[:12]}@example.org"
    uid, token = fe.sign_up(host, int(port), stack["firebase"]["project"], email, uuid.uuid4().hex)
    return uid, {"Authorization": f"Bearer {token}"}


async def test_a_user_is_told_once_when_the_place_gets_busy(
        stack: ConnectionSettings, place: tuple[str, str, str, asyncpg.Connection]) -> None:
    hive_id, sensor_id, password, pg = place
    uid, auth = user(stack)
    device_token = f"fcm-{uuid.uuid4().hex}"
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        assert (await http.put(f"/me/favourites/{hive_id}", headers=auth)).status_code == 204
        assert (await http.post(f"/me/hives/{hive_id}/viewed", headers=auth)).status_code == 204
        mine = (await http.get("/me/hives", headers=auth)).json()
        assert mine == {"favourites": [hive_id], "recent": [hive_id]}
        assert (await http.put(f"/me/favourites/{hive_id}")).status_code == 401  # a token is needed
        assert (await http.put("/me/favourites/no-such-hive", headers=auth)).status_code == 404
        r = await http.post("/me/device-tokens", headers=auth,
                            json={"token": device_token, "platform": "android"})
        assert r.status_code == 204
        bad = await http.post("/me/notifications", headers=auth, json={"hive_id": hive_id, "threshold": -1,
                                                                       "direction": "above"})
        assert bad.status_code == 422 and "threshold" in bad.json()["error"]
        r = await http.post("/me/notifications", headers=auth,
                            json={"hive_id": hive_id, "threshold": 40, "direction": "above"})
        assert r.status_code == 201
        def_id = r.json()["id"]

        sensor = MqttDevice(stack, Device(sensor_id, password))
        try:
            t = time.gmtime(time.time() - 120)
            local = (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)
            # a baseline, then 45 in (crossing 40), 3 out (still above), 3 in (no new crossing)
            for tin, tout in ((100, 50), (145, 50), (145, 53), (148, 53)):
                sensor.client.publish(f"sensors/{sensor_id}/counter",
                                      sf.encode_legacy(tin, tout, local, sf.REPORT_EVENTS), qos=1)
                sensor.expect("puback")
        finally:
            sensor.close()
        logs: list[Any] = []

        async def logged() -> bool:
            logs[:] = await pg.fetch("SELECT * FROM notification_log WHERE hive_id = $1", hive_id)
            st = await pg.fetchval("SELECT entries FROM hive_status WHERE hive_id = $1", hive_id)
            return bool(logs) and st == 48

        end = time.monotonic() + WAIT
        while not await logged() and time.monotonic() < end:
            await asyncio.sleep(0.1)
        assert len(logs) == 1, logs
        log = logs[0]
        assert (log["uid"], log["token"], log["status"]) == (uid, device_token, push.LOCAL)
        assert log["def_id"] == def_id
        assert log["title"] == f"Notify bar {hive_id[3:]} is getting busy" and log["occupancy"] >= 40
        mine = (await http.get("/me/notifications", headers=auth)).json()["notifications"]
        assert [(n["id"], n["armed"]) for n in mine] == [(def_id, False)] and mine[0]["last_sent_at"]
        assert (await http.delete(f"/me/notifications/{def_id}", headers=auth)).status_code == 204
        assert (await http.delete(f"/me/device-tokens/{device_token}", headers=auth)).status_code == 204


class Recording:
    """The FCM double: records every push, answers from a script per token."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.sent: list[push.Push] = []

    async def send(self, pushes: Sequence[push.Push]) -> list[push.PushResult]:
        out = []
        for p in pushes:
            self.sent.append(p)
            script = self.answers.get(p.token) or [push.SENT]
            status = script.pop(0) if len(script) > 1 else script[0]
            out.append(push.PushResult(status, f"m-{len(self.sent)}" if status == push.SENT else None,
                                       None if status == push.SENT else f"{status} (double)"))
        return out


async def test_the_notifier_retries_drops_dead_tokens_and_keeps_the_device_budget(
        place: tuple[str, str, str, asyncpg.Connection]) -> None:
    hive_id, _, _, pg = place
    uid = f"u-{uuid.uuid4().hex[:8]}"
    flaky, dead, fine = (f"{k}-{uuid.uuid4().hex[:8]}" for k in ("flaky", "dead", "fine"))
    for token in (flaky, dead, fine):
        await pg.execute("INSERT INTO device_token (token, uid) VALUES ($1, $2)", token, uid)
    def_id = await pg.fetchval("INSERT INTO user_notification_def (uid, hive_id, threshold, direction) "
                               "VALUES ($1, $2, 10, 'above') RETURNING id", uid, hive_id)
    sender = Recording({flaky: [push.TRANSIENT, push.SENT], dead: [push.UNREGISTERED]})
    notifier = Notifier(sender, Counters())
    try:
        now = time.time()
        await notifier.notify(pg, {hive_id: (12, now)})
        rows = await pg.fetch("SELECT token, status FROM notification_log WHERE def_id = $1 ORDER BY id",
                              def_id)
        assert sorted((r["token"], r["status"]) for r in rows) == sorted(
            [(flaky, push.SENT), (dead, push.UNREGISTERED), (fine, push.SENT)])
        assert [p.token for p in sender.sent].count(flaky) == 2  # tried again after the transient failure
        assert await pg.fetchval("SELECT count(*) FROM device_token WHERE token = $1", dead) == 0
        assert await pg.fetchval("SELECT armed FROM user_notification_def WHERE id = $1", def_id) is False
        # the same occupancy again: nothing (disarmed); back under, then over after the cool-down: again
        await notifier.notify(pg, {hive_id: (13, now + 60)})
        await notifier.notify(pg, {hive_id: (5, now + 120)})
        await notifier.notify(pg, {hive_id: (11, now + nr.COOLDOWN_S + 200)})
        assert await pg.fetchval("SELECT count(*) FROM notification_log WHERE def_id = $1", def_id) == 5
        # a device past its FCM budget: throttled, logged
        later = now + 2 * nr.COOLDOWN_S + 400
        await notifier.notify(pg, {hive_id: (5, later - 60)})
        for _ in range(nr.BURST):  # the device had its burst just now
            assert notifier.buckets.take(fine, later)
        await notifier.notify(pg, {hive_id: (11, later)})
        last = await pg.fetch("SELECT token, status FROM notification_log WHERE def_id = $1 "
                              "ORDER BY id DESC LIMIT 2", def_id)
        assert {(r["token"], r["status"]) for r in last} == {(fine, "throttled"), (flaky, push.SENT)}
    finally:
        await pg.execute("DELETE FROM device_token WHERE uid = $1", uid)


async def test_the_owner_is_alerted_once_to_a_silent_sensor_and_a_low_battery(
        place: tuple[str, str, str, asyncpg.Connection]) -> None:
    hive_id, sensor_id, _, pg = place
    owner, token = f"o-{uuid.uuid4().hex[:8]}", f"owner-{uuid.uuid4().hex[:8]}"
    await pg.execute("INSERT INTO owner_account (uid, name) VALUES ($1, 'Owner')", owner)
    await pg.execute("UPDATE hive SET owner_uid = $1 WHERE id = $2", owner, hive_id)
    await pg.execute("INSERT INTO device_token (token, uid) VALUES ($1, $2)", token, owner)
    sender = Recording({})
    notifier = Notifier(sender, Counters())
    now = time.time()
    interval = await pg.fetchval("SELECT report_interval_min FROM sensor WHERE id = $1", sensor_id)
    later = now + 2 * 60 * interval + 60  # silent by then (the live sidecar's clock is not there yet)
    try:
        assert await notifier.watch_sensors(pg, now, [hive_id]) == (0, 0)  # just registered: fine
        assert await notifier.watch_sensors(pg, later, [hive_id]) == (1, 0)
        await pg.execute("INSERT INTO sensor_status (sensor_id, received_at, startup_time, battery_mv, "
                         "sensor_state, discarded_events, gprs_signal, firmware_version, configuration_id) "
                         "VALUES ($1, now(), 0, 3300, 1, 0, 15, 1, 0)", sensor_id)
        assert await notifier.watch_sensors(pg, later + 1, [hive_id]) == (1, 0)  # the battery; silent kept
        assert await notifier.watch_sensors(pg, later + 2, [hive_id]) == (0, 0)  # once per condition
        assert [(p.token, p.data["alert"]) for p in sender.sent] == [(token, "silent"),
                                                                     (token, "low_battery")]
        assert sender.sent[0].title == f"Sensor {sensor_id} at Notify bar {hive_id[3:]} is silent"
        logged = await pg.fetch("SELECT l.status, a.kind FROM notification_log l JOIN sensor_alert a "
                                "ON a.id = l.alert_id WHERE l.hive_id = $1 ORDER BY l.id", hive_id)
        assert [(r["status"], r["kind"]) for r in logged] == [(push.SENT, "silent"),
                                                              (push.SENT, "low_battery")]

        # a report and a good battery (above the threshold by the margin) clear both
        await pg.execute("UPDATE sensor SET last_report_at = to_timestamp($2) WHERE id = $1",
                         sensor_id, later)
        await pg.execute("INSERT INTO sensor_status (sensor_id, received_at, startup_time, battery_mv, "
                         "sensor_state, discarded_events, gprs_signal, firmware_version, configuration_id) "
                         "VALUES ($1, now() + interval '1 second', 0, 3450, 1, 0, 15, 1, 0)", sensor_id)
        assert await notifier.watch_sensors(pg, later + 3, [hive_id]) == (0, 1)  # 3450 < 3400 + 100: kept
        await pg.execute("UPDATE sensor_status SET battery_mv = 3600 WHERE sensor_id = $1 "
                         "AND battery_mv = 3450", sensor_id)
        assert await notifier.watch_sensors(pg, later + 4, [hive_id]) == (0, 1)
        assert await pg.fetchval("SELECT count(*) FROM sensor_alert WHERE sensor_id = $1 "
                                 "AND cleared_at IS NULL", sensor_id) == 0
    finally:
        await pg.execute("DELETE FROM notification_log WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM sensor_alert WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM sensor_status WHERE sensor_id = $1", sensor_id)
        await pg.execute("DELETE FROM device_token WHERE uid = $1", owner)
        await pg.execute("UPDATE hive SET owner_uid = NULL WHERE id = $1", hive_id)
        await pg.execute("DELETE FROM owner_account WHERE uid = $1", owner)
