"""A venue owner on the live stack: adds a hive through the API (a Firebase user of the Auth
emulator), the operator installs a sensor (`geofence sensor add`), the owner pushes it a
configuration, the sensor (its own MQTT login) receives the 12 bytes on
commands/sensor/<id> and answers with a status carrying the configuration id, and the
owner's sensor view shows it applied, with the battery flagged low."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from fence import page_models as pm
from fence.venues import sensor_frames as sf
from fence.venues.occupancy import business_day
from tests.integration.clients import DEADLINE, Device, MqttDevice, geofence
from tests.model_check import described

pytestmark = pytest.mark.integration
WAIT = 60.0


def account(stack: ConnectionSettings) -> tuple[str, dict[str, str]]:
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    email = f"{uuid.uuid4().hex[:12]}@example.org"
    uid, token = fe.sign_up(host, int(port), stack["firebase"]["project"], email, uuid.uuid4().hex)
    return uid, {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def ids(stack: ConnectionSettings) -> AsyncIterator[tuple[str, str]]:
    run = uuid.uuid4().hex[:8]
    hive_id, sensor_id = f"ow-{run}", f"ow-{run}-s"
    yield hive_id, sensor_id
    geofence("sensor", "remove", sensor_id, "--purge")
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    for table in ("hive_status", "hive_day", "venue_hourly", "venue_day", "venue_profile", "venue_forecast"):
        await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
    await pg.execute("DELETE FROM sensor_report WHERE sensor_id IN "
                     "(SELECT id FROM sensor WHERE hive_id = $1)", hive_id)
    await pg.execute("DELETE FROM sensor WHERE hive_id = $1", hive_id)
    await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
    await pg.close()


async def test_an_owner_configures_a_sensor_and_sees_it_applied(stack: ConnectionSettings,
                                                                ids: tuple[str, str]) -> None:
    hive_id, sensor_id = ids
    owner, auth = account(stack)
    other_uid, other = account(stack)
    hive = {"id": hive_id, "name": "Owner's bar", "type": "bar", "lon": 9.521, "lat": 47.141,
            "tz": "Europe/Vaduz", "capacity": 80, "opening_hours": {"fri": [["18:00", "02:00"]]}}
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        assert (await http.post("/owner/hives", json=hive)).status_code == 401
        bad = await http.post("/owner/hives", headers=auth, json={**hive, "tz": "Mars/Olympus"})
        assert bad.status_code == 422 and "tz" in bad.json()["error"]
        made = await http.post("/owner/hives", headers=auth, json=hive)
        assert made.status_code == 201 and made.headers["location"] == f"/hives/{hive_id}"
        assert (await http.post("/owner/hives", headers=auth, json=hive)).status_code == 409
        assert (await http.put(f"/owner/hives/{hive_id}", headers=other, json=hive)).status_code == 404
        public = await http.get(f"/hives/{hive_id}")  # the index was dropped: seen at once, no token
        assert public.status_code == 200 and public.json()["name"] == "Owner's bar"

        added = geofence("sensor", "add", sensor_id, "--hive", hive_id, "--byte-order", "big")
        assert added.returncode == 0, added.stderr
        password = added.stdout.strip()
        assert len(password) >= 24 and password not in added.stderr
        assert geofence("sensor", "add", sensor_id, "--hive", hive_id).returncode == 1  # exists

        sensor = MqttDevice(stack, Device(sensor_id, password), clean_session=False)
        try:
            sensor.client.subscribe(f"commands/sensor/{sensor_id}", qos=1)
            sensor.expect("suback")
            sent = await http.post(f"/owner/sensors/{sensor_id}/config", headers=auth,
                                   json={"threshold_cm": 120, "reporting_interval_min": 15,
                                         "status_interval_min": 60, "event_threshold": 5})
            assert sent.status_code == 202, sent.text
            assert sent.json() == {"configuration_id": 1, "state": "pending"}
            refused = await http.post(f"/owner/sensors/{sensor_id}/config", headers=other,
                                      json={"threshold_cm": 1, "reporting_interval_min": 1,
                                            "status_interval_min": 1, "event_threshold": 1})
            assert refused.status_code == 404
            kind, (topic, payload) = sensor.next_event()
            assert (kind, topic) == ("message", f"commands/sensor/{sensor_id}")
            assert sf.SensorConfig.decode(payload) == sf.SensorConfig(120, 15, 60, 5, 1)
            answer = (await http.get(f"/owner/hives/{hive_id}/sensors", headers=auth)).json()
            described(pm.OwnerSensors, answer)  # the typed API's model, every field declared
            view = answer["sensors"]
            # no report yet, but registered just now: silent only past twice its interval from then
            assert view[0]["config"]["state"] == "pending" and view[0]["silent"] is False
            assert view[0]["last_report_at"] is None

            status = sf.encode_status(int(time.time()) - 300, 3300, 1, 4, 17, 0x00020001, 1)
            sensor.client.publish(f"sensors/{sensor_id}/v2/status", status, qos=1)
            sensor.expect("puback")
            end = time.monotonic() + WAIT
            while True:
                view = (await http.get(f"/owner/hives/{hive_id}/sensors", headers=auth)).json()["sensors"]
                if view[0]["config"]["state"] == "applied" or time.monotonic() > end:
                    break
                await asyncio.sleep(0.1)
            s = view[0]
            described(pm.OwnerSensors, {"sensors": view})
            assert (s["config"]["configuration_id"], s["config"]["state"]) == (1, "applied")
            assert s["config"]["sent_at"] is not None
            assert (s["battery_mv"], s["low_battery"], s["gprs_signal"]) == (3300, True, 17)
            mine = (await http.get("/owner/hives", headers=auth)).json()["hives"]
            assert [h["id"] for h in mine] == [hive_id]
        finally:
            sensor.close()
    listed = geofence("sensor", "list", "--hive", hive_id)
    assert listed.returncode == 0 and listed.stdout.split("\t")[:4] == [sensor_id, hive_id, "big", "65524"]
    [row] = json.loads(geofence("sensor", "list", "--hive", hive_id, "--json").stdout)
    assert (row["sensor_id"], row["hive_id"], row["byte_order"]) == (sensor_id, hive_id, "big")
    assert row["modulus"] == 65524 and set(row) >= {"last_report_at", "last_status_at"}
    assert owner != other_uid


async def test_an_owner_reads_the_analytics_and_the_public_sees_busier_than_usual(
        stack: ConnectionSettings, ids: tuple[str, str]) -> None:
    """The nightly job's rows for a hive (the job itself: tests/integration/test_spark_venues.py)
    as the owner's analytics, and the profile's figure for now beside the live one in the
    public card."""
    hive_id, _ = ids
    _, auth = account(stack)
    _, other = account(stack)
    tz, now = "Europe/Vaduz", time.time()
    today = business_day(now, tz, 4)
    yesterday = today - dt.timedelta(days=1)
    hour = dt.datetime.fromtimestamp(now, dt.UTC).astimezone(ZoneInfo(tz)).hour
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        made = await http.post("/owner/hives", headers=auth, json={
            "id": hive_id, "name": "Analytics bar", "type": "bar", "lon": 9.52, "lat": 47.14, "tz": tz})
        assert made.status_code == 201, made.text
        empty = (await http.get(f"/owner/hives/{hive_id}/analytics", headers=auth)).json()
        assert empty == {"hive_id": hive_id, "today": {"day": today.isoformat(), "hours": []}, "days": [],
                         "hourly": {}, "profile": None, "forecast": []}
        described(pm.HiveAnalytics, empty)

        pg = await asyncpg.connect(stack["postgres"]["dsn"])
        try:
            await pg.execute("INSERT INTO venue_day (hive_id, day, reports, entries, exits, residual, "
                             "correction, factor, complete, run_id) VALUES ($1, $2, 96, 40, 36, 4, 'exits', "
                             "1.1111, true, 'test')", hive_id, yesterday)
            await pg.executemany(
                "INSERT INTO venue_hourly (hive_id, day, hour, entries, exits, mean_occupancy, "
                "peak_occupancy, phones_mean, phones_peak) VALUES ($1, $2, $3, 2, 1, $4, $5, NULL, NULL)",
                [(hive_id, yesterday, h, h / 2, h / 2 + 1) for h in range(24)])
            await pg.executemany(
                "INSERT INTO venue_profile (hive_id, weekday, hour, occupancy, phones, samples, as_of) "
                "VALUES ($1, $2, $3, $4, NULL, 4, $5)",
                [(hive_id, w, h, 10.0 if (w, h) == (today.isoweekday(), hour) else 1.0, yesterday)
                 for w in range(1, 8) for h in range(24)])
            await pg.executemany(
                "INSERT INTO venue_forecast (hive_id, day, hour, occupancy, phones, seasonal, trend, basis, "
                "samples) VALUES ($1, $2, $3, 3.0, NULL, 3.0, 1.0, 'weekday', 4)",
                [(hive_id, d, h) for d in (yesterday, today) for h in range(24)])
            await pg.execute("INSERT INTO hive_status (hive_id, day, entries, exits, occupancy, raw) "
                             "VALUES ($1, $2, 40, 10, 30, 30)", hive_id, today)
            # today so far: two reports of a sensor, 5 in then 2 out (the live "today" curve)
            await pg.execute("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)", f"{hive_id}-s", hive_id)
            await pg.executemany(
                "INSERT INTO sensor_report (sensor_id, device_at, received_at, at, version, "
                "report_type, counter, total_in, total_out, entries, exits, rule, gap, lost_reports, "
                "unknowable, skewed, raw) VALUES ($1, to_timestamp($2), to_timestamp($2), "
                "to_timestamp($2), 1, 255, -1, $3, $4, $3, $4, 'increase', 0, 0, false, false, '')",
                [(f"{hive_id}-s", now - 20, 5, 0), (f"{hive_id}-s", now - 10, 0, 2)])
        finally:
            await pg.close()

        got = (await http.get(f"/owner/hives/{hive_id}/analytics?days=7", headers=auth)).json()
        described(pm.HiveAnalytics, got)
        assert got["today"]["day"] == today.isoformat()
        hours_today = got["today"]["hours"]
        assert (sum(x["entries"] for x in hours_today), sum(x["exits"] for x in hours_today)) == (5, 2)
        assert hours_today[-1]["hour"] == hour and max(x["peak_occupancy"] for x in hours_today) == 5
        assert [d["day"] for d in got["days"]] == [yesterday.isoformat()]
        assert got["days"][0]["correction"] == "exits" and got["days"][0]["residual"] == 4
        hours = got["hourly"][yesterday.isoformat()]
        assert len(hours) == 24 and hours[6]["mean_occupancy"] == 3.0 and hours[6]["phones_mean"] is None
        assert got["profile"]["samples"] == [4] * 7
        assert got["profile"]["weekdays"][today.isoweekday() - 1][hour] == 10.0
        past = [f for f in got["forecast"] if f["day"] == yesterday.isoformat()]
        tomorrow = [f for f in got["forecast"] if f["day"] == today.isoformat()]
        assert len(past) == len(tomorrow) == 24
        assert past[6]["actual"] == 3.0 and tomorrow[6]["actual"] is None
        assert (await http.get(f"/owner/hives/{hive_id}/analytics", headers=other)).status_code == 404
        assert (await http.get(f"/owner/hives/{hive_id}/analytics?days=0", headers=auth)).status_code == 422

        # the public card, no token: 30 inside against a usual 10 at this hour
        card = (await http.get(f"/hives/{hive_id}")).json()
        assert card["occupancy"]["occupancy"] == 30
        usual = card["usual"]
        assert (usual["occupancy"], usual["samples"], usual["hour"]) == (10.0, 4, hour)
        assert usual["busyness"] == "busier than usual"
        listed = (await http.get("/hives", params={"q": "Analytics bar"})).json()["hives"]
        assert [h["usual"]["busyness"] for h in listed if h["id"] == hive_id] in ([], ["busier than usual"])
