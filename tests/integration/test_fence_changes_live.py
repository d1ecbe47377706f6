"""A new, replaced or moved fence decides from where objects are now, on the live stack.

The defect this guards against: a worker learns an object's position only while x-geo routes
it there, so its "last position" of an object that left its fences can be anywhere the object
has long left. A fence created (or moved) over such a place used to ENTER the object from
there. Now each region's x-geo re-checks, behind the change, the objects whose latest position
it holds in the fence's old or new ranges (fence/x_fence/core.py, "Fence changes").

Positions come as AMQP gateway batches (`ingress.batches`), fences through `geofence fence
add` (the CLI) and the HTTP API; what the pipeline believes is read back with `geofence
inspect` and `GET /objects/{id}/fences`. Ids are fresh per run; every wait has a deadline.
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
from tests.integration.clients import DEADLINE, geofence
from tests.integration.test_fence_api import Account, account, feature, firebase  # noqa: F401 (fixture)
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

P_AT = (9.5210, 47.1410)  # Vaduz
R_AT = (9.5210, 47.1860)  # about 5 km north
PACIFIC = (-140.0, -50.0)
HALF = 0.004  # a fence is a square of 2 x HALF degrees


def square(lon: float, lat: float) -> dict[str, Any]:
    return {"type": "Polygon", "coordinates": [[[lon - HALF, lat - HALF], [lon + HALF, lat - HALF],
                                                 [lon + HALF, lat + HALF], [lon - HALF, lat + HALF],
                                                 [lon - HALF, lat - HALF]]]}


def same_worker_ids(prefix: str, n: int) -> list[str]:
    """n fresh fence ids that the ring puts on one worker (as the issue's P and R were)."""
    ring = HashRing(list(Settings.from_env().workers))
    first = f"{prefix}-{uuid.uuid4().hex[:10]}"
    ids = [first]
    while len(ids) < n:
        cand = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if ring.node_for(cand) == ring.node_for(first):
            ids.append(cand)
    return ids


class Gateway:
    """Publishes gateway batches to ingress.batches (confirmed, persistent)."""

    def __init__(self, stack: ConnectionSettings) -> None:
        self.url = stack["amqp"][t.INGRESS_VHOST]

    async def __aenter__(self) -> Gateway:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        ch = await self.conn.channel(publisher_confirms=True)
        self.ex = await ch.get_exchange(t.BATCHES_EXCHANGE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def send(self, *positions: tuple[str, float, float, float]) -> None:
        await self.send_raw({"positions": [{"id": o, "lon": lon, "lat": lat, "ts": ts}
                                           for o, lon, lat, ts in positions]})

    async def send_raw(self, body: dict[str, Any]) -> None:
        await self.ex.publish(aio_pika.Message(json.dumps(body).encode(), content_type="application/json",
                                               delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "",
                              mandatory=True, timeout=DEADLINE)


class Events:
    """Everything fence.events says about some fences (a private queue bound to them)."""

    def __init__(self, stack: ConnectionSettings) -> None:
        self.url = stack["amqp"][t.FENCES_VHOST]
        self.got: list[dict[str, Any]] = []

    async def __aenter__(self) -> Events:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        self.queue = await (await self.conn.channel()).declare_queue("", exclusive=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def watch(self, *fence_ids: str) -> None:
        for f in fence_ids:
            await self.queue.bind(t.EVENTS_EXCHANGE, t.event_binding_key(f))

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
            self.got.append(json.loads(message.body))

    async def drain(self) -> None:
        while (message := await self.queue.get(fail=False, timeout=DEADLINE)) is not None:
            await message.ack()
            self.got.append(json.loads(message.body))

    def of(self, object_id: str) -> list[tuple[str, str, str]]:
        return [(e["fence_id"], e["event"], e["reason"]) for e in self.got if e["object_id"] == object_id]


def inspect(*args: str) -> Any:
    done = geofence("inspect", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def latest_is(object_id: str, ts: float) -> None:
    """Wait until the pipeline (x-geo) has the object's position of `ts` as its latest."""
    end = time.monotonic() + DEADLINE
    while True:
        seen = inspect("object", object_id)["latest"]
        if any(p["ts"] == ts for p in seen.values()):
            return
        if time.monotonic() > end:
            raise AssertionError(f"x-geo never had {object_id}'s position of {ts}: {seen}")
        await asyncio.sleep(0.1)


async def defined(fence_id: str, version: int) -> dict[str, Any]:
    """Wait until the fence's worker has this version (its re-checks come in the same message)."""
    end = time.monotonic() + DEADLINE
    while True:
        done = geofence("inspect", "fence", fence_id, "--json")
        if done.returncode == 0 and json.loads(done.stdout)["version"] >= version:
            return dict(json.loads(done.stdout))
        if time.monotonic() > end:
            raise AssertionError(f"fence {fence_id} v{version} never reached its worker: {done.stderr}")
        await asyncio.sleep(0.1)


def fence_add(tmp_path: Path, fence_id: str, at: tuple[float, float], timeout_s: float) -> None:
    path = tmp_path / f"{fence_id}.geojson"
    path.write_text(json.dumps(feature(fence_id, square(*at), timeout_s=timeout_s)))
    done = geofence("fence", "add", str(path))
    assert done.returncode == 0, done.stderr


@pytest.fixture
async def cleanup() -> AsyncIterator[list[str]]:
    ids: list[str] = []
    yield ids
    if ids:
        geofence("fence", "remove", *ids)


async def test_a_new_fence_does_not_enter_an_object_from_where_it_was_long_ago(
        pipeline: ConnectionSettings, tmp_path: Path, cleanup: list[str]) -> None:  # noqa: F811
    """The issue's scenario, step by step, with a parked object inside R's area (entered at
    R's creation) and one parked there longer than R's timeout (not entered) beside it."""
    p, r = same_worker_ids("lp", 2)
    x, parked, stale = (f"{k}-{uuid.uuid4().hex[:8]}" for k in ("x", "parked", "stale"))
    cleanup += [p, r]
    fence_add(tmp_path, p, P_AT, 3600.0)
    await defined(p, 1)
    t0 = time.time()
    async with Gateway(pipeline) as gw, Events(pipeline) as ev:
        await ev.watch(p, r)
        await gw.send((x, *P_AT, t0))  # 1. X inside P
        await ev.until((p, x, "enter", "entered"))
        await gw.send((x, *R_AT, t0 + 2), (parked, R_AT[0] + 0.001, R_AT[1], t0 + 2),
                      (stale, R_AT[0] - 0.001, R_AT[1], t0 - 4000))  # 2. into R's area: no fence yet
        await ev.until((p, x, "leave", "exited"))
        await gw.send((x, *PACIFIC, t0 + 4))  # 3. the South Pacific
        await latest_is(x, t0 + 4)
        await latest_is(stale, t0 - 4000)

        before = time.time()
        fence_add(tmp_path, r, R_AT, 3600.0)  # 4. R is created
        await defined(r, 1)
        entered = await ev.until((r, parked, "enter", "entered"))
        assert entered["ts"] >= before  # dated at R's creation, not at the parked position's time

        await gw.send((x, PACIFIC[0] + 0.01, PACIFIC[1], t0 + 6))  # 5. another Pacific position
        await latest_is(x, t0 + 6)
        await ev.drain()

    assert ev.of(x) == [(p, "enter", "entered"), (p, "leave", "exited")]  # nothing from R
    assert ev.of(stale) == []  # silent longer than R's timeout when R was created
    assert inspect("object", x)["fences"] == []
    occupants = [o["object_id"] for o in inspect("fence", r)["occupants"]]
    assert x not in occupants and stale not in occupants and parked in occupants
    assert r in inspect("object", parked)["fences"]  # (and the demo's municipality, if it ran)


@pytest.fixture(scope="module")
def alice(firebase: tuple[str, int, str]) -> Account:  # noqa: F811
    return account(firebase)


async def test_a_moved_fence_decides_from_where_objects_are_now(
        pipeline: ConnectionSettings, alice: Account) -> None:  # noqa: F811
    """Through the HTTP API: F is moved (PUT) over the place X left for the Pacific and over
    a parked Y; X is not entered, Y is (fence_changed), and GET /objects/{id}/fences says so.
    Moved back, Y LEAVEs (fence_changed)."""
    f = f"lm-{uuid.uuid4().hex[:10]}"
    x, y = f"x-{uuid.uuid4().hex[:8]}", f"y-{uuid.uuid4().hex[:8]}"
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline) as gw, Events(pipeline) as ev:
        await ev.watch(f)
        created = await http.post("/fences", json=feature(f, square(*P_AT), timeout_s=3600),
                                  headers=alice.auth)
        assert created.status_code == 201, created.text
        try:
            await defined(f, 1)
            t0 = time.time()
            await gw.send((x, *R_AT, t0), (y, R_AT[0] + 0.001, R_AT[1] + 0.001, t0))
            await gw.send((x, *PACIFIC, t0 + 2))
            await latest_is(x, t0 + 2)
            await latest_is(y, t0)
            moved = await http.put(f"/fences/{f}", json=feature(None, square(*R_AT), timeout_s=3600),
                                   headers=alice.auth)
            assert moved.status_code == 200, moved.text
            await defined(f, 2)
            await ev.until((f, y, "enter", "fence_changed"))
            await gw.send((x, PACIFIC[0] + 0.01, PACIFIC[1], t0 + 4))
            await latest_is(x, t0 + 4)
            assert (await http.get(f"/objects/{x}/fences", headers=alice.auth)).json()["fences"] == []
            assert (await http.get(f"/objects/{y}/fences", headers=alice.auth)).json()["fences"] == [f]

            back = await http.put(f"/fences/{f}", json=feature(None, square(*P_AT), timeout_s=3600),
                                  headers=alice.auth)
            assert back.status_code == 200, back.text
            await ev.until((f, y, "leave", "fence_changed"))
            await ev.drain()
        finally:
            await http.delete(f"/fences/{f}", headers=alice.auth)
    assert ev.of(x) == []
    assert ev.of(y) == [(f, "enter", "fence_changed"), (f, "leave", "fence_changed")]
