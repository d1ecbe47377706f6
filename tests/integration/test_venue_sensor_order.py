"""Issue 34 (part 3) on the live stack: frames encoded here with `struct` from the documented
layouts (not the project's encoders), published over real MQTT by the sensor's own login.

- A late legacy report (older device time, lower totals: a requeue, a replay) counts nothing:
  the stored reports, hive_status and the public read all say what the totals say.
- A duplicated v2 event frame (twice back to back, and once more in a later batch) is stored
  once and counted once: the live figure equals the stored one.
- A sensor sending only event reports is heard from (sensor.last_report_at), and a sensor
  never heard from is not `silent` before twice its reporting interval from its registration.

The last two tests drive the sidecar's own steps in this process (sensor_core, venue_store,
owner_store) against the real PostgreSQL, without MQTT.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest

from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Settings, load_secrets
from fence.venues import owner_store, venue_store
from fence.venues.occupancy import HiveOccupancy
from fence.venues.sensor_core import V2_EVENT, Frame, SensorCore, SensorInfo
from tests.integration.clients import DEADLINE, Device, MqttDevice, api, q

pytestmark = pytest.mark.integration
WAIT = 60.0
TZ = "Europe/Vaduz"


def legacy_frame(total_in: int, total_out: int, at: float, report_type: int = 0xFF) -> bytes:
    """diff_in diff_out total_in total_out (u16 little-endian) | yy mm dd hh mi ss | type: the
    hive's wall clock at `at`."""
    w = datetime.fromtimestamp(at, ZoneInfo(TZ))
    return struct.pack("<4H7B", total_in, total_out, total_in, total_out, w.year % 100, w.month, w.day,
                       w.hour, w.minute, w.second, report_type)


def event_frame(rows: list[tuple[int, int, int]]) -> bytes:
    """(event_type, distance_mm, timestamp) as 8-byte reports: type u8 | distance u16 | reserved | ts u32."""
    return b"".join(struct.pack("<BHBI", et, dist, 0, ts) for et, dist, ts in rows)


def status_frame(startup: int) -> bytes:
    return struct.pack("<IHHHHII", startup, 3700, 0, 0, 20, 1, 0)


@dataclass
class Venue:
    hive_id: str
    sensor_id: str
    owner: str
    password: str
    pg: asyncpg.Connection


@pytest.fixture
async def venue(stack: ConnectionSettings) -> AsyncIterator[Venue]:
    run = uuid.uuid4().hex[:8]
    hive_id, sensor_id, owner = f"ord-{run}", f"ord-{run}-s", f"ord-owner-{run}"
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    await pg.execute("INSERT INTO owner_account (uid, name) VALUES ($1, 'Order test')", owner)
    await pg.execute("INSERT INTO hive (id, name, type, lon, lat, tz, capacity, owner_uid) "
                     "VALUES ($1, $2, 'bar', 9.52, 47.14, $3, 120, $4)", hive_id, f"Order bar {run}", TZ,
                     owner)
    await pg.execute("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)", sensor_id, hive_id)
    settings = Settings.from_env()
    password = devices.add_sensor(settings, load_secrets(settings), sensor_id, None, lambda *_: None)
    try:
        yield Venue(hive_id, sensor_id, owner, password, pg)
    finally:
        for table in ("sensor_report", "sensor_event", "sensor_status", "sensor_config", "sensor_alert"):
            await pg.execute(f"DELETE FROM {table} WHERE sensor_id = $1", sensor_id)
        await pg.execute("DELETE FROM sensor WHERE id = $1", sensor_id)
        for table in ("hive_status", "hive_day"):
            await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
        await pg.execute("DELETE FROM owner_account WHERE uid = $1", owner)
        await pg.close()
        devices.remove_sensor(settings, load_secrets(settings), sensor_id, lambda *_: None)
        assert api(stack, f"api/users/{q(sensor_id)}") is None


async def until(check: Callable[[], Awaitable[Any]], what: str, deadline: float = WAIT) -> Any:
    """Poll `check` until it returns something true (returned), or fail after `deadline`."""
    end = time.monotonic() + deadline
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline:g}s")
        await asyncio.sleep(0.1)


