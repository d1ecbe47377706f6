"""`geofence region list` against the running stack while positions flow: every region of the
topology is listed up, its fences as stored are the fences its x-geo holds, the shares cover
the whole curve, and the positions routed per second show the traffic."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aio_pika
import pytest

from deploy.settings import ConnectionSettings, Settings
from exchanges import topology as t
from tests.integration.clients import DEADLINE, geofence

pytestmark = pytest.mark.integration
WAIT = 60.0


async def moving(stack: ConnectionSettings, tenant: str, object_id: str, stop: asyncio.Event
                 ) -> list[tuple[float, float]]:
    """Positions of `tenant`'s object (`positions.<tenant>.<object_id>`, as the administrator),
    a step east every 0.2 s, until `stop` (outside every fence)."""
    sent = []
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        k = 0
        while not stop.is_set():
            lon, lat = 9.40 + 0.0001 * k, 47.02
            body = json.dumps({"lon": lon, "lat": lat, "ts": time.time()}).encode()
            await ex.publish(aio_pika.Message(body), f"{t.POSITIONS_TOPIC_PREFIX}.{tenant}.{object_id}")
            sent.append((lon, lat))
            k += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    return sent


async def test_region_list_shows_every_region_with_its_traffic(stack: ConnectionSettings,
                                                                tenant: str) -> None:
    stop = asyncio.Event()
    sender = asyncio.create_task(moving(stack, tenant, "region-list-probe", stop))
    listed: list[Any] = []

    async def routed() -> bool:
        done = await asyncio.to_thread(geofence, "region", "list", "--json", "--interval", "2")
        assert done.returncode == 0, done.stdout + done.stderr
        listed[:] = json.loads(done.stdout)
        return bool(sum(r.get("positions_per_s", 0) for r in listed) > 0)

    try:
        end = time.monotonic() + WAIT
        while not await routed():  # the probe's first positions may come after the first read
            assert time.monotonic() < end, f"no positions routed in {WAIT:g}s: {listed}"
    finally:
        stop.set()
        sent = await sender
    rows = {r["region"]: r for r in listed}
    assert set(rows) >= set(Settings.from_env().regions)
    assert all(r["up"] and r["in_worldmap"] for r in rows.values())
    assert abs(sum(r["share"] for r in rows.values()) - 1.0) < 1e-9
    assert all(r["fences_bound"] == r["fences_stored"] for r in rows.values()), rows
    assert len(sent) > 10
    human = await asyncio.to_thread(geofence, "region", "list", "--interval", "0")
    assert human.returncode == 0 and human.stdout.startswith("region") and "!" not in human.stdout
