"""Issue 34 on the live stack: positions from far away and from the future.

- 600 objects of one gateway batch jump from Montreal to (-140, -50) while a proximity
  subscription exists (elsewhere): the workers go on at once (before the fix each row cost the
  area between its two places: 0.7-8 s of a worker's loop per object, 600 of them, and the
  broker dropped the worker for missed heartbeats); `geofence inspect` answers, every worker
  consumes (`geofence_consuming` 1), and a meeting right after the jump is reported.
- A position dated a day ahead is dead-lettered with the reason and counted; the object's real
  positions after it are not ignored (before the fix they were older than the future one:
  nothing happened to the object until then).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import httpx
import pytest

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login
from tests.integration.test_dlq import until_listed
from tests.integration.test_fence_changes_live import Gateway, inspect
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)
from tests.integration.test_proximity_live import RoamEvents, on_every_worker

pytestmark = pytest.mark.integration

HOME = (9.6110, 47.2110)  # this test's own corner of the demo's area
M_LON = 1.0 / (111_195.0 * 0.68)  # degrees of longitude per metre at 47 N
MONTREAL = (-73.57, 45.50)
FAR = (-140.0, -50.0)
# Before the fix one object's jump took seconds of a worker's loop and 600 took many minutes;
# a worker that keeps up reports the meeting within this (the stack is shared and noisy).
AFTER_JUMP_S = 60.0


@contextlib.asynccontextmanager
async def subscribed(stack: ConnectionSettings, editor: Account, gateway: Login, sub_id: str,
                     body: dict[str, Any]) -> AsyncIterator[tuple[Gateway, RoamEvents]]:
    """A proximity subscription of the gateway's tenant, by its editor, on every worker
    (deleted at the end), the tenant's gateway and the subscription's events."""
    tenant = gateway.tenant
    assert stack["api"] is not None
    async with httpx.AsyncClient(base_url=stack["api"], timeout=DEADLINE) as http, \
            Gateway(stack, gateway) as gw, RoamEvents(stack, tenant, sub_id) as ev:
        made = await http.put(f"/subscriptions/{sub_id}", headers=editor.auth, json=body)
        assert made.status_code == 200, made.text
        try:
            await on_every_worker(qualify(tenant, sub_id), True)
            yield gw, ev
        finally:
            await http.delete(f"/subscriptions/{sub_id}", headers=editor.auth)
    await on_every_worker(qualify(tenant, sub_id), False)


def gauge(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f"geofence_{name}{{"):
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_fleet_jumping_across_the_world_does_not_freeze_the_workers(
        pipeline: ConnectionSettings, editor: Account, gateway: Login) -> None:  # noqa: F811
    tag = uuid.uuid4().hex[:8]
    sub_id, car, walker = f"jump-{tag}", f"jc-{tag}", f"jw-{tag}"
    fleet = [f"jf-{tag}-{i}" for i in range(600)]
    async with subscribed(pipeline, editor, gateway, sub_id, {"object": car, "radius_m": 200,
                                                       "match": f"jw-{tag}"}) as (gw, ev):
        t0 = time.time()
        await gw.send(*((o, MONTREAL[0] + i * 1e-4, MONTREAL[1], t0) for i, o in enumerate(fleet)))
        await gw.send(*((o, *FAR, t0 + 1) for o in fleet))  # one batch: every one far away
        sent = time.monotonic()
        t2 = t0 + 2
        await gw.send((car, *HOME, t2), (walker, HOME[0] + 100 * M_LON, HOME[1], t2))
        got = await ev.until(1, deadline=AFTER_JUMP_S)
        assert [(e["event"], e["object"], e["ts"]) for e in got] == [("nearby", walker, t2)]
        assert time.monotonic() - sent < AFTER_JUMP_S
        workers = {n.removeprefix("x-fence-") for n in pipeline["metrics"] if n.startswith("x-fence-")}
        answered = await asyncio.to_thread(inspect, "proximity")  # every worker answers
        assert set(answered) == workers and all(qualify(gateway.tenant, sub_id) in p["ids"]
                                                for p in answered.values()), answered
        for name, url in pipeline["metrics"].items():
            if name.startswith("x-fence-"):
                assert await asyncio.to_thread(gauge, url, "consuming") == 1.0, name


async def test_a_position_from_the_future_is_dead_lettered_and_the_real_ones_count(
        pipeline: ConnectionSettings, editor: Account, gateway: Login) -> None:  # noqa: F811
    tag = uuid.uuid4().hex[:8]
    sub_id, car, clock = f"fut-{tag}", f"fc-{tag}", f"fw-{tag}"
    spot = (HOME[0] + 0.01, HOME[1])
    async with subscribed(pipeline, editor, gateway, sub_id, {"object": car, "radius_m": 150,
                                                       "match": f"fw-{tag}"}) as (gw, ev):
        now = time.time()
        await gw.send((car, *spot, now))
        # a device whose clock is a day ahead, over MQTT's path (amq.topic): far from the car
        async with await aio_pika.connect(pipeline["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
            body = json.dumps({"lon": spot[0] + 0.05, "lat": spot[1], "ts": now + 86_400}).encode()
            await ex.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                             f"positions.{gateway.tenant}.{clock}", mandatory=True)
        rows = await until_listed(t.INGRESS_VHOST, "--reason", "ahead of the receive time",
                                  want=lambda rs: any(clock in json.dumps(r) for r in rs),
                                  what="the future position dead-lettered")
        mine = [r for r in rows if clock in json.dumps(r)]
        assert "s ahead of the receive time" in json.dumps(mine[0])
        # its real positions after it: the object comes near the car, and is reported
        t1 = time.time()
        await gw.send((clock, spot[0] + 50 * M_LON, spot[1], t1))
        got = await ev.until(1)
        assert [(e["event"], e["object"], e["ts"]) for e in got] == [("nearby", clock, t1)]
        counted = await asyncio.to_thread(
            lambda: urllib.request.urlopen(pipeline["metrics"]["x-ingress"], timeout=10).read().decode())
        assert "ts N is N s ahead of the receive time" in counted
