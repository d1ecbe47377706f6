"""A hive's second occupancy figure on the live stack: its owner's fence (the fence API, the
owner an editor of a tenant) is the hive's polygon; the tenant's app users' phones entering and
leaving it (our own ENTER / LEAVE events, federated to amq.topic and bound by the sensor
sidecar per hive fence) give `app_occupancy` beside the sensors' figure, in hive_status and in
the public read."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Firebase, member
from tests.integration.test_pipeline import Step, publish_positions

pytestmark = pytest.mark.integration
WAIT = 60.0
LON, LAT, D = 9.5331, 47.1650, 0.0008  # Schaan: a square of ~120 m


@pytest.fixture
async def hive(stack: ConnectionSettings, firebase: Firebase, tenant: str
               ) -> AsyncIterator[tuple[str, str, dict[str, str]]]:
    run = uuid.uuid4().hex[:8]
    hive_id, fence_id, auth = f"ap-{run}", f"ap-{run}-f", member(firebase, tenant, "editor").auth
    ring = [[LON - D, LAT - D], [LON + D, LAT - D], [LON + D, LAT + D], [LON - D, LAT + D],
            [LON - D, LAT - D]]
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        r = await http.post("/fences", headers=auth, json={
            "type": "Feature", "id": fence_id, "geometry": {"type": "Polygon", "coordinates": [ring]},
            "properties": {"name": "app occupancy test", "timeout_s": 600}})
        assert r.status_code == 201, r.text
        r = await http.post("/owner/hives", headers=auth, json={
            "id": hive_id, "name": f"Phones bar {run}", "type": "bar", "lon": LON, "lat": LAT,
            "tz": "Europe/Vaduz", "capacity": 30, "fence_id": fence_id})
        assert r.status_code == 201, r.text
        assert r.json()["fence_id"] == fence_id  # as the tenant names it (stored qualified)
        try:
            yield hive_id, fence_id, auth
        finally:
            pg = await asyncpg.connect(stack["postgres"]["dsn"])
            await pg.execute("UPDATE hive SET fence_id = NULL WHERE id = $1", hive_id)
            await http.delete(f"/fences/{fence_id}", headers=auth)
            end = time.monotonic() + WAIT
            while True:  # the sensor sidecar may write the hive's status once more meanwhile
                try:
                    async with pg.transaction():
                        for table in ("hive_status", "hive_day"):
                            await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
                        await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
                    break
                except asyncpg.ForeignKeyViolationError:
                    assert time.monotonic() < end
                    await asyncio.sleep(0.2)
            await pg.close()


async def test_phones_inside_the_hive_fence_are_its_app_occupancy(
        stack: ConnectionSettings, hive: tuple[str, str, dict[str, str]], tenant: str) -> None:
    hive_id, fence_id, _ = hive
    phones = [qualify(tenant, f"phone-{uuid.uuid4().hex[:8]}") for _ in range(3)]  # the tenant's
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        stored = await pg.fetchval("SELECT fence_id FROM hive WHERE id = $1", hive_id)
        assert stored == qualify(tenant, fence_id)

        async def app_figure() -> Any:
            return await pg.fetchval("SELECT app_occupancy FROM hive_status WHERE hive_id = $1", hive_id)

        async def until(want: int, what: str, step: Any = None) -> None:
            end = time.monotonic() + WAIT
            while await app_figure() != want:
                assert time.monotonic() < end, f"app_occupancy never {want} ({what}): {await app_figure()}"
                if step is not None:
                    await step()  # positions again until the sidecar has bound the new fence
                await asyncio.sleep(0.2)

        async def all_inside() -> None:
            for p in phones:
                await publish_positions(stack, p, [Step(LON, LAT, time.time())])

        # the sidecar binds the hive's fence at its next reload (SENSOR_RELOAD_S) or at once
        # when the fence's events start: publish until the three phones count
        await until(3, "three phones inside", all_inside)
        await publish_positions(stack, phones[0], [Step(LON + 0.01, LAT, time.time())])  # one walks out
        await until(2, "one left")
        async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
            end = time.monotonic() + WAIT
            while True:
                occ = (await http.get(f"/hives/{hive_id}")).json()["occupancy"]
                if occ is not None and occ["app_occupancy"] == 2:
                    break
                assert time.monotonic() < end, f"the public read never showed 2 phones: {occ}"
                await asyncio.sleep(0.2)
            assert occ["occupancy"] == 0  # no sensor: the sensors' figure stays at zero beside it
        assert fence_id
    finally:
        await pg.close()
