"""An object's own TTL on the live stack: a position carrying `ttl` enters a fence whose
timeout is an hour; the object then falls silent, and the worker LEAVEs it `expired` at last
seen + TTL (its visit closed with inside_s = TTL), the archive stores the reason; an object
sending no `ttl` beside it stays inside."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import Events, Gateway, defined, inspect, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5480, 47.0710)  # a corner of Liechtenstein of this test's own
TTL_S = 3.0


async def test_an_object_silent_past_its_ttl_leaves_expired(pipeline: ConnectionSettings,  # noqa: F811
                                                            editor: Account, tenant: str,
                                                            gateway: Login) -> None:
    who = editor  # an editor of the session's tenant
    f = f"ttl-{uuid.uuid4().hex[:10]}"
    brief, steady = f"brief-{uuid.uuid4().hex[:8]}", f"steady-{uuid.uuid4().hex[:8]}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(f)
        created = await http.post("/fences", json=feature(f, square(*WHERE), timeout_s=3600),
                                  headers=who.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, f), 1)
            t0 = time.time()
            await gw.send((brief, *WHERE, t0), (steady, WHERE[0] + 0.0005, WHERE[1], t0))
            await ev.until((f, brief, "enter", "entered"))
            await ev.until((f, steady, "enter", "entered"))
            # x-ingress takes `ttl` as an extra field of the gateway position
            await gw.send_raw({"positions": [{"id": brief, "lon": WHERE[0], "lat": WHERE[1], "ts": t0 + 1,
                                              "ttl": TTL_S}]})
            left = await ev.until((f, brief, "leave", "expired"), deadline=30.0)
            assert left["ts"] == t0 + 1 + TTL_S and abs(left["inside_s"] - (1 + TTL_S)) < 1e-3
            enter = next(e for e in ev.got if e["object_id"] == brief and e["event"] == "enter")
            assert left["visit_id"] == enter["visit_id"]
            occupants = {o["object_id"] for o in inspect("fence", f, "--tenant", tenant)["occupants"]}
            assert qualify(tenant, steady) in occupants and qualify(tenant, brief) not in occupants
            conn = await asyncpg.connect(pipeline["postgres"]["dsn"])
            try:
                end = time.monotonic() + DEADLINE
                while (reason := await conn.fetchval(
                        "SELECT reason FROM fence_event WHERE event_id = $1", left["event_id"])) is None:
                    assert time.monotonic() < end, "the expired LEAVE never reached the archive"
                    await asyncio.sleep(0.2)
                assert reason == "expired"
            finally:
                await conn.close()
        finally:
            await http.delete(f"/fences/{f}", headers=who.auth)
