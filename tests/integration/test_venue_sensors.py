"""The sensor sidecar on the live stack: a sensor logs in over MQTT as itself and publishes a
simulated day (legacy or v2 firmware, lost and duplicated reports, restarts); the reports
land in PostgreSQL with exactly the simulator's knowable counts, hive_status holds the day's
occupancy, and MQTT and AMQP subscribers get it on hive-occupancy/<hive>. Bad frames go to
dead-letters with their reason while the good ones of the same batch are stored; a batch
sent again counts nothing twice; a status carrying a configuration id marks it applied.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import asyncpg
import pytest

from deploy.demo.sensors import Faults, SimSensor, simulate
from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import topology as t
from fence.venues import sensor_frames as sf
from tests.integration.clients import DEADLINE, Device, MqttDevice, api, geofence, poll, q

pytestmark = pytest.mark.integration
WAIT = 60.0  # the sidecar stores a batch within a second; generous for a busy machine


@dataclass
class Venue:
    hive_id: str
    sensor_id: str
    password: str
    pg: asyncpg.Connection


@pytest.fixture
async def venue(stack: ConnectionSettings) -> AsyncIterator[Venue]:
    run = uuid.uuid4().hex[:8]
    hive_id, sensor_id = f"hive-{run}", f"sensor-{run}"
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    await pg.execute("INSERT INTO hive (id, name, type, lon, lat, tz, capacity) "
                     "VALUES ($1, $2, 'bar', 9.52, 47.14, 'Europe/Vaduz', 120)", hive_id, f"Test bar {run}")
    await pg.execute("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)", sensor_id, hive_id)
    settings = Settings.from_env()
    password = devices.add_sensor(settings, load_secrets(settings), sensor_id, None, lambda *_: None)
    try:
        yield Venue(hive_id, sensor_id, password, pg)
    finally:
        for table in ("sensor_report", "sensor_event", "sensor_status", "sensor_config"):
            await pg.execute(f"DELETE FROM {table} WHERE sensor_id = $1", sensor_id)
        await pg.execute("DELETE FROM sensor WHERE id = $1", sensor_id)
        for table in ("hive_status", "hive_day"):
            await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
        await pg.close()
        devices.remove_sensor(settings, load_secrets(settings), sensor_id, lambda *_: None)
        assert api(stack, f"api/users/{q(sensor_id)}") is None


async def stored(v: Venue, n: int) -> tuple[int, int, int]:
    """(reports, entries, exits) once at least n reports are stored."""
    got: tuple[int, int, int] = (0, 0, 0)
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        r = await v.pg.fetchrow("SELECT count(*) n, coalesce(sum(entries), 0) e, coalesce(sum(exits), 0) x "
                                "FROM sensor_report WHERE sensor_id = $1", v.sensor_id)
        got = (int(r["n"]), int(r["e"]), int(r["x"]))
        if got[0] >= n:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"{got[0]} of {n} reports stored after {WAIT:g}s")


async def occupancy_queue(stack: ConnectionSettings, hive_id: str
                          ) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractQueue]:
    conn = await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE)
    ch = await conn.channel()
    queue = await ch.declare_queue("", exclusive=True)
    await queue.bind(t.OCCUPANCY_EXCHANGE, t.occupancy_routing_key(hive_id))
    return conn, queue


def last_message(messages: list[Any]) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(messages[-1])
    return got


def visible_restart(sent: list[Any], sim: SimSensor) -> bool:
    """Whether the frames show a restart (fence/venues/counting.py): v2, a start-up report after
    the first; legacy, all-zero totals right after a report with some (zeros after zeros say
    nothing)."""
    frames = [x.frame for i, x in enumerate(sent) if i == 0 or x.frame != sent[i - 1].frame]  # no duplicates
    r = sf.decode_counters(frames, [sim.version] * len(frames), [sim.byte_order] * len(frames))
    if sim.version == 2:
        return bool((r.report_type[1:] == sf.REPORT_STARTUP).any())
    zero = (r.total_in == 0) & (r.total_out == 0)
    return bool((zero[1:] & ~zero[:-1]).any())


@pytest.mark.parametrize("version", [1, 2])
async def test_a_simulated_day_over_mqtt_counts_what_the_simulator_knows(
        stack: ConnectionSettings, venue: Venue, version: int) -> None:
    amqp_conn, amqp_q = await occupancy_queue(stack, venue.hive_id)
    watcher = MqttDevice(stack, Device("", ""), admin=True)
    watcher.client.subscribe(f"hive-occupancy/{venue.hive_id}", qos=1)
    watcher.expect("suback")
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    try:
        sim = SimSensor(venue.sensor_id, "bar", version=version, tz="Europe/Vaduz", scale=80.0,
                        faults=Faults(loss=0.15, duplicate=0.15, restarts_per_day=6.0, skew_s=0.0))
        now = time.time()
        # the last 4 hours with a restart the platform can see and a duplicate (the hour and the
        # seed decide); in quiet hours (no visitor, every legacy total zero) a restart is
        # invisible: then the last 24 hours
        for seed, hours in itertools.product(range(version, 400, 2), (4.0, 24.0)):
            sent, truth = simulate(sim, now - hours * 3600, hours, seed=seed)
            if truth.restarts >= 1 and visible_restart(sent, sim) \
                    and any(a.frame == b.frame for a, b in itertools.pairwise(sent)):
                break
        assert truth.restarts >= 1 and visible_restart(sent, sim)
        for s in sent:
            sensor.client.publish(f"sensors/{venue.sensor_id}/{s.topic}", s.frame, qos=1)
        distinct = len({s.frame for s in sent})
        n, entries, exits = await stored(venue, distinct)
        assert (n, entries, exits) == (distinct, truth.entries, truth.exits)
        rules = {r["rule"] for r in await venue.pg.fetch(
            "SELECT DISTINCT rule FROM sensor_report WHERE sensor_id = $1", venue.sensor_id)}
        assert "first" in rules and any(r.startswith("restart") for r in rules)
        st = await venue.pg.fetchrow("SELECT * FROM hive_status WHERE hive_id = $1", venue.hive_id)
        # the simulated hours may reach back over the 04:00 reset: today's figure is what is after it
        today = await venue.pg.fetchrow(
            "SELECT coalesce(sum(entries), 0) e, coalesce(sum(exits), 0) x FROM sensor_report "
            "WHERE sensor_id = $1 AND (at AT TIME ZONE 'Europe/Vaduz' - interval '4 hours')::date = $2",
            venue.sensor_id, st["day"])
        assert (st["entries"], st["exits"]) == (today["e"], today["x"])
        raw = st["entries"] - st["exits"]
        assert st["occupancy"] == max(0, raw) and st["raw"] == raw

        # the same occupancy reached MQTT and AMQP subscribers
        mqtt_bodies: list[bytes] = []

        def heard() -> bool:
            while not watcher.events.empty():
                kind, value = watcher.events.get_nowait()
                if kind == "message":
                    mqtt_bodies.append(value[1])
            return bool(mqtt_bodies) and last_message(mqtt_bodies)["entries"] == st["entries"]

        await poll(heard, "the hive's occupancy on MQTT", WAIT)
        got = last_message(mqtt_bodies)
        assert (got["hive_id"], got["occupancy"], got["capacity"]) == (venue.hive_id, st["occupancy"], 120)
        amqp_bodies: list[bytes] = []
        async with amqp_q.iterator() as it:
            async with asyncio.timeout(WAIT):
                async for m in it:
                    await m.ack()
                    amqp_bodies.append(m.body)
                    if last_message(amqp_bodies)["entries"] == st["entries"]:
                        break

        # everything again (a gateway replaying its buffer): nothing counts twice
        for s in sent:
            sensor.client.publish(f"sensors/{venue.sensor_id}/{s.topic}", s.frame, qos=1)
        marker = sf.encode_status(int(now), 3600, 0, 0, 20, 1, 0)  # a last frame: all before it is handled
        sensor.client.publish(f"sensors/{venue.sensor_id}/v2/status", marker, qos=1)
        await poll_status(venue, 1)
        assert await stored(venue, distinct) == (distinct, truth.entries, truth.exits)
    finally:
        sensor.close()
        watcher.close()
        await amqp_conn.close()


async def poll_status(v: Venue, n: int) -> None:
    end = time.monotonic() + WAIT
    while time.monotonic() < end:
        if await v.pg.fetchval("SELECT count(*) FROM sensor_status WHERE sensor_id = $1", v.sensor_id) >= n:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"fewer than {n} statuses stored after {WAIT:g}s")


async def test_bad_frames_are_dead_lettered_with_their_reason_and_the_good_ones_stored(
        stack: ConnectionSettings, venue: Venue) -> None:
    admin = MqttDevice(stack, Device("", ""), admin=True)
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    sid = venue.sensor_id
    when = time.gmtime(time.time())
    local = (when.tm_year, when.tm_mon, when.tm_mday, when.tm_hour, when.tm_min, when.tm_sec)
    bad = {
        f"sensors/{sid}/counter": (b"\x01" * 7, "legacy counter report of 7 bytes (15 to 59 expected)"),
        f"sensors/{sid}/v2/counter": (sf.encode_v2(3, 1, 1, (2023, 2, 29, 1, 0, 0), 0xFF, 4),
                                      "impossible date 23-02-29 01:00:00"),
        f"sensors/{sid}/v2/event": (sf.encode_events([(7, 100, int(time.time()))]), "unknown event type 7"),
        f"sensors/{sid}/v2/status": (b"\0" * 21, "status of 21 bytes (20 expected)"),
    }
    try:
        good = [sf.encode_legacy(10, 4, local, sf.REPORT_EVENTS),
                sf.encode_legacy(13, 6, local, sf.REPORT_EVENTS)]
        sensor.client.publish(f"sensors/{sid}/counter", good[0], qos=1)
        for topic, (frame, _) in bad.items():
            sensor.client.publish(topic, frame, qos=1)
        sensor.client.publish(f"sensors/{sid}/counter", good[1], qos=1)
        # unknown sensor, and a kind no firmware sends (the administrator may publish anything)
        ghost = f"ghost-{uuid.uuid4().hex[:8]}"
        admin.client.publish(f"sensors/{ghost}/counter", good[0], qos=1)
        admin.client.publish(f"sensors/{sid}/v3/counter", good[0], qos=1)
        assert await stored(venue, 2) == (2, 3, 2)  # the first is a baseline, then 3 in and 2 out
        want = {**{why: topic for topic, (_, why) in bad.items()},
                f"unknown sensor {ghost!r}": f"sensors/{ghost}/counter",
                "unknown sensor topic kind 'v3/counter'": f"sensors/{sid}/v3/counter"}
        rows: list[dict[str, Any]] = []

        def listed() -> bool:
            nonlocal rows
            done = geofence("dlq", "list", "--json", "--vhost", t.INGRESS_VHOST, "--source", t.SENSORS_QUEUE)
            assert done.returncode == 0, done.stderr
            rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
            keys = {r["routing_key"] for r in rows}
            return all(topic.replace("/", ".") in keys for topic in want.values())

        await poll(listed, "the bad frames in dead-letters", WAIT)
        mine = {r["routing_key"]: r["reason"] for r in rows
                if sid in r["routing_key"] or ghost in r["routing_key"]}
        for why, topic in want.items():
            assert why in mine[topic.replace("/", ".")], (topic, mine)
    finally:
        admin.close()
        sensor.close()


async def test_a_status_with_the_configuration_id_marks_it_applied(stack: ConnectionSettings,
                                                                    venue: Venue) -> None:
    config = sf.SensorConfig(110, 30, 60, 5, 77)
    await venue.pg.execute(
        "INSERT INTO sensor_config (sensor_id, configuration_id, threshold_cm, reporting_interval_min, "
        "status_interval_min, event_threshold, sent_at) VALUES ($1, 77, 110, 30, 60, 5, now())",
        venue.sensor_id)
    sensor = MqttDevice(stack, Device(venue.sensor_id, venue.password))
    try:
        sensor.client.subscribe(f"commands/sensor/{venue.sensor_id}", qos=1)
        sensor.expect("suback")
        status = sf.encode_status(int(time.time()) - 600, 3550, 1, 2, 19, 0x00010002, 77)
        sensor.client.publish(f"sensors/{venue.sensor_id}/v2/status", status, qos=1)
        await poll_status(venue, 1)
        row = await venue.pg.fetchrow("SELECT * FROM sensor_status WHERE sensor_id = $1", venue.sensor_id)
        assert (row["battery_mv"], row["configuration_id"], row["gprs_signal"]) == (3550, 77, 19)
        applied = await venue.pg.fetchval("SELECT applied_at FROM sensor_config WHERE sensor_id = $1 "
                                          "AND configuration_id = 77", venue.sensor_id)
        assert applied is not None
        assert config.configuration_id == 77
    finally:
        sensor.close()
