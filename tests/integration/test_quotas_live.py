"""Quotas against the running stack (fence/quotas.py): a tenant's fences, vertices, follow fences
and proximity subscriptions over the HTTP API, set by `geofence tenant quota`, read by its
members at `/tenants/{t}/quota`; a change past a quota is a 403 naming it and stores nothing,
a change that does not grow is never refused; two creations at once cannot both take the last
one. And a venue owner's hives (the quota lowered for the test)."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from deploy.settings import ConnectionSettings
from fence.venues import owner_store
from fence.venues.user_store import UserError
from tests.integration.clients import DEADLINE, Account, Firebase, geofence, member
from tests.integration.conftest import drop_tenant, make_tenant

pytestmark = pytest.mark.integration


def ring(lon: float, lat: float, n: int, r: float = 0.001) -> list[list[float]]:
    """A closed ring of n distinct positions (n + 1 with the closing one)."""
    angles = [2 * math.pi * i / n for i in range(n)]
    pts = [[round(lon + r * math.cos(a), 7), round(lat + r * math.sin(a), 7)] for a in angles]
    return [*pts, pts[0]]


def fence(fid: str, n: int = 4, lon: float = 9.5) -> dict[str, Any]:
    return {"type": "Feature", "id": fid, "properties": {},
            "geometry": {"type": "Polygon", "coordinates": [ring(lon, 47.1, n)]}}


@pytest.fixture
def quota_tenant(stack: ConnectionSettings) -> Iterator[str]:
    made = make_tenant("quota")
    try:
        yield made
    finally:
        drop_tenant(made)


@pytest.fixture
async def http(stack: ConnectionSettings) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as client:
        yield client


def set_quota(tenant: str, *sets: str) -> dict[str, Any]:
    args = [a for s in sets for a in ("--set", s)]
    done = geofence("tenant", "quota", tenant, *args, "--json")
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


async def test_a_tenants_fences_vertices_and_follow_fences_stop_at_its_quota(
        http: httpx.AsyncClient, firebase: Firebase, quota_tenant: str) -> None:
    editor: Account = member(firebase, quota_tenant, "editor")
    report = set_quota(quota_tenant, "fences=2", "vertices=30", "follow_fences=1")
    assert report["fences"] == {"max": 2, "used": 0, "default": False}
    assert report["subscriptions"]["default"] is True
    made: list[str] = []
    try:
        for fid in ("q-1", "q-2"):
            r = await http.post("/fences", json=fence(fid, 4), headers=editor.auth)
            assert r.status_code == 201, r.text
            made.append(fid)
        r = await http.post("/fences", json=fence("q-3", 4), headers=editor.auth)
        assert r.status_code == 403, r.text
        assert "would hold 3 live fences; its quota is 2" in r.json()["error"]
        assert (await http.get("/fences/q-3", headers=editor.auth)).status_code == 404  # nothing stored
        # 10 vertices held (5 + 5); a replacement of 26 positions makes 31 > 30: refused
        r = await http.put("/fences/q-1", json=fence("q-1", 25), headers=editor.auth)
        assert r.status_code == 403 and "31 vertices" in r.json()["error"], r.text
        r = await http.put("/fences/q-1", json=fence("q-1", 20), headers=editor.auth)  # 21 + 5 = 26
        assert r.status_code == 200, r.text
        # lowered below what is held: what does not grow still goes (a smaller polygon, a rename)
        set_quota(quota_tenant, "vertices=5", "fences=1")
        r = await http.put("/fences/q-1", json=fence("q-1", 10), headers=editor.auth)
        assert r.status_code == 200, r.text
        r = await http.put("/fences/q-2", json=fence("q-2", 4) | {"properties": {"name": "renamed"}},
                           headers=editor.auth)
        assert r.status_code == 200, r.text
        r = await http.put("/fences/q-2", json=fence("q-2", 5), headers=editor.auth)  # grows: refused
        assert r.status_code == 403 and "vertices" in r.json()["error"]
        set_quota(quota_tenant, "vertices=default", "fences=default")
        # follow fences (a fence attached to an object): one, then a second refused
        for fid, code in (("q-1", 200), ("q-2", 403)):
            r = await http.put(f"/fences/{fid}", json={"follow": "van-1", "radius_m": 100},
                               headers=editor.auth)
            assert r.status_code == code, r.text
        assert "would hold 2 follow fences; its quota is 1" in r.json()["error"]
        # its members read it
        got = (await http.get(f"/tenants/{quota_tenant}/quota", headers=editor.auth)).json()["quota"]
        assert got["follow_fences"] == {"max": 1, "used": 1, "default": False}
        assert got["fences"] == {"max": 10_000, "used": 2, "default": True}
    finally:
        for fid in made:
            await http.delete(f"/fences/{fid}", headers=editor.auth)


async def test_two_creations_at_once_cannot_both_take_the_last_one(
        http: httpx.AsyncClient, firebase: Firebase, quota_tenant: str) -> None:
    editor = member(firebase, quota_tenant, "editor")
    set_quota(quota_tenant, "fences=1")
    answers = await asyncio.gather(*(http.post("/fences", json=fence(f"race-{i}", 4, 9.5 + i * 0.01),
                                               headers=editor.auth) for i in range(6)))
    try:
        codes = sorted(r.status_code for r in answers)
        assert codes == [201, 403, 403, 403, 403, 403], [r.text for r in answers]
    finally:
        for r in answers:
            if r.status_code == 201:
                await http.delete(f"/fences/{r.json()['id']}", headers=editor.auth)


async def test_subscriptions_stop_at_the_quota_and_a_change_still_goes(
        http: httpx.AsyncClient, firebase: Firebase, quota_tenant: str) -> None:
    editor = member(firebase, quota_tenant, "editor")
    set_quota(quota_tenant, "subscriptions=1")
    body = {"object": "van-1", "radius_m": 200}
    r = await http.put("/subscriptions/s-1", json=body, headers=editor.auth)
    try:
        assert r.status_code in (200, 201), r.text
        r = await http.put("/subscriptions/s-2", json=body, headers=editor.auth)
        assert r.status_code == 403 and "proximity subscriptions" in r.json()["error"]
        r = await http.put("/subscriptions/s-1", json=body | {"radius_m": 300}, headers=editor.auth)
        assert r.status_code in (200, 201), r.text  # a change of the one held
    finally:
        await http.delete("/subscriptions/s-1", headers=editor.auth)


def test_the_quota_command_refuses_what_it_cannot_set(quota_tenant: str) -> None:
    for bad in ("fences=-1", "fences=many", "bogus=3", "fences"):
        done = geofence("tenant", "quota", quota_tenant, "--set", bad)
        assert done.returncode == 2 and "--set" in done.stderr, (bad, done.stderr)
    done = geofence("tenant", "quota", f"nobody-{uuid.uuid4().hex[:6]}")
    assert done.returncode == 1 and "no tenant" in done.stderr
    done = geofence("tenant", "quota", quota_tenant)
    assert done.returncode == 0 and "fences" in done.stdout and "(default)" in done.stdout


async def test_a_venue_owner_stops_at_the_hive_quota(stack: ConnectionSettings,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owner_store, "HIVES_PER_OWNER", 2)
    pool = await asyncpg.create_pool(stack["postgres"]["dsn"], min_size=1, max_size=2)
    uid = f"quota-owner-{uuid.uuid4().hex[:8]}"
    ids = [f"qh-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    try:
        for hid in ids[:2]:
            await owner_store.put_hive(pool, uid, {"id": hid, "name": "Bar", "type": "bar", "lon": 9.5,
                                                   "lat": 47.1})
        with pytest.raises(UserError, match="you hold 2 hives; the quota is 2") as caught:
            await owner_store.put_hive(pool, uid, {"id": ids[2], "name": "Bar", "type": "bar", "lon": 9.5,
                                                   "lat": 47.1})
        assert caught.value.status == 403
        assert not await pool.fetchval("SELECT EXISTS (SELECT 1 FROM hive WHERE id = $1)", ids[2])
    finally:
        await pool.execute("DELETE FROM hive WHERE owner_uid = $1", uid)
        await pool.close()
