"""`geofence region list` against the running stack while positions flow: every region of the
topology is listed up, its fences as stored are the fences its x-geo holds, the shares cover
the whole curve, and the positions routed per second show the traffic."""

from __future__ import annotations

import asyncio
import json

import pytest

from deploy.settings import ConnectionSettings, Settings
from tests.integration.clients import geofence
from tests.integration.test_map import moving

pytestmark = pytest.mark.integration


async def test_region_list_shows_every_region_with_its_traffic(stack: ConnectionSettings) -> None:
    stop = asyncio.Event()
    sender = asyncio.create_task(moving(stack, "region-list-probe", stop))
    try:
        await asyncio.sleep(1.0)  # lets the probe's positions start (a window, not a synchronisation)
        done = await asyncio.to_thread(geofence, "region", "list", "--json", "--interval", "3")
    finally:
        stop.set()
        sent = await sender
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["region"]: r for r in json.loads(done.stdout)}
    assert set(rows) >= set(Settings.from_env().regions)
    assert all(r["up"] and r["in_worldmap"] for r in rows.values())
    assert abs(sum(r["share"] for r in rows.values()) - 1.0) < 1e-9
    assert all(r["fences_bound"] == r["fences_stored"] for r in rows.values()), rows
    assert sum(r["positions_per_s"] for r in rows.values()) > 0 and len(sent) > 10
    human = await asyncio.to_thread(geofence, "region", "list", "--interval", "0")
    assert human.returncode == 0 and human.stdout.startswith("region") and "!" not in human.stdout
