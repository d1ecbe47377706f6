"""A fence's `where` on the live stack (issue 20, part 3): a fence for trucks only. A truck
ENTERs it, a car at the same spot does not; the truck turning into a car (its fields no longer
match) LEAVEs, and ENTERs again when they match again; a position without fields is outside.
The API shows the filter and refuses a malformed one."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import Events, Gateway, defined, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5560, 47.0850)  # a spot of this test's own
TRUCKS = [["type", "in", ["truck", "lorry"]], ["speed", "<", 90]]


async def seen(ev: Events, want: tuple[str, str, str, str], n: int) -> None:
    """Polls (with a deadline) until the n-th event (fence, object, event, reason) came."""
    end = time.monotonic() + 30.0
    while sum((e["fence_id"], e["object_id"], e["event"], e["reason"]) == want for e in ev.got) < n:
        assert time.monotonic() < end, f"no {n} x {want} within 30 s; got {ev.got}"
        await ev.drain()
        await asyncio.sleep(0.1)


async def test_a_fence_for_trucks_only(pipeline: ConnectionSettings,  # noqa: F811
                                       editor: Account, tenant: str, gateway: Login) -> None:
    who = editor  # an editor of the session's tenant
    tag = uuid.uuid4().hex[:8]
    fid, truck, car = f"trucks-{tag}", f"truck-{tag}", f"car-{tag}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(fid)
        bad = await http.post("/fences", json=feature(f"bad-{tag}", square(*WHERE), where=[["type", "~", 1]]),
                              headers=who.auth)
        assert bad.status_code == 422 and "where op" in bad.text
        created = await http.post("/fences", json=feature(fid, square(*WHERE), where=TRUCKS),
                                  headers=who.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, fid), 1)
            shown = (await http.get(f"/fences/{fid}", headers=who.auth)).json()["properties"]
            assert shown["where"] == TRUCKS
            t0 = time.time()
            lon, lat = WHERE

            async def at(obj: str, ts: float, **fields: object) -> None:
                await gw.send_raw({"positions": [{"id": obj, "lon": lon, "lat": lat, "ts": ts, **fields}]})

            await at(truck, t0, type="truck", speed=50)
            await at(car, t0, type="car", speed=50)
            await ev.until((fid, truck, "enter", "entered"))
            await at(truck, t0 + 1, type="car", speed=50)  # its fields stop matching
            await ev.until((fid, truck, "leave", "exited"))
            await at(truck, t0 + 2, type="lorry", speed=40)
            await at(truck, t0 + 3)  # no fields: outside
            await seen(ev, (fid, truck, "leave", "exited"), 2)
            await at(car, t0 + 4, type="car", speed=10)
            await at(truck, t0 + 5, type="truck", speed=95)  # too fast: stays outside
            await at(truck, t0 + 6, type="truck", speed=20)
            await seen(ev, (fid, truck, "enter", "entered"), 3)
            mine = [(e["object_id"], e["event"], e["ts"]) for e in ev.got if e["fence_id"] == fid]
            assert mine == [(truck, "enter", t0), (truck, "leave", t0 + 1), (truck, "enter", t0 + 2),
                            (truck, "leave", t0 + 3), (truck, "enter", t0 + 6)], mine
            # each carries the position it was decided from, the position's fields with it
            where = [e["position"] for e in ev.got if e["fence_id"] == fid]
            assert [(p["lon"], p["lat"], p["ts"]) for p in where] == [(lon, lat, t) for _, _, t in mine]
            assert [p.get("fields") for p in where] == [
                {"type": "truck", "speed": 50}, {"type": "car", "speed": 50}, {"type": "lorry", "speed": 40},
                None, {"type": "truck", "speed": 20}]
        finally:
            await http.delete(f"/fences/{fid}", headers=who.auth)
