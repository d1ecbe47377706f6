"""`geofence region list` against the running stack while positions flow: every region of the
topology is listed up, its fences as stored are the fences its x-geo holds, the shares cover
the whole curve, and the positions routed per second show the traffic."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from deploy.settings import ConnectionSettings, Settings
from tests.integration.clients import geofence, moving

pytestmark = pytest.mark.integration
WAIT = 60.0




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
