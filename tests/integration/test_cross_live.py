"""CROSS on the live stack (issue 20, part 2): a sparse tracker whose two positions are either
side of a fence that detects CROSS gets an event `cross` (on fence.events, keyed by its kind,
and in the archive), a fence of the same square without it gets none; a position inside
gives ENTER, not CROSS. The store gives x-geo the fence's box with its bindings (what a
restarted x-geo recovers), and the API shows the flag and refuses a bad one."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from deploy.settings import ConnectionSettings
from exchanges import routing_store
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import HALF, Events, Gateway, defined, square
from tests.integration.test_pipeline import pipeline, region_at, worldmap  # noqa: F401 (fixture)

WHERE = (9.5350, 47.0710)  # a spot of this test's own
WEST, EAST = (WHERE[0] - 2 * HALF, WHERE[1]), (WHERE[0] + 2 * HALF, WHERE[1])


async def test_a_jump_over_a_fence_is_a_cross(pipeline: ConnectionSettings,  # noqa: F811
                                             editor: Account, tenant: str, gateway: Login) -> None:
    who = editor  # an editor of the session's tenant
    tag = uuid.uuid4().hex[:8]
    fid, plain, jumper, walker = f"cross-{tag}", f"nocross-{tag}", f"jumper-{tag}", f"walker-{tag}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(fid, plain)
        bad = await http.post("/fences", json=feature(f"bad-{tag}", square(*WHERE), cross="yes"),
                              headers=who.auth)
        assert bad.status_code == 422 and "cross" in bad.text
        for f, props in ((fid, {"cross": True}), (plain, {})):
            created = await http.post("/fences", json=feature(f, square(*WHERE), **props), headers=who.auth)
            assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, fid), 1)
            await defined(qualify(tenant, plain), 1)
            assert (await http.get(f"/fences/{fid}", headers=who.auth)).json()["properties"]["cross"] is True
            region = region_at(await worldmap(pipeline), *WHERE)
            conn = await routing_store.connect(pipeline["postgres"]["dsn"])
            try:
                bound = {b.fence_id: b for b in await routing_store.region_bindings(conn, region)}
            finally:
                await conn.close()
            # the store names the fences as the pipeline does: qualified by their tenant
            assert bound[qualify(tenant, fid)].cross == (WHERE[0] - HALF, WHERE[1] - HALF, WHERE[0] + HALF,
                                                         WHERE[1] + HALF)
            assert bound[qualify(tenant, plain)].cross is None

            t0 = float(int(time.time())) + 1.0
            await gw.send((jumper, *WEST, t0), (walker, *WEST, t0))
            await gw.send((jumper, *EAST, t0 + 60), (walker, *WHERE, t0 + 30))  # over it; into it
            await gw.send((walker, *EAST, t0 + 60))
            crossed = await ev.until((fid, jumper, "cross", "crossed"))
            assert crossed["ts"] == t0 + 60 and "visit_id" not in crossed
            await ev.until((fid, walker, "leave", "exited"))
            await ev.until((plain, walker, "leave", "exited"))
            await ev.drain()
            assert sorted(ev.of(jumper)) == [(fid, "cross", "crossed")]
            assert sorted(ev.of(walker)) == sorted([(fid, "enter", "entered"), (fid, "leave", "exited"),
                                                    (plain, "enter", "entered"), (plain, "leave", "exited")])

            end = time.monotonic() + 30.0  # the archive keeps it
            while True:
                archived = (await http.get(f"/fences/{fid}/events", headers=who.auth)).json()["events"]
                mine = [(e["object_id"], e["event"], e["reason"]) for e in archived]
                if (jumper, "cross", "crossed") in mine:
                    break
                assert time.monotonic() < end, f"archive has {mine} after 30 s"
                await asyncio.sleep(0.2)  # poll with a deadline: the archiver writes in batches
        finally:
            for f in (fid, plain):
                await http.delete(f"/fences/{f}", headers=who.auth)
