"""Proximity subscriptions on the live stack (issue 20): an editor of a tenant subscribes to its
tenant's objects coming within 300 m of its moving car; positions through x-ingress's gateway
batches (the tenant's gateway user); the `nearby` / `faraway` events on fence.events (AMQP,
`roam-events.<tenant>.<subscription>.<kind>.<object>`) and on MQTT (federated to gf-ingress),
each once, dated by the position that caused it, names as the tenant gave them with `tenant`
beside; a change of radius reports what it changes; a deleted subscription reports nothing
more. Another tenant's objects at the same spots, under the same names, are never reported; a
viewer may not subscribe and another tenant's member does not see the subscription."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from typing import Any

import aio_pika
import httpx

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Login, MqttDevice
from tests.integration.test_fence_changes_live import Gateway, inspect
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

HOME = (9.6010, 47.2010)  # a corner of this test's own
M_LON = 1.0 / (111_195.0 * math.cos(math.radians(HOME[1])))  # degrees of longitude per metre


def east(m: float) -> tuple[float, float]:
    return HOME[0] + m * M_LON, HOME[1]


class RoamEvents:
    """fence.events' proximity events of one subscription of a tenant (a private queue); each
    event must name its tenant."""

    def __init__(self, stack: ConnectionSettings, tenant: str, sub_id: str) -> None:
        self.url, self.tenant, self.sub_id = stack["amqp"][t.FENCES_VHOST], tenant, sub_id
        self.got: list[dict[str, Any]] = []

    async def __aenter__(self) -> RoamEvents:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        self.queue = await (await self.conn.channel()).declare_queue("", exclusive=True)
        key = f"{t.ROAM_EVENTS_TOPIC_PREFIX}.{self.tenant}.{self.sub_id}.#"
        await self.queue.bind(t.EVENTS_EXCHANGE, key)
        return self

    def _add(self, body: bytes) -> None:
        e = json.loads(body)
        assert e.get("tenant") == self.tenant and e["subscription"] == self.sub_id, e
        self.got.append(e)

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def until(self, n: int, deadline: float = 30.0) -> list[dict[str, Any]]:
        end = time.monotonic() + deadline
        while len(self.got) < n:
            if time.monotonic() > end:
                raise AssertionError(f"{len(self.got)} of {n} events within {deadline:g}s: {self.got}")
            message = await self.queue.get(fail=False, timeout=DEADLINE)
            if message is None:
                await asyncio.sleep(0.05)
                continue
            await message.ack()
            self._add(message.body)
        return self.got

    async def drain(self) -> None:
        while (message := await self.queue.get(fail=False, timeout=DEADLINE)) is not None:
            await message.ack()
            self._add(message.body)


async def on_every_worker(sub_id: str, present: bool) -> None:
    """Until every worker has the subscription (its qualified id; or none has it)."""
    end = time.monotonic() + DEADLINE
    while True:
        seen = {w: p is not None and sub_id in p["ids"] for w, p in inspect("proximity").items()}
        if all(v == present for v in seen.values()):
            return
        if time.monotonic() > end:
            where = "not on" if present else "still on"
            raise AssertionError(f"subscription {sub_id} {where} every worker: {seen}")
        await asyncio.sleep(0.1)


def kinds(events: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return sorted((e["event"], e["object"], e["ts"]) for e in events)


async def test_a_subscription_reports_who_comes_near_and_goes_away(
        pipeline: ConnectionSettings, editor: Account, viewer: Account, outsider: Account,  # noqa: F811
        tenant: str, gateway: Login, other_gateway: Login) -> None:
    operator = editor  # (the name the test grew up with: subscriptions were an operator's)
    tag = uuid.uuid4().hex[:8]
    car, p1, p2, p3, other = f"pc-{tag}", f"pp-{tag}-1", f"pp-{tag}-2", f"pp-{tag}-3", f"px-{tag}"
    sub_id, sentinel = f"near-{tag}", f"sentinel-{tag}"
    body = {"object": car, "radius_m": 300, "match": f"pp-{tag}-*"}
    mqtt = MqttDevice(pipeline, None, admin=True)  # type: ignore[arg-type]
    assert pipeline["api"] is not None
    try:
        mqtt.client.subscribe(f"{t.ROAM_EVENTS_TOPIC_PREFIX}/{tenant}/{sub_id}/+/+", qos=1)
        mqtt.expect("suback")
        async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
                Gateway(pipeline, gateway) as gw, Gateway(pipeline, other_gateway) as theirs, \
                RoamEvents(pipeline, tenant, sub_id) as ev:
            denied = await http.put(f"/subscriptions/{sub_id}", json=body, headers=viewer.auth)
            assert denied.status_code == 403 and "editor" in denied.json()["error"]
            bad = await http.put(f"/subscriptions/{sub_id}", json={**body, "radius_m": -1},
                                 headers=operator.auth)
            assert bad.status_code == 422 and "radius_m" in bad.json()["error"]
            made = await http.put(f"/subscriptions/{sub_id}", json=body, headers=operator.auth)
            assert made.status_code == 200, made.text
            assert (made.json()["id"], made.json()["tenant"]) == (sub_id, tenant)
            stored = (await http.get(f"/subscriptions/{sub_id}", headers=operator.auth)).json()
            assert stored["radius_m"] == 300 and stored["object"] == car
            mine = (await http.get("/subscriptions", headers=operator.auth)).json()["subscriptions"]
            assert sub_id in [s["id"] for s in mine]
            assert (await http.get(f"/subscriptions/{sub_id}", headers=viewer.auth)).status_code == 200
            # another tenant's member: no such subscription, not in its list, not to delete
            assert (await http.get(f"/subscriptions/{sub_id}", headers=outsider.auth)).status_code == 404
            theirs_listed = (await http.get("/subscriptions", headers=outsider.auth)).json()["subscriptions"]
            assert sub_id not in [s["id"] for s in theirs_listed]
            assert (await http.delete(f"/subscriptions/{sub_id}", headers=outsider.auth)).status_code == 404
            await on_every_worker(qualify(tenant, sub_id), True)
            t1 = time.time()
            t2, t3, t5 = t1 + 1, t1 + 2, t1 + 4
            # the other tenant's objects of the same names beside ours: never near for us
            await theirs.send((p1, *east(60), t1), (p2, *east(30), t1), (car, *east(10), t1))
            await gw.send((car, *HOME, t1), (p1, *east(100), t1), (p2, *east(1000), t1),
                          (other, *east(50), t1))
            await gw.send((p2, *east(200), t2), (p1, *east(500), t2))
            await gw.send((car, *east(450), t3))  # p1 at 50 m: near again; p2 at 250 m: still near
            got = await ev.until(4)
            assert kinds(got) == sorted([("nearby", p1, t1), ("nearby", p2, t2), ("faraway", p1, t2),
                                         ("nearby", p1, t3)])
            assert all(e["subscription"] == sub_id and e["subscriber"] == car for e in got)
            assert all(e["tenant"] == tenant for e in got)
            assert abs(next(e for e in got if e["ts"] == t1)["distance_m"] - 100.0) < 0.5
            # a smaller radius: p2 (250 m) is no longer near, at the change's time
            changed = await http.put(f"/subscriptions/{sub_id}", json={**body, "radius_m": 100},
                                     headers=operator.auth)
            assert changed.status_code == 200, changed.text
            got = await ev.until(5)
            far = got[4]
            assert (far["event"], far["object"]) == ("faraway", p2) and far["ts"] >= t1 - 60
            await on_every_worker(qualify(tenant, sub_id), True)
            await gw.send((p3, *east(420), t5))  # 30 m from the car
            got = await ev.until(6)
            assert (got[5]["event"], got[5]["object"], got[5]["ts"]) == ("nearby", p3, t5)
            # deleted: nothing more, even for a move that would have been reported
            assert (await http.delete(f"/subscriptions/{sub_id}", headers=operator.auth)).status_code == 204
            assert (await http.get(f"/subscriptions/{sub_id}", headers=operator.auth)).status_code == 404
            await on_every_worker(qualify(tenant, sub_id), False)
            witness = await http.put(f"/subscriptions/{sentinel}", headers=operator.auth,
                                     json={"object": sentinel, "radius_m": 50, "match": f"pp-{tag}-3"})
            assert witness.status_code == 200
            await on_every_worker(qualify(tenant, sentinel), True)
            async with RoamEvents(pipeline, tenant, sentinel) as witness_events:
                t6 = t5 + 1
                await gw.send((p3, *east(2000), t6), (sentinel, *east(2010), t6))  # the same batch
                await witness_events.until(1)
            await ev.drain()
            assert len(ev.got) == 6 and len({e["event_id"] for e in ev.got}) == 6
            await http.delete(f"/subscriptions/{sentinel}", headers=operator.auth)
        # MQTT subscribers got the same events (fence.events federated to gf-ingress's amq.topic)
        seen: list[tuple[str, dict[str, Any]]] = []
        end = time.monotonic() + DEADLINE
        while len(seen) < 6 and time.monotonic() < end:
            kind, value = mqtt.next_event()
            if kind == "message":
                seen.append((value[0], json.loads(value[1])))
        assert sorted(b["event_id"] for _, b in seen) == sorted(e["event_id"] for e in ev.got)
        assert all(topic == f"roam-events/{tenant}/{sub_id}/{b['event']}/{b['object']}" for topic, b in seen)
    finally:
        mqtt.close()
        async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http:
            for s in (sub_id, sentinel):  # a failed run leaves no subscription routing every batch
                await http.delete(f"/subscriptions/{s}", headers=operator.auth)


async def test_a_subscription_on_a_fixed_point(pipeline: ConnectionSettings,  # noqa: F811
                                               editor: Account, tenant: str, gateway: Login) -> None:
    """A circle that stays put (`point`, no object): an object passing reports `nearby` then
    `faraway`, the subscriber is `@<id>`; the stored form shows the point."""
    operator = editor
    tag = uuid.uuid4().hex[:8]
    sub_id, bus = f"gate-{tag}", f"bus-{tag}"
    spot = (HOME[0] + 0.02, HOME[1])  # away from the other test's objects
    m_lon = M_LON
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw, RoamEvents(pipeline, tenant, sub_id) as ev:
        both = await http.put(f"/subscriptions/{sub_id}", headers=operator.auth,
                              json={"point": list(spot), "object": bus, "radius_m": 150})
        assert both.status_code == 422 and "not both" in both.text
        made = await http.put(f"/subscriptions/{sub_id}", headers=operator.auth,
                              json={"point": list(spot), "radius_m": 150, "match": f"bus-{tag}"})
        assert made.status_code == 200, made.text
        assert made.json()["point"] == list(spot) and "object" not in made.json()
        try:
            await on_every_worker(qualify(tenant, sub_id), True)
            t0 = time.time()
            for i, metres in enumerate((600.0, 100.0, 40.0, 400.0)):  # far, near, near, far
                await gw.send((bus, spot[0] + metres * m_lon, spot[1], t0 + i))
            got = await ev.until(2)
            assert kinds(got) == [("faraway", bus, t0 + 3), ("nearby", bus, t0 + 1)]
            assert {e["subscriber"] for e in got} == {f"@{sub_id}"}
        finally:
            await http.delete(f"/subscriptions/{sub_id}", headers=operator.auth)
        await on_every_worker(qualify(tenant, sub_id), False)
