"""A venue owner on the live stack: adds a hive through the API (a Firebase user of the Auth
emulator), the operator installs a sensor (`geofence sensor add`), the owner pushes it a
configuration, the sensor (its own MQTT login) receives the 12 bytes on
commands/sensor/<id> and answers with a status carrying the configuration id, and the
owner's sensor view shows it applied, with the battery flagged low."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from fence.venues import sensor_frames as sf
from tests.integration.clients import DEADLINE, Device, MqttDevice, geofence

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
    for table in ("hive_status", "hive_day"):
        await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
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
            view = (await http.get(f"/owner/hives/{hive_id}/sensors", headers=auth)).json()["sensors"]
            assert view[0]["config"]["state"] == "pending" and view[0]["silent"] is True  # no report yet

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
            assert (s["config"]["configuration_id"], s["config"]["state"]) == (1, "applied")
            assert s["config"]["sent_at"] is not None
            assert (s["battery_mv"], s["low_battery"], s["gprs_signal"]) == (3300, True, 17)
            mine = (await http.get("/owner/hives", headers=auth)).json()["hives"]
            assert [h["id"] for h in mine] == [hive_id]
        finally:
            sensor.close()
    listed = geofence("sensor", "list", "--hive", hive_id)
    assert listed.returncode == 0 and listed.stdout.split("\t")[:4] == [sensor_id, hive_id, "big", "65524"]
    assert owner != other_uid