async def stored_counts(v: Venue) -> tuple[int, int]:
    """Entries and exits as stored: the reports' counts and the v2 entry / exit rows (what the
    owners' "today" and the nightly analytics read, venue_store.counts_sql)."""
    r = await v.pg.fetchrow(
        "SELECT (SELECT coalesce(sum(entries), 0) FROM sensor_report WHERE sensor_id = $1) "
        "     + (SELECT count(*) FROM sensor_event WHERE sensor_id = $1 AND event_type = 1) AS e, "
        "       (SELECT coalesce(sum(exits), 0) FROM sensor_report WHERE sensor_id = $1) "
        "     + (SELECT count(*) FROM sensor_event WHERE sensor_id = $1 AND event_type = 0) AS x",
        v.sensor_id)
    return int(r["e"]), int(r["x"])


async def event_rows(v: Venue) -> int:
    return int(await v.pg.fetchval("SELECT count(*) FROM sensor_event WHERE sensor_id = $1", v.sensor_id))


async def live_counts(v: Venue) -> tuple[int, int] | None:
    r = await v.pg.fetchrow("SELECT entries, exits FROM hive_status WHERE hive_id = $1", v.hive_id)
    return None if r is None else (int(r["entries"]), int(r["exits"]))


async def handled(v: Venue, sensor: MqttDevice, n: int) -> None:
    """A status frame published last: once it is stored, everything before it was handled."""
    sensor.client.publish(f"sensors/{v.sensor_id}/v2/status", status_frame(int(time.time()) + n), qos=1)

    async def statuses() -> bool:
        return bool(await v.pg.fetchval("SELECT count(*) FROM sensor_status WHERE sensor_id = $1",
                                        v.sensor_id) >= n)

    await until(statuses, f"{n} status frames stored")


async def public_read(stack: ConnectionSettings, v: Venue, want: tuple[int, int]) -> dict[str, Any]:
    """GET /hives/{id} until its occupancy shows `want` (entries, exits)."""
    seen: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        async def read() -> bool:
            seen.update((await http.get(f"/hives/{v.hive_id}")).json())
            occ = seen.get("occupancy") or {}
            return (occ.get("entries"), occ.get("exits")) == want

        try:
            await until(read, f"GET /hives/{v.hive_id} showing {want}")
        except AssertionError:
            raise AssertionError(f"the public read shows {seen.get('occupancy')}, stored {want}") from None
    return seen


async def test_a_late_legacy_report_over_mqtt_counts_nothing(stack: ConnectionSettings, venue: Venue) -> None:
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    now = time.time()
    try:
        for tin, tout, ago in ((31222, 16, 120), (31221, 12, 121), (31230, 20, 60)):  # the second is late
            sensor.client.publish(f"sensors/{venue.sensor_id}/counter", legacy_frame(tin, tout, now - ago),
                                  qos=1)
        await handled(venue, sensor, 1)
    finally:
        sensor.close()
    rows = await venue.pg.fetch("SELECT total_in, total_out, rule, entries, exits FROM sensor_report "
                                "WHERE sensor_id = $1 ORDER BY total_in", venue.sensor_id)
    got = [(r["total_in"], r["total_out"], r["rule"], r["entries"], r["exits"]) for r in rows]
    assert got == [(31221, 12, "late", 0, 0), (31222, 16, "first", 0, 0), (31230, 20, "increase", 8, 4)], got
    assert await stored_counts(venue) == (8, 4)
    assert await until(lambda: live_counts(venue), "hive_status") == (8, 4)
    seen = await public_read(stack, venue, (8, 4))
    assert seen["occupancy"]["occupancy"] == 4


