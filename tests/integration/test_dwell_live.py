"""A fence's dwell time on the live stack (issue 20, part 2): an object passing through gives
no event, one that stays is reported by ENTER `dwelled` once it has been inside `dwell_s` (by
its positions' times) and its LEAVE shares the visit; the loitering report lists who has been
inside how long, the stays still waiting flagged; the archive keeps the dwelled ENTER with its
inside_s. The API shows the dwell time and refuses a bad one."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import httpx

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import Events, Gateway, defined, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5480, 47.0850)  # a spot of this test's own
DWELL_S = 20.0
OUTSIDE = (WHERE[0] + 0.05, WHERE[1])


async def test_only_stays_of_the_dwell_time_are_reported(pipeline: ConnectionSettings,  # noqa: F811
                                                        editor: Account, tenant: str, gateway: Login) -> None:
    who = editor  # an editor of the session's tenant
    tag = uuid.uuid4().hex[:8]
    fid, passer, stayer, lingerer = f"dwell-{tag}", f"passer-{tag}", f"stayer-{tag}", f"lingerer-{tag}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(fid)
        bad = await http.post("/fences", json=feature(f"bad-{tag}", square(*WHERE), dwell_s=-1),
                              headers=who.auth)
        assert bad.status_code == 422 and "dwell_s" in bad.text
        created = await http.post("/fences", json=feature(fid, square(*WHERE), dwell_s=DWELL_S),
                                  headers=who.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, fid), 1)
            shown = (await http.get(f"/fences/{fid}", headers=who.auth)).json()["properties"]
            assert shown["dwell_s"] == DWELL_S
            # whole seconds (the differences below are exact), after the fence's creation (a stay
            # in it begins no earlier)
            t0 = float(math.ceil(time.time()))
            await gw.send((passer, *WHERE, t0), (stayer, *WHERE, t0))
            await gw.send((passer, *WHERE, t0 + 10), (stayer, *WHERE, t0 + 10))
            await gw.send((passer, *OUTSIDE, t0 + 15), (lingerer, *WHERE, t0 + 15))  # 15 s: no event
            await gw.send((lingerer, *WHERE, t0 + 20))
            await gw.send((stayer, *WHERE, t0 + 25))  # 25 s inside: reported
            dwelled = await ev.until((fid, stayer, "enter", "dwelled"))
            assert dwelled["ts"] == t0 + 25 and dwelled["inside_s"] == 25.0

            report = (await http.get(f"/fences/{fid}/loitering", params={"min_s": 0},
                                     headers=who.auth)).json()
            rows = [(o["object_id"], o["inside_s"], o["confirmed"]) for o in report["objects"]
                    if o["object_id"].endswith(tag)]  # (objects an earlier run left there are inside too)
            assert rows == [(stayer, 25.0, True), (lingerer, 5.0, False)]
            long_ones = (await http.get(f"/fences/{fid}/loitering", params={"min_s": 20},
                                        headers=who.auth)).json()["objects"]
            assert [o["object_id"] for o in long_ones if o["object_id"].endswith(tag)] == [stayer]
            assert (await http.get(f"/fences/{fid}/loitering", params={"min_s": -1},
                                   headers=who.auth)).status_code == 422

            await gw.send((stayer, *OUTSIDE, t0 + 40), (lingerer, *OUTSIDE, t0 + 41))
            left = await ev.until((fid, stayer, "leave", "exited"))
            assert left["visit_id"] == dwelled["visit_id"] and left["inside_s"] == 40.0
            await ev.drain()
            assert ev.of(passer) == [] and ev.of(lingerer) == []  # stays shorter than the dwell time

            end = time.monotonic() + 30.0  # the archive keeps the dwelled ENTER and its inside_s
            while True:
                archived = (await http.get(f"/fences/{fid}/events", headers=who.auth)).json()["events"]
                kinds = [(e["object_id"], e["event"], e["reason"], e.get("inside_s")) for e in archived]
                if len(kinds) >= 2:
                    break
                assert time.monotonic() < end, f"archive has {kinds} after 30 s"
                await asyncio.sleep(0.2)  # poll with a deadline: the archiver writes in batches
            assert sorted(kinds) == [(stayer, "enter", "dwelled", 25.0), (stayer, "leave", "exited", 40.0)]
        finally:
            await http.delete(f"/fences/{fid}", headers=who.auth)
