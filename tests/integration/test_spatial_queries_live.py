"""Spatial queries on the live stack: objects published at known places are found where they
were last seen, from the x-geo regions' memory (a bbox page by page, the nearest first within
a radius, strictly inside a polygon), through `geofence query` and the HTTP API; a tenant's
query sees its tenant's objects only, by the names it gave them (another tenant's objects of
the same names at the same places are not there), an operator's without a tenant sees every
tenant's (ids `<tenant>:<id>`, a `tenant` field); a user of no tenant is refused; a bad query is
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
from exchanges.tenancy import qualify
from exchanges.x_geo import queries
from tests.integration.clients import DEADLINE, Account, Firebase, Login, account, geofence, operator_account
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import Gateway, latest_is, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

CORNER = (9.5350, 47.0650)  # a quiet corner of Liechtenstein (the demo drives elsewhere)


def query(*args: str) -> dict[str, Any]:
    done = geofence("query", *args, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def test_objects_are_found_where_they_were_last_seen(pipeline: ConnectionSettings,  # noqa: F811
                                                           tmp_path: Path, tenant: str, gateway: Login,
                                                           other_gateway: Login) -> None:
    tag = uuid.uuid4().hex[:8]
    places = {f"q{i}-{tag}": (CORNER[0] + 0.0004 * i, CORNER[1] + 0.0003 * i) for i in range(6)}
    mine_too = ("--tenant", tenant)
    t0 = time.time()
    async with Gateway(pipeline, gateway) as gw, Gateway(pipeline, other_gateway) as theirs:
        await gw.send(*((o, x - 0.01, y, t0) for o, (x, y) in places.items()))  # first somewhere else
        await gw.send(*((o, x, y, t0 + 1) for o, (x, y) in places.items()))
        # the other tenant's objects of the same names, at the same places, a little later
        await theirs.send(*((o, x, y, t0 + 2) for o, (x, y) in places.items()))
    for o in places:
        await latest_is(qualify(tenant, o), t0 + 1)
        await latest_is(qualify(other_gateway.tenant, o), t0 + 2)
    x0, y0 = CORNER
    bb = [str(v) for v in (x0 - 0.0001, y0 - 0.0001, x0 + 0.0025, y0 + 0.0020)]
    got: list[dict[str, Any]] = []
    after = ""
    for _ in range(20):  # two objects a page, `next_after` given back as `--after` (as the output says)
        page = query("bbox", *bb, *mine_too, "--limit", "2", *(["--after", after] if after else []))
        got += [r for r in page["objects"] if r["id"].endswith(tag)]
        if "next_after" not in page:
            break
        after = page["next_after"]
    else:
        raise AssertionError(f"the pages never end: {[r['id'] for r in got][:12]}...")
    assert [r["id"] for r in got] == sorted(places)  # each once, by the tenant's names, not the others'
    assert {r["id"]: (r["lon"], r["lat"], r["ts"]) for r in got} == {
        o: (x, y, t0 + 1) for o, (x, y) in places.items()}  # the newer positions, each once

    near = query("nearby", str(x0), str(y0), "--radius", "60", "--limit", "50", *mine_too)["objects"]
    mine = [r for r in near if r["id"].endswith(tag)]
    assert [r["id"] for r in mine] == [f"q{i}-{tag}" for i in range(len(mine))]  # nearest first
    d1 = queries.distance_m(x0, y0, np.array([places[f"q1-{tag}"][0]]), np.array([places[f"q1-{tag}"][1]]))[0]
    assert len(mine) == 2 and d1 < 60  # q0 at 0 m, q1 at ~50 m; q2 is ~100 m away

    area = tmp_path / "area.geojson"
    area.write_text(json.dumps(mapping(box(x0 + 0.0006, y0 + 0.0004, x0 + 0.0014, y0 + 0.0011))))
    inside = [r["id"] for r in query("within", str(area), *mine_too)["objects"] if r["id"].endswith(tag)]
    assert inside == [f"q2-{tag}", f"q3-{tag}"]
    # without --tenant, every tenant's: the ids as the pipeline names them
    everyone = [r["id"] for r in query("within", str(area))["objects"] if r["id"].endswith(tag)]
    assert everyone == sorted(qualify(t, f"q{i}-{tag}")
                              for t in (tenant, other_gateway.tenant) for i in (2, 3))

    refused = geofence("query", "nearby", str(x0), str(y0), "--radius", "-5")
    assert refused.returncode == 2 and "radius_m" in refused.stderr
    none = query("bbox", *bb, *mine_too, "--where", '[["type", "==", "truck"]]')["objects"]
    assert [r for r in none if r["id"].endswith(tag)] == []  # these objects carry no fields


async def test_the_http_api_queries_a_tenants_objects(
        pipeline: ConnectionSettings, firebase: Firebase, editor: Account, outsider: Account,  # noqa: F811
        tenant: str, other_tenant: str, gateway: Login, other_gateway: Login) -> None:
    operator = operator_account(firebase)  # of no tenant: every tenant's objects
    nobody = account(firebase)  # a member of no tenant
    user = editor
    tag = uuid.uuid4().hex[:8]
    x0, y0 = CORNER[0] + 0.01, CORNER[1]
    near, far = f"n-{tag}", f"f-{tag}"
    t0 = time.time()
    async with Gateway(pipeline, gateway) as gw, Gateway(pipeline, other_gateway) as theirs:
        await gw.send_raw({"positions": [  # far: outside the fence square (+-0.004)
            {"id": near, "lon": x0, "lat": y0, "ts": t0, "type": "truck", "load_t": 12.5},
            {"id": far, "lon": x0 + 0.006, "lat": y0, "ts": t0, "type": "car"}]})
        # another tenant's `near`, at the same spot, a truck too
        await theirs.send_raw({"positions": [{"id": near, "lon": x0, "lat": y0, "ts": t0, "type": "truck",
                                              "load_t": 3.0}]})
    await latest_is(qualify(tenant, near), t0)
    await latest_is(qualify(tenant, far), t0)
    await latest_is(qualify(other_tenant, near), t0)
    assert pipeline["api"] is not None
    fid = f"q-{tag}"
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http:
        bbox = f"{x0 - 0.001},{y0 - 0.001},{x0 + 0.007},{y0 + 0.001}"
        denied = await http.get("/objects/within", params={"bbox": bbox}, headers=nobody.auth)
        assert denied.status_code == 403 and "member of no tenant" in denied.json()["error"]
        got = (await http.get("/objects/within", params={"bbox": bbox}, headers=user.auth)).json()
        assert sorted(r["id"] for r in got["objects"] if r["id"].endswith(tag)) == sorted([near, far])
        everyone = (await http.get("/objects/within", params={"bbox": bbox}, headers=operator.auth)).json()
        assert sorted((r["id"], r["tenant"]) for r in everyone["objects"] if r["id"].endswith(tag)) == sorted(
            [(qualify(tenant, near), tenant), (qualify(tenant, far), tenant),
             (qualify(other_tenant, near), other_tenant)])
        theirs_seen = (await http.get("/objects/within", params={"bbox": bbox}, headers=outsider.auth)).json()
        assert [(r["id"], r["fields"]) for r in theirs_seen["objects"] if r["id"].endswith(tag)] == [
            (near, {"type": "truck", "load_t": 3.0})]
        only_trucks = {"bbox": bbox, "where": '[["type", "==", "truck"]]'}
        answer = await http.get("/objects/within", params=only_trucks, headers=user.auth)
        trucks = answer.json()["objects"]
        assert [(r["id"], r["fields"]) for r in trucks if r["id"].endswith(tag)] == [
            (near, {"type": "truck", "load_t": 12.5})]
        bad_where = await http.get("/objects/within", params={"bbox": bbox, "where": '[["type", "~", 1]]'},
                                   headers=user.auth)
        assert bad_where.status_code == 422 and "op" in bad_where.json()["error"]
        nearby = (await http.get("/objects/nearby", params={"lon": x0, "lat": y0, "radius_m": 100},
                                 headers=user.auth)).json()["objects"]
        assert [r["id"] for r in nearby if r["id"].endswith(tag)] == [near]  # far is ~450 m away
        shape = mapping(box(x0 + 0.005, y0 - 0.001, x0 + 0.007, y0 + 0.001))
        inside = (await http.post("/objects/within", json=shape, headers=user.auth)).json()["objects"]
        assert [r["id"] for r in inside if r["id"].endswith(tag)] == [far]
        created = await http.post("/fences", json=feature(fid, square(x0, y0), timeout_s=600),
                                  headers=user.auth)
        assert created.status_code == 201, created.text
        try:
            mine = (await http.get("/objects/within", params={"fence_id": fid}, headers=user.auth)).json()
            assert [r["id"] for r in mine["objects"] if r["id"].endswith(tag)] == [near]
            hidden = await http.get("/objects/within", params={"fence_id": fid}, headers=outsider.auth)
            assert hidden.status_code == 404  # another tenant's fence
            bad = await http.get("/objects/nearby", params={"lon": x0, "lat": y0, "radius_m": -3},
                                 headers=user.auth)
            assert bad.status_code == 422 and "radius_m" in bad.json()["error"]
        finally:
            await http.delete(f"/fences/{fid}", headers=user.auth)
