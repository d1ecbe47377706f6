"""A fence that expires at a time, on the live stack (issue 35's proof option, `expires_at`):
the API takes it as epoch seconds or an RFC 3339 time, shows it, refuses a bad one; an object
inside when it passes LEAVEs with reason `fence_expired` at that time, by the worker's timer
(no position needed), the archive keeps that LEAVE, and a position after it enters nothing."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from datetime import UTC, datetime

import httpx

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import Events, Gateway, defined, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5520, 47.0850)  # a spot of this test's own
LIFE_S = 8.0  # the fence expires this long after its creation


async def test_an_expiring_fence_leaves_who_is_inside_then_holds_no_one(
        pipeline: ConnectionSettings, editor: Account, tenant: str, gateway: Login) -> None:  # noqa: F811
    who = editor  # an editor of the session's tenant
    tag = uuid.uuid4().hex[:8]
    fid, early, late = f"expiring-{tag}", f"early-{tag}", f"late-{tag}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(fid)
        for bad in ("tomorrow", "2026-12-24T18:00:00", -1, True):
            refused = await http.post("/fences", json=feature(f"bad-{tag}", square(*WHERE), expires_at=bad),
                                      headers=who.auth)
            assert refused.status_code == 422 and "expires_at" in refused.text, refused.text
        t0 = float(math.ceil(time.time()))
        ends = t0 + LIFE_S
        iso = datetime.fromtimestamp(ends, UTC).isoformat().replace("+00:00", "Z")
        created = await http.post("/fences", json=feature(fid, square(*WHERE), expires_at=iso),
                                  headers=who.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, fid), 1)
            shown = (await http.get(f"/fences/{fid}", headers=who.auth)).json()["properties"]
            assert shown["expires_at"] == ends
            await gw.send((early, *WHERE, t0 + 1))
            entered = await ev.until((fid, early, "enter", "entered"))
            assert entered["ts"] == t0 + 1
            left = await ev.until((fid, early, "leave", "fence_expired"))  # the timer: no position sent
            assert left["ts"] == ends and left["visit_id"] == entered["visit_id"]
            await gw.send((late, *WHERE, ends + 1))  # after the expiry: outside
            end = time.monotonic() + 30.0  # the archive keeps the LEAVE
            while True:
                archived = (await http.get(f"/fences/{fid}/events", headers=who.auth)).json()["events"]
                kinds = sorted((e["object_id"], e["event"], e["reason"]) for e in archived)
                if len(kinds) >= 2:
                    break
                assert time.monotonic() < end, f"archive has {kinds} after 30 s"
                await asyncio.sleep(0.2)  # poll with a deadline: the archiver writes in batches
            assert kinds == [(early, "enter", "entered"), (early, "leave", "fence_expired")]
            await ev.drain()
            assert ev.of(late) == []
            cleared = await http.put(f"/fences/{fid}", json=feature(fid, square(*WHERE), expires_at=None),
                                     headers=who.auth)
            assert cleared.status_code == 200, cleared.text
            assert "expires_at" not in cleared.json()["properties"]  # null: it never expires again
        finally:
            await http.delete(f"/fences/{fid}", headers=who.auth)
