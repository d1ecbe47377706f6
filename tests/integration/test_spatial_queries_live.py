"""Spatial queries on the live stack: objects published at known places are found where they
were last seen, from the x-geo regions' memory (a bbox page by page, the nearest first within
a radius, strictly inside a polygon), through `geofence query` and the HTTP API (the whole map
for a token with the operator claim, within one's own fence for any user); a bad query is
refused with its reason."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from shapely.geometry import box, mapping

from deploy.settings import ConnectionSettings
from exchanges.x_geo import queries
from tests.integration.clients import DEADLINE, geofence
from tests.integration.test_fence_api import account, feature, firebase, operator_account  # noqa: F401 (fixture)
from tests.integration.test_fence_changes_live import Gateway, latest_is, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

CORNER = (9.5350, 47.0650)  # a quiet corner of Liechtenstein (the demo drives elsewhere)


def query(*args: str) -> dict[str, Any]:
    done = geofence("query", *args, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_objects_are_found_where_they_were_last_seen(pipeline: ConnectionSettings,  # noqa: F811
                                                           tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    places = {f"q{i}-{tag}": (CORNER[0] + 0.0004 * i, CORNER[1] + 0.0003 * i) for i in range(6)}
    t0 = time.time()
    async with Gateway(pipeline) as gw:
        await gw.send(*((o, x - 0.01, y, t0) for o, (x, y) in places.items()))  # first somewhere else
        await gw.send(*((o, x, y, t0 + 1) for o, (x, y) in places.items()))
    for o in places:
        await latest_is(o, t0 + 1)
    x0, y0 = CORNER
    bb = [str(v) for v in (x0 - 0.0001, y0 - 0.0001, x0 + 0.0025, y0 + 0.0020)]
    got: list[dict[str, Any]] = []
    after = ""
    while True:  # two objects a page
        page = query("bbox", *bb, "--limit", "2", *(["--after", after] if after else []))
        got += [r for r in page["objects"] if r["id"].endswith(tag)]
        if "next_after" not in page:
            break
        after = page["next_after"]
    assert {r["id"]: (r["lon"], r["lat"], r["ts"]) for r in got} == {
        o: (x, y, t0 + 1) for o, (x, y) in places.items()}  # the newer positions, each once

    near = query("nearby", str(x0), str(y0), "--radius", "60", "--limit", "50")["objects"]
    mine = [r for r in near if r["id"].endswith(tag)]
    assert [r["id"] for r in mine] == [f"q{i}-{tag}" for i in range(len(mine))]  # nearest first
    d1 = queries.distance_m(x0, y0, np.array([places[f"q1-{tag}"][0]]), np.array([places[f"q1-{tag}"][1]]))[0]
    assert len(mine) == 2 and d1 < 60  # q0 at 0 m, q1 at ~50 m; q2 is ~100 m away

    area = tmp_path / "area.geojson"
    area.write_text(json.dumps(mapping(box(x0 + 0.0006, y0 + 0.0004, x0 + 0.0014, y0 + 0.0011))))
    inside = [r["id"] for r in query("within", str(area))["objects"] if r["id"].endswith(tag)]
    assert inside == [f"q2-{tag}", f"q3-{tag}"]

    refused = geofence("query", "nearby", str(x0), str(y0), "--radius", "-5")
    assert refused.returncode == 2 and "radius_m" in refused.stderr
    none = query("bbox", *bb, "--where", '[["type", "==", "truck"]]')["objects"]
    assert [r for r in none if r["id"].endswith(tag)] == []  # these objects carry no fields


async def test_the_http_api_queries_for_an_operator_and_within_an_owners_fence(
        pipeline: ConnectionSettings, firebase: tuple[str, int, str]) -> None:  # noqa: F811
    operator = operator_account(firebase)
    user = account(firebase)
    tag = uuid.uuid4().hex[:8]
    x0, y0 = CORNER[0] + 0.01, CORNER[1]
    near, far = f"n-{tag}", f"f-{tag}"
    t0 = time.time()
    async with Gateway(pipeline) as gw:
        await gw.send_raw({"positions": [  # far: outside the fence square (+-0.004)
            {"id": near, "lon": x0, "lat": y0, "ts": t0, "type": "truck", "load_t": 12.5},
            {"id": far, "lon": x0 + 0.006, "lat": y0, "ts": t0, "type": "car"}]})
    await latest_is(near, t0)
    await latest_is(far, t0)
    assert pipeline["api"] is not None
    fid = f"q-{tag}"
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http:
        bbox = f"{x0 - 0.001},{y0 - 0.001},{x0 + 0.007},{y0 + 0.001}"
        denied = await http.get("/objects/within", params={"bbox": bbox}, headers=user.auth)
        assert denied.status_code == 403 and "geofence_operator" in denied.json()["error"]
        got = (await http.get("/objects/within", params={"bbox": bbox}, headers=operator.auth)).json()
        assert {r["id"] for r in got["objects"]} >= {near, far}
        only_trucks = {"bbox": bbox, "where": '[["type", "==", "truck"]]'}
        answer = await http.get("/objects/within", params=only_trucks, headers=operator.auth)
        trucks = answer.json()["objects"]
        assert [(r["id"], r["fields"]) for r in trucks if r["id"].endswith(tag)] == [
            (near, {"type": "truck", "load_t": 12.5})]
        bad_where = await http.get("/objects/within", params={"bbox": bbox, "where": '[["type", "~", 1]]'},
                                   headers=operator.auth)
        assert bad_where.status_code == 422 and "op" in bad_where.json()["error"]
        nearby = (await http.get("/objects/nearby", params={"lon": x0, "lat": y0, "radius_m": 100},
                                 headers=operator.auth)).json()["objects"]
        assert [r["id"] for r in nearby if r["id"].endswith(tag)] == [near]  # far is ~450 m away
        shape = mapping(box(x0 + 0.005, y0 - 0.001, x0 + 0.007, y0 + 0.001))
        inside = (await http.post("/objects/within", json=shape, headers=operator.auth)).json()["objects"]
        assert [r["id"] for r in inside if r["id"].endswith(tag)] == [far]
        created = await http.post("/fences", json=feature(fid, square(x0, y0), timeout_s=600),
                                  headers=user.auth)
        assert created.status_code == 201, created.text
        try:
            mine = (await http.get("/objects/within", params={"fence_id": fid}, headers=user.auth)).json()
            assert [r["id"] for r in mine["objects"] if r["id"].endswith(tag)] == [near]
            bad = await http.get("/objects/nearby", params={"lon": x0, "lat": y0, "radius_m": -3},
                                 headers=operator.auth)
            assert bad.status_code == 422 and "radius_m" in bad.json()["error"]
        finally:
            await http.delete(f"/fences/{fid}", headers=user.auth)
