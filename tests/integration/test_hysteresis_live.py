"""A fence's hysteresis band on the live stack (issue 20, part 2): an object wobbling 10 m
either side of a border (GPS noise) ENTERs and LEAVEs a plain fence at every crossing, and a
fence of the same square with a 30 m band not at all; it ENTERs the banded one only once
30 m inside, and LEAVEs only once 30 m outside, whatever it does in the band between. The API
shows the band and refuses one that leaves nothing inside."""

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
from tests.integration.test_fence_changes_live import HALF, Events, Gateway, defined, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5620, 47.0780)  # a spot of this test's own
BAND_M = 30.0
DEG_PER_M = 1.0 / (111_194.93 * math.cos(math.radians(WHERE[1])))  # of longitude, here


async def test_a_band_keeps_noise_at_a_border_from_flapping(pipeline: ConnectionSettings,  # noqa: F811
                                                            editor: Account, tenant: str,
                                                            gateway: Login) -> None:
    who = editor  # an editor of the session's tenant
    tag = uuid.uuid4().hex[:8]
    banded, plain, obj = f"band-{tag}", f"plain-{tag}", f"wobbly-{tag}"
    edge = WHERE[0] - HALF  # the squares' west side

    def at(metres_inside: float) -> float:
        return edge + metres_inside * DEG_PER_M

    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(banded, plain)
        too_wide = await http.post("/fences", json=feature(f"wide-{tag}", square(*WHERE), hysteresis_m=500),
                                   headers=who.auth)
        assert too_wide.status_code == 422 and "nowhere 500 m wide" in too_wide.text
        for fid, props in ((banded, {"hysteresis_m": BAND_M}), (plain, {})):
            created = await http.post("/fences", json=feature(fid, square(*WHERE), **props), headers=who.auth)
            assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, banded), 1)
            await defined(qualify(tenant, plain), 1)
            shown = (await http.get(f"/fences/{banded}", headers=who.auth)).json()["properties"]
            assert shown["hysteresis_m"] == BAND_M
            unbanded = (await http.get(f"/fences/{plain}", headers=who.auth)).json()["properties"]
            assert "hysteresis_m" not in unbanded
            t0 = time.time()
            # 10 m out, 10 m in, ... (6 crossings), 60 m in, wobble again, 60 m out
            path = [(-10.0 if i % 2 == 0 else 10.0) for i in range(7)] + [60.0] + \
                   [(10.0 if i % 2 == 0 else -10.0) for i in range(6)] + [-60.0]
            for i, m in enumerate(path):  # one at a time: each in its own batch
                await gw.send((obj, at(m), WHERE[1], t0 + i))
            deep_in, deep_out = t0 + path.index(60.0), t0 + len(path) - 1
            left = await ev.until((banded, obj, "leave", "exited"))
            assert left["ts"] == deep_out
            # the plain fence sees every crossing of the noise (inside at every positive offset)
            flips = sum(1 for a, b in zip([-1.0, *path], path, strict=False) if (a > 0) != (b > 0))

            def of_plain() -> list[dict[str, object]]:
                return [e for e in ev.got if e["fence_id"] == plain and e["object_id"] == obj]

            end = time.monotonic() + 30.0
            while len(of_plain()) < flips:
                assert time.monotonic() < end, f"{len(of_plain())} of {flips} plain fence events in 30 s"
                await ev.drain()
                await asyncio.sleep(0.1)  # poll with a deadline: the two fences' events interleave
            await ev.drain()
            assert len(of_plain()) == flips and flips >= 12
            on_band = [(e["event"], e["ts"]) for e in ev.got
                       if e["fence_id"] == banded and e["object_id"] == obj]
            assert on_band == [("enter", deep_in), ("leave", deep_out)]
        finally:
            for fid in (banded, plain):
                await http.delete(f"/fences/{fid}", headers=who.auth)