async def test_a_duplicated_v2_event_frame_over_mqtt_counts_once(stack: ConnectionSettings,
                                                                 venue: Venue) -> None:
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    ts = int(time.time()) - 30
    frame = event_frame([(1, 1200, ts), (0, 900, ts + 5)])  # one entry, one exit
    topic = f"sensors/{venue.sensor_id}/v2/event"
    try:
        sensor.client.publish(topic, frame, qos=1)
        sensor.client.publish(topic, frame, qos=1)  # sent again right behind (a lost PUBACK)
        await handled(venue, sensor, 1)
        assert await stored_counts(venue) == (1, 1)
        assert await live_counts(venue) == (1, 1)
        sensor.client.publish(topic, frame, qos=1)  # and again, in a later batch (a replay)
        await handled(venue, sensor, 2)
    finally:
        sensor.close()
    assert await event_rows(venue) == 2
    assert await stored_counts(venue) == (1, 1)
    assert await live_counts(venue) == (1, 1)
    await public_read(stack, venue, (1, 1))


async def test_a_sensor_sending_only_event_reports_is_heard_from(stack: ConnectionSettings,
                                                                 venue: Venue) -> None:
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    try:
        sensor.client.publish(f"sensors/{venue.sensor_id}/v2/event",
                              event_frame([(1, 1000, int(time.time()) - 5)]), qos=1)
        await handled(venue, sensor, 1)
    finally:
        sensor.close()
    last = await venue.pg.fetchval("SELECT last_report_at FROM sensor WHERE id = $1", venue.sensor_id)
    assert last is not None and abs(last.timestamp() - time.time()) < WAIT, last
    pool = await asyncpg.create_pool(stack["postgres"]["dsn"], min_size=1, max_size=1)
    try:
        (view,) = await owner_store.sensors(pool, venue.owner, venue.hive_id, now=time.time() + 3 * 3600)
        assert view["silent"] is True  # 3 h on, past twice its 30 minutes: by its last report
    finally:
        await pool.close()


async def test_a_sensor_never_heard_from_is_silent_only_past_twice_its_interval_from_registration(
        stack: ConnectionSettings, venue: Venue) -> None:
    pool = await asyncpg.create_pool(stack["postgres"]["dsn"], min_size=1, max_size=1)
    try:
        created = (await venue.pg.fetchval("SELECT created_at FROM sensor WHERE id = $1",
                                           venue.sensor_id)).timestamp()
        (view,) = await owner_store.sensors(pool, venue.owner, venue.hive_id, now=created + 60)
        assert (view["last_report_at"], view["silent"]) == (None, False), view  # a minute after installation
        (view,) = await owner_store.sensors(pool, venue.owner, venue.hive_id, now=created + 3601)
        assert view["silent"] is True  # past 2 x 30 minutes since it was registered
    finally:
        await pool.close()


async def test_the_sidecars_steps_store_and_count_a_duplicated_event_frame_once(
        stack: ConnectionSettings, venue: Venue) -> None:
    """What the sensor sidecar's `handle` does with a batch (sensor_core, the stored events
    looked up, occupancy, venue_store), in this process against the real PostgreSQL: a frame
    twice in a batch and again in the next batch counts once, and the event reports alone move
    last_report_at."""
    core = SensorCore({venue.sensor_id: SensorInfo(venue.sensor_id, venue.hive_id, TZ)})
    hive = HiveOccupancy(venue.hive_id, TZ)
    ts = int(time.time()) - 30
    frame = event_frame([(1, 1200, ts), (0, 900, ts + 5), (1, 800, ts + 6)])

    async def batch(n: int) -> None:
        now = time.time()
        done = core.process([Frame(venue.sensor_id, V2_EVENT, frame, now)] * n)
        done.uncount(await venue_store.stored_events(venue.pg, done.events))
        for e in done.counted_events():
            hive.add(e.at, int(e.event_type == 1), int(e.event_type == 0))
        await venue_store.store_batch(venue.pg, done.counts, done.events, done.statuses, {}, [hive], [])

    await batch(2)
    await batch(1)
    assert await event_rows(venue) == 3
    assert await stored_counts(venue) == await live_counts(venue) == (2, 1)
    last = await venue.pg.fetchval("SELECT last_report_at FROM sensor WHERE id = $1", venue.sensor_id)
    assert last is not None and abs(last.timestamp() - time.time()) < WAIT
