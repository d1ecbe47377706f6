"""Public venue reads on the live stack (`GET /hives`, `GET /hives/{id}`, no token): a sensor's
report reaches the read through the sidecar's memcached write; search by proximity, type and
name; and with memcached stopped mid-test the reads still answer (from PostgreSQL), never a
500, the cache's failures counted in /health. memcached is started again at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiomcache
import asyncpg
import httpx
import pytest

from deploy import services
from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Settings, load_secrets
from fence.venues import sensor_frames as sf
from fence.venues.reads import INDEX_KEY, LOCAL_INDEX_S, STATUS_KEY
from tests.integration.clients import Device, MqttDevice, poll

pytestmark = pytest.mark.integration
WAIT = 60.0


@pytest.fixture
async def hives(stack: ConnectionSettings) -> AsyncIterator[tuple[str, list[str], str, str]]:
    """(run, hive ids, a sensor id of the first hive, its password)."""
    run = uuid.uuid4().hex[:8]
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    rows = [(f"rd-{run}-0", f"Café Zürich {run}", "cafe", 9.5210, 47.1410),
            (f"rd-{run}-1", f"Bar Zürich {run}", "bar", 9.5230, 47.1420),  # ~180 m from the first
            (f"rd-{run}-2", f"Far shop {run}", "shop", 9.6000, 47.2000)]  # ~9 km
    for hid, name, kind, lon, lat in rows:
        await pg.execute("INSERT INTO hive (id, name, type, lon, lat, tz, capacity, opening_hours) "
                         "VALUES ($1, $2, $3, $4, $5, 'Europe/Vaduz', 40, $6)", hid, name, kind, lon, lat,
                         '{"mon": [["00:00", "00:00"]]}')
    sensor = f"rd-{run}-s"
    await pg.execute("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)", sensor, rows[0][0])
    # hives written straight into PostgreSQL: the cached index learns of them when it expires
    # (INDEX_TTL_S); an owner's change through the API drops it at once, as this does
    mc = aiomcache.Client(stack["memcached"]["host"], stack["memcached"]["port"])
    await mc.delete(INDEX_KEY.encode())
    await mc.close()
    settings = Settings.from_env()
    password = devices.add_sensor(settings, load_secrets(settings), sensor, None, lambda *_: None)
    try:
        yield run, [r[0] for r in rows], sensor, password
    finally:
        for table in ("sensor_report", "sensor_status"):
            await pg.execute(f"DELETE FROM {table} WHERE sensor_id = $1", sensor)
        await pg.execute("DELETE FROM sensor WHERE id = $1", sensor)
        for hid, *_ in rows:
            await pg.execute("DELETE FROM hive_status WHERE hive_id = $1", hid)
            await pg.execute("DELETE FROM hive WHERE id = $1", hid)
        await pg.close()
        devices.remove_sensor(settings, load_secrets(settings), sensor, lambda *_: None)


def base(stack: ConnectionSettings) -> str:
    return str(stack["api"])


async def get(client: httpx.AsyncClient, path: str, **params: Any) -> httpx.Response:
    return await client.get(path, params=params)


async def test_reads_search_and_follow_the_sensor(stack: ConnectionSettings,
                                                  hives: tuple[str, list[str], str, str]) -> None:
    run, ids, sensor, password = hives
    async with httpx.AsyncClient(base_url=base(stack), timeout=10) as client:
        # the API's own copy of the index is refreshed every LOCAL_INDEX_S: new hives show then
        got: list[dict[str, Any]] = []

        async def found() -> bool:
            near = await get(client, "/hives", near="9.5210,47.1410", radius_m=500, q=run)
            assert near.status_code == 200
            got[:] = near.json()["hives"]
            return bool(got)

        end = time.monotonic() + LOCAL_INDEX_S + WAIT
        while not await found() and time.monotonic() < end:
            await asyncio.sleep(0.2)
        assert [h["id"] for h in got] == ids[:2]  # nearest first; the far shop is out of reach
        assert got[0]["distance_m"] == 0.0 and 150 < got[1]["distance_m"] < 220
        by_name = (await get(client, "/hives", q=f"zurich {run}")).json()["hives"]  # "zurich" finds "Zürich"
        assert [h["id"] for h in by_name] == [ids[1], ids[0]]  # without `near`: by name
        shops = (await get(client, "/hives", q=run, type="shop")).json()["hives"]
        assert [h["id"] for h in shops] == [ids[2]]
        assert (await get(client, "/hives", near="9.5,47.1", radius_m=1e9)).status_code == 422
        assert (await get(client, "/hives", radius_m=100)).status_code == 422
        assert (await client.get(f"/hives/no-such-{run}")).status_code == 404
        one = (await client.get(f"/hives/{ids[0]}")).json()
        assert one["name"] == f"Café Zürich {run}" and one["occupancy"] is None  # no count yet

        # a sensor at the first hive: a baseline, then 4 in and 1 out
        dev = MqttDevice(stack, Device(sensor, password))
        try:
            t = time.gmtime(time.time() - 60)
            local = (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)
            for tin, tout in ((10, 10), (14, 11)):
                dev.client.publish(f"sensors/{sensor}/counter",
                                   sf.encode_legacy(tin, tout, local, sf.REPORT_EVENTS), qos=1)
                dev.expect("puback")
        finally:
            dev.close()
        seen: dict[str, Any] = {}

        async def counted() -> None:
            r = await client.get(f"/hives/{ids[0]}")
            seen.update(r.json())

        end = time.monotonic() + WAIT
        while (seen.get("occupancy") or {}).get("entries") != 4 and time.monotonic() < end:
            await counted()
            await asyncio.sleep(0.1)
        assert seen["occupancy"]["entries"] == 4 and seen["occupancy"]["occupancy"] == 3
        assert seen["occupancy"]["percent"] == 7.5  # of 40
        mc = aiomcache.Client(stack["memcached"]["host"], stack["memcached"]["port"])
        try:
            assert await mc.get((STATUS_KEY + ids[0]).encode()) is not None  # the sidecar's copy
        finally:
            await mc.close()


async def test_reads_answer_from_postgresql_when_memcached_is_stopped(
        stack: ConnectionSettings, hives: tuple[str, list[str], str, str]) -> None:
    run, ids, _, _ = hives
    settings = Settings.from_env()
    pid = services.memcached_pid(settings)
    assert pid is not None, "memcached is not running"
    async with httpx.AsyncClient(base_url=base(stack), timeout=10) as client:
        before = (await client.get("/health")).json()["venues"]
        os.kill(pid, signal.SIGTERM)
        try:
            await poll(lambda: not services.memcached_running(settings), "memcached to stop", 20)
            answers = await asyncio.gather(*(client.get(f"/hives/{ids[k % 3]}") for k in range(40)),
                                           get(client, "/hives", q=run))
            assert [r.status_code for r in answers] == [200] * 41
            assert {r.json()["id"] for r in answers[:40]} == set(ids)
            # the search finds the new hives once the API's index copy is rebuilt, from PostgreSQL now
            end = time.monotonic() + LOCAL_INDEX_S + WAIT
            while (await get(client, "/hives", q=run)).json()["count"] != 3:
                assert time.monotonic() < end, "the new hives never showed in the search"
                await asyncio.sleep(0.2)
            after = (await client.get("/health")).json()["venues"]
            assert after["cache"]["failures"] > before["cache"]["failures"]
            assert after["pg_reads"] > before["pg_reads"]
        finally:
            services.memcached_launch(settings)
            services.memcached_await(settings)
        back = await client.get(f"/hives/{ids[1]}")
        assert back.status_code == 200
