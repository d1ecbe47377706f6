"""A new, replaced or moved fence decides from where objects are now, on the live stack.

The defect this guards against: a worker learns an object's position only while x-geo routes
it there, so its "last position" of an object that left its fences can be anywhere the object
has long left. A fence created (or moved) over such a place used to ENTER the object from
there. Now each region's x-geo re-checks, behind the change, the objects whose latest position
it holds in the fence's old or new ranges (fence/x_fence/core.py, "Fence changes").

Positions come as AMQP gateway batches (exchange `ingress.gateway`, routing key the tenant, as
the session tenant's gateway user), fences through `geofence fence add --tenant` (the CLI) and
the HTTP API (a member of the tenant); what the pipeline believes is read back with `geofence
inspect` (qualified ids, `<tenant>:<name>`) and `GET /objects/{id}/fences`. Ids are fresh per
run; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest

from deploy.settings import ConnectionSettings, Settings
from exchanges import topology as t
from exchanges.hash_ring import HashRing
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login, geofence, login_url
from tests.integration.test_fence_api import feature
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

P_AT = (9.5210, 47.1410)  # Vaduz
R_AT = (9.5210, 47.1860)  # about 5 km north
PACIFIC = (-140.0, -50.0)
HALF = 0.004  # a fence is a square of 2 x HALF degrees


def square(lon: float, lat: float) -> dict[str, Any]:
    return {"type": "Polygon", "coordinates": [[[lon - HALF, lat - HALF], [lon + HALF, lat - HALF],
                                                 [lon + HALF, lat + HALF], [lon - HALF, lat + HALF],
                                                 [lon - HALF, lat - HALF]]]}


def same_worker_ids(prefix: str, n: int, tenant: str) -> list[str]:
    """n fresh fence names of `tenant` that the ring puts on one worker (as the issue's P and R
    were; the ring places the qualified ids)."""
    ring = HashRing(list(Settings.from_env().workers))
    first = f"{prefix}-{uuid.uuid4().hex[:10]}"
    ids = [first]
    while len(ids) < n:
        cand = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if ring.node_for(qualify(tenant, cand)) == ring.node_for(qualify(tenant, first)):
            ids.append(cand)
    return ids


class Gateway:
    """Publishes gateway batches as a tenant's gateway user, to ingress.gateway with its tenant
    as the routing key (confirmed, persistent, mandatory); ids as the tenant names them."""

    def __init__(self, stack: ConnectionSettings, login: Login) -> None:
        self.url = login_url(stack, login, t.INGRESS_VHOST)
        self.tenant = login.tenant

    async def __aenter__(self) -> Gateway:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        ch = await self.conn.channel(publisher_confirms=True)
        self.ex = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)  # a gateway may not declare
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def send(self, *positions: tuple[str, float, float, float]) -> None:
        await self.send_raw({"positions": [{"id": o, "lon": lon, "lat": lat, "ts": ts}
                                           for o, lon, lat, ts in positions]})

    async def send_raw(self, body: dict[str, Any]) -> None:
        await self.ex.publish(aio_pika.Message(json.dumps(body).encode(), content_type="application/json",
                                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                              self.tenant, mandatory=True, timeout=DEADLINE)


class Events:
    """Everything fence.events says about some fences of a tenant (a private queue bound to
    them, as the administrator). Names are as the tenant gave them; every event must carry
    the tenant and its fence and object unqualified."""

    def __init__(self, stack: ConnectionSettings, tenant: str) -> None:
        self.url = stack["amqp"][t.FENCES_VHOST]
        self.tenant = tenant
        self.got: list[dict[str, Any]] = []

    async def __aenter__(self) -> Events:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        self.queue = await (await self.conn.channel()).declare_queue("", exclusive=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def watch(self, *fence_ids: str) -> None:
        for f in fence_ids:
            await self.queue.bind(t.EVENTS_EXCHANGE, t.event_binding_key(qualify(self.tenant, f)))

    def _add(self, body: bytes) -> None:
        e = json.loads(body)
        assert e.get("tenant") == self.tenant, e
        assert ":" not in e["fence_id"] and ":" not in e["object_id"], e  # as the tenant names them
        self.got.append(e)

    async def until(self, want: tuple[str, str, str, str], deadline: float = 30.0) -> dict[str, Any]:
        """Collect until an event (fence, object, event, reason) has come; returns it."""
        end = time.monotonic() + deadline
        while True:
            for e in self.got:
                if (e["fence_id"], e["object_id"], e["event"], e["reason"]) == want:
                    return e
            if time.monotonic() > end:
                raise AssertionError(f"no {want} within {deadline:g}s; got {self.got}")
            message = await self.queue.get(fail=False, timeout=DEADLINE)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            await message.ack()
            self._add(message.body)

    async def drain(self) -> None:
        while (message := await self.queue.get(fail=False, timeout=DEADLINE)) is not None:
            await message.ack()
            self._add(message.body)

    def of(self, object_id: str) -> list[tuple[str, str, str]]:
        return [(e["fence_id"], e["event"], e["reason"]) for e in self.got if e["object_id"] == object_id]


def inspect(*args: str) -> Any:
    done = geofence("inspect", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def latest_is(object_id: str, ts: float) -> None:
    """Wait until the pipeline (x-geo) has the object's (qualified id) position of `ts` as its
    latest."""
    end = time.monotonic() + DEADLINE
    while True:
        seen = inspect("object", object_id)["latest"]
        if any(p["ts"] == ts for p in seen.values()):
            return
        if time.monotonic() > end:
            raise AssertionError(f"x-geo never had {object_id}'s position of {ts}: {seen}")
        await asyncio.sleep(0.1)


async def defined(fence_id: str, version: int) -> dict[str, Any]:
    """Wait until the fence's (qualified id) worker has this version (its re-checks come in the
    same message)."""
    end = time.monotonic() + DEADLINE
    while True:
        done = geofence("inspect", "fence", fence_id, "--json")
        if done.returncode == 0 and json.loads(done.stdout)["version"] >= version:
            return dict(json.loads(done.stdout))
        if time.monotonic() > end:
            raise AssertionError(f"fence {fence_id} v{version} never reached its worker: {done.stderr}")
        await asyncio.sleep(0.1)


def fence_add(tmp_path: Path, tenant: str, fence_id: str, at: tuple[float, float], timeout_s: float) -> None:
    path = tmp_path / f"{fence_id}.geojson"
    path.write_text(json.dumps(feature(fence_id, square(*at), timeout_s=timeout_s)))
    done = geofence("fence", "add", str(path), "--tenant", tenant)
    assert done.returncode == 0, done.stderr
    assert qualify(tenant, fence_id) in done.stdout, done.stdout
    listed = json.loads(geofence("fence", "list", "--tenant", tenant, "--json").stdout)
    [row] = [r for r in listed if r["fence_id"] == qualify(tenant, fence_id)]
    assert (row["tenant"], row["timeout_s"]) == (tenant, timeout_s) and row["regions"]
    assert {r["tenant"] for r in listed} == {tenant}


@pytest.fixture
async def cleanup(tenant: str) -> AsyncIterator[list[str]]:
    ids: list[str] = []
    yield ids
    if ids:
        geofence("fence", "remove", *ids, "--tenant", tenant)


async def test_a_new_fence_does_not_enter_an_object_from_where_it_was_long_ago(
        pipeline: ConnectionSettings, tmp_path: Path, cleanup: list[str], tenant: str,  # noqa: F811
        gateway: Login) -> None:
    """The issue's scenario, step by step, with a parked object inside R's area (entered at
    R's creation) and one parked there longer than R's timeout (not entered) beside it."""
    p, r = same_worker_ids("lp", 2, tenant)
    x, parked, stale = (f"{k}-{uuid.uuid4().hex[:8]}" for k in ("x", "parked", "stale"))
    key = {n: qualify(tenant, n) for n in (p, r, x, parked, stale)}  # as the pipeline names them
    cleanup += [p, r]
    fence_add(tmp_path, tenant, p, P_AT, 3600.0)
    await defined(key[p], 1)
    t0 = time.time()
    async with Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(p, r)
        await gw.send((x, *P_AT, t0))  # 1. X inside P
        await ev.until((p, x, "enter", "entered"))
        await gw.send((x, *R_AT, t0 + 2), (parked, R_AT[0] + 0.001, R_AT[1], t0 + 2),
                      (stale, R_AT[0] - 0.001, R_AT[1], t0 - 4000))  # 2. into R's area: no fence yet
        await ev.until((p, x, "leave", "exited"))
        await gw.send((x, *PACIFIC, t0 + 4))  # 3. the South Pacific
        await latest_is(key[x], t0 + 4)
        await latest_is(key[stale], t0 - 4000)

        before = time.time()
        fence_add(tmp_path, tenant, r, R_AT, 3600.0)  # 4. R is created
        await defined(key[r], 1)
        entered = await ev.until((r, parked, "enter", "entered"))
        assert entered["ts"] >= before  # dated at R's creation, not at the parked position's time

        await gw.send((x, PACIFIC[0] + 0.01, PACIFIC[1], t0 + 6))  # 5. another Pacific position
        await latest_is(key[x], t0 + 6)
        await ev.drain()

    assert ev.of(x) == [(p, "enter", "entered"), (p, "leave", "exited")]  # nothing from R
    assert ev.of(stale) == []  # silent longer than R's timeout when R was created
    assert inspect("object", x, "--tenant", tenant)["fences"] == []
    occupants = [o["object_id"] for o in inspect("fence", r, "--tenant", tenant)["occupants"]]
    assert key[x] not in occupants and key[stale] not in occupants and key[parked] in occupants
    assert key[r] in inspect("object", parked, "--tenant", tenant)["fences"]


async def test_a_moved_fence_decides_from_where_objects_are_now(
        pipeline: ConnectionSettings, editor: Account, tenant: str, gateway: Login) -> None:  # noqa: F811
    """Through the HTTP API: F is moved (PUT) over the place X left for the Pacific and over
    a parked Y; X is not entered, Y is (fence_changed), and GET /objects/{id}/fences says so.
    Moved back, Y LEAVEs (fence_changed)."""
    f = f"lm-{uuid.uuid4().hex[:10]}"
    x, y = f"x-{uuid.uuid4().hex[:8]}", f"y-{uuid.uuid4().hex[:8]}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, Events(pipeline, tenant) as ev:
        await ev.watch(f)
        created = await http.post("/fences", json=feature(f, square(*P_AT), timeout_s=3600),
                                  headers=editor.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(qualify(tenant, f), 1)
            t0 = time.time()
            await gw.send((x, *R_AT, t0), (y, R_AT[0] + 0.001, R_AT[1] + 0.001, t0))
            await gw.send((x, *PACIFIC, t0 + 2))
            await latest_is(qualify(tenant, x), t0 + 2)
            await latest_is(qualify(tenant, y), t0)
            moved = await http.put(f"/fences/{f}", json=feature(None, square(*R_AT), timeout_s=3600),
                                   headers=editor.auth)
            assert moved.status_code == 200, moved.text
            await defined(qualify(tenant, f), 2)
            await ev.until((f, y, "enter", "fence_changed"))
            await gw.send((x, PACIFIC[0] + 0.01, PACIFIC[1], t0 + 4))
            await latest_is(qualify(tenant, x), t0 + 4)
            assert (await http.get(f"/objects/{x}/fences", headers=editor.auth)).json()["fences"] == []
            assert (await http.get(f"/objects/{y}/fences", headers=editor.auth)).json()["fences"] == [f]

            back = await http.put(f"/fences/{f}", json=feature(None, square(*P_AT), timeout_s=3600),
                                  headers=editor.auth)
            assert back.status_code == 200, back.text
            await ev.until((f, y, "leave", "fence_changed"))
            await ev.drain()
        finally:
            await http.delete(f"/fences/{f}", headers=editor.auth)
    assert ev.of(x) == []
    assert ev.of(y) == [(f, "enter", "fence_changed"), (f, "leave", "fence_changed")]
