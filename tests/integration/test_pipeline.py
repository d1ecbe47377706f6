"""The whole pipeline on the local stack: a paho device (or AMQP) publishes positions, the
sidecars started by `geofence up` route them, and the ENTER / LEAVE events received over AMQP
(fence.events) and MQTT (fence-events/<tenant>/<fence>/<kind>/<object>, per fence and per
device) are compared with a ground truth computed here with shapely, independently of the
pipeline's code.

Fences and objects are the session's tenant's (tests/integration/conftest.py), with fresh uuid
names, so runs and tests never see each other's events; fences are removed at the end. Inside
the pipeline (the fence manager, the ground truth here) their ids are qualified,
`<tenant>:<name>`; the events carry the names unqualified and `tenant` beside them, which
`as_tuple` checks by qualifying them again. Every wait has a deadline. Events of one fence come from one
x-fence worker in order, so a test's trajectory ends with an event on each of its fences:
once the last expected event of every fence has arrived, nothing of it can still be on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from aio_pika.abc import AbstractIncomingMessage
from paho.mqtt.enums import CallbackAPIVersion
from shapely.geometry import Point, Polygon, box

import hilbert_c as hk
from deploy import sidecars
from deploy.settings import ConnectionSettings, Settings
from exchanges import routing_store
from exchanges import topology as t
from exchanges.fence_binding import INDEX_BITS
from exchanges.login_guard import client_id_for
from exchanges.tenancy import name_of, qualify, split
from exchanges.worldmap import Worldmap
from fence import store
from fence.manager import FenceManager
from fence.spec import FenceSpec
from tests.integration.clients import DEADLINE, Device, MqttDevice, api, poll, q, text

EVENT_DEADLINE = 30.0
EVENT_ID = re.compile(r"^[0-9a-f]{32}$")


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def tid(tenant: str, prefix: str) -> str:
    """A fresh name of `tenant`, qualified as the pipeline names it."""
    return qualify(tenant, uid(prefix))


# --------------------------------------------------------------------------- ground truth


@dataclass(frozen=True)
class Step:
    lon: float
    lat: float
    ts: float


def trajectory(points: Sequence[tuple[float, float]], t0: float | None = None) -> list[Step]:
    start = time.time() if t0 is None else t0
    return [Step(lon, lat, start + i) for i, (lon, lat) in enumerate(points)]


def expected_events(object_id: str, steps: Sequence[Step], fences: dict[str, Polygon]
                    ) -> list[tuple[str, str, str, float, str]]:
    """(fence_id, event, object_id, ts, reason): a fence's interior entered or left."""
    inside: set[str] = set()
    out = []
    for s in steps:
        now = {f for f, g in fences.items() if g.contains(Point(s.lon, s.lat))}
        out += [(f, "enter", object_id, s.ts, "entered") for f in sorted(now - inside)]
        out += [(f, "leave", object_id, s.ts, "exited") for f in sorted(inside - now)]
        inside = now
    return sorted(out)


def as_tuple(e: dict[str, Any]) -> tuple[str, str, str, float, str]:
    """An event's wire form (names as the tenant gave them, and `tenant`) with its ids
    qualified again, as the ground truth names them."""
    tenant = e.get("tenant", "")
    return (qualify(tenant, e["fence_id"]), e["event"], qualify(tenant, e["object_id"]), e["ts"], e["reason"])


def last_per_fence(events: Sequence[tuple[str, str, str, float, str]]) -> dict[str, tuple[Any, ...]]:
    return {e[0]: e for e in sorted(events, key=lambda e: e[3])}


# --------------------------------------------------------------------------- clients


class AmqpEvents:
    """A private queue on fence.events bound to the given fences' keys."""

    def __init__(self, stack: ConnectionSettings) -> None:
        self.url = stack["amqp"][t.FENCES_VHOST]
        self.got: list[tuple[str, dict[str, Any]]] = []  # (routing key, body)

    async def __aenter__(self) -> AmqpEvents:
        self.conn = await aio_pika.connect(self.url, timeout=DEADLINE)
        ch = await self.conn.channel()
        self.queue = await ch.declare_queue("", exclusive=True)  # gone with the connection
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def watch(self, fence_id: str) -> None:
        """A qualified fence id: its events' key carries its tenant."""
        await self.queue.bind(t.EVENTS_EXCHANGE, t.event_binding_key(fence_id))

    async def until(self, last: dict[str, tuple[Any, ...]], deadline: float = EVENT_DEADLINE) -> None:
        """Collect until the last expected event of each fence has arrived."""
        want = set(last.values())
        try:
            async with asyncio.timeout(deadline), self.queue.iterator() as it:
                async for m in it:
                    await m.ack()
                    body = json.loads(m.body)
                    self.got.append((m.routing_key or "", body))
                    want.discard(as_tuple(body))
                    if not want:
                        return
        except TimeoutError:
            got = "\n  ".join(map(str, sorted((as_tuple(b) for _, b in self.got), key=lambda e: e[3])))
            raise AssertionError(f"still waiting after {deadline:g}s for {sorted(want)}; got:\n  {got}"
                                 ) from None

    def events(self, object_id: str) -> list[tuple[str, str, str, float, str]]:
        """What one object (qualified id) got (an object of an earlier run, still inside a
        fence that is moved or deleted, rightly gets its events too)."""
        return sorted(e for e in (as_tuple(b) for _, b in self.got) if e[2] == object_id)


class MqttWatcher:
    """An MQTT client of the ingress vhost (as the administrator) on fence-events topics."""

    def __init__(self, stack: ConnectionSettings) -> None:
        cfg = stack["mqtt"]
        self.stack = stack
        self.messages: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.subacks: queue.Queue[Any] = queue.Queue()
        me = client_id_for(t.ADMIN_USER, uid("watcher"))
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=me, protocol=mqtt.MQTTv311)
        self.client.username_pw_set(f"{cfg['ingress_vhost']}:{t.ADMIN_USER}", cfg["password"])
        self.client.on_message = lambda c, u, msg: self.messages.put(
            (msg.topic, json.loads(bytes(msg.payload))))
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.subacks.put(codes)
        self.client.connect(cfg["host"], cfg["port"], keepalive=30)
        self.client.loop_start()

    async def watch(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        codes = await asyncio.to_thread(self.subacks.get, timeout=DEADLINE)
        assert [c.value for c in codes] == [1]
        await wait_binding_federated(self.stack, topic.replace("/", ".").replace("+", "*"))

    async def until(self, n: int, object_id: str, deadline: float = EVENT_DEADLINE
                    ) -> list[tuple[str, dict[str, Any]]]:
        """The first n events of this object (a qualified id; others' are skipped)."""
        got: list[tuple[str, dict[str, Any]]] = []
        end = time.monotonic() + deadline
        while len(got) < n:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{len(got)} of {n} MQTT events within {deadline:g}s: {got}")
            try:
                topic, body = await asyncio.to_thread(self.messages.get, timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if as_tuple(body)[2] == object_id:
                got.append((topic, body))
        return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def wait_binding_federated(stack: ConnectionSettings, key: str) -> None:
    """The federation link copies an MQTT subscription's binding to fence.events."""
    def copied() -> bool:
        found = api(stack, f"api/exchanges/{q(t.FENCES_VHOST)}/{q(t.EVENTS_EXCHANGE)}"
                           "/bindings/source") or []
        return any(b["routing_key"] == key for b in found)

    await poll(copied, f"binding {key} on fence.events in gf-fences")


def publish_steps(dev: MqttDevice, device: Device, steps: Sequence[Step]) -> list[tuple[str, bytes]]:
    """Publish each position (QoS 1, the device's own topic positions/<tenant>/<id>) and wait
    for its PUBACK; returns the messages that arrived meanwhile (the pipeline may answer
    before the last PUBACK)."""
    arrived = []
    for s in steps:
        dev.client.publish(device.topic,
                           json.dumps({"lon": s.lon, "lat": s.lat, "ts": s.ts}), qos=1)
        while True:
            kind, value = dev.next_event()
            if kind == "puback":
                break
            assert kind == "message", (kind, value)
            arrived.append(value)
    return arrived


def position_key(object_id: str) -> str:
    """The routing key of a qualified object's MQTT positions: positions.<tenant>.<id>."""
    tenant, name = split(object_id)
    assert tenant, f"{object_id!r}: a tenant's object is named <tenant>:<id>"
    return f"{t.POSITIONS_TOPIC_PREFIX}.{tenant}.{name}"


async def publish_positions(stack: ConnectionSettings, object_id: str, steps: Sequence[Step]) -> None:
    """As MQTT positions arrive (amq.topic, positions.<tenant>.<id>; `object_id` qualified,
    <tenant>:<id>), over AMQP with confirms."""
    key = position_key(object_id)
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        for s in steps:
            await ex.publish(aio_pika.Message(json.dumps({"lon": s.lon, "lat": s.lat, "ts": s.ts}).encode(),
                                              delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                             key, mandatory=True)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def pipeline(stack: ConnectionSettings) -> ConnectionSettings:
    """The stack with every sidecar running (`geofence up` starts them)."""
    settings = Settings.from_env()
    dead = [n for n, ok in sidecars.running(settings).items() if not ok]
    if dead:
        pytest.fail(f"sidecar(s) {', '.join(dead)} not running: `geofence up` starts them", pytrace=False)
    return stack


@pytest.fixture
async def fences(pipeline: ConnectionSettings, tenant: str) -> AsyncIterator[FenceManager]:
    """The fence manager (as the fence-manager user); fences made in the test (qualified ids,
    of the session's tenant) are removed."""
    settings = Settings.from_env()
    amqp = pipeline["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    async with FenceManager(amqp, pipeline["postgres"]["dsn"], settings.regions, settings.workers) as m:
        made: list[str] = []
        original_put = m.put

        async def put(spec: FenceSpec, expected_version: int | None = None,
                      create: bool | None = None, owner: str | None = None,
                      follow_ts: float | None = None, quota_of: str | None = None) -> Any:
            made.append(spec.fence_id)
            change = await original_put(spec, expected_version, create, owner, follow_ts, quota_of)
            await m.applied()  # positions published from now on see the change
            return change

        m.put = put  # type: ignore[method-assign]
        yield m
        for fid in dict.fromkeys(made):
            with contextlib.suppress(store.UnknownFence):
                await m.remove(fid)


@pytest.fixture
def watcher(pipeline: ConnectionSettings) -> Iterator[MqttWatcher]:
    w = MqttWatcher(pipeline)
    try:
        yield w
    finally:
        w.close()


async def worldmap(stack: ConnectionSettings) -> Worldmap:
    wm = await routing_store.read_worldmap(stack["postgres"]["dsn"])
    assert wm is not None
    return wm


def region_at(wm: Worldmap, lon: float, lat: float) -> str:
    x, y = hk.lonlat_to_grid(np.array([lon]), np.array([lat]), INDEX_BITS)
    return wm.region_of(int(hk.encode_many(x, y, INDEX_BITS)[0]))


# --------------------------------------------------------------------------- tests


async def test_device_crosses_two_adjacent_fences(pipeline: ConnectionSettings, fences: FenceManager,
                                                  tenant: str, device: Device, mqtt_device: MqttDevice,
                                                  watcher: MqttWatcher) -> None:
    a, b = tid(tenant, "fa"), tid(tenant, "fb")
    geoms = {a: box(9.500, 47.100, 9.510, 47.110), b: box(9.510, 47.100, 9.520, 47.110)}
    for fid, g in geoms.items():
        await fences.put(FenceSpec(fence_id=fid, geometry=g, timeout_s=600), create=True)
    points = [(9.495, 47.105), (9.502, 47.105), (9.508, 47.1049), (9.5121, 47.1051), (9.518, 47.105),
              (9.525, 47.105), (9.515, 47.108), (9.505, 47.108)]  # ends inside A: a last event each
    steps = trajectory(points)
    expected = expected_events(device.key, steps, geoms)
    assert [e[:2] for e in sorted(expected, key=lambda e: e[3])] == [
        (a, "enter"), (a, "leave"), (b, "enter"), (b, "leave"), (b, "enter"), (a, "enter"), (b, "leave")]

    mqtt_device.client.subscribe(f"fence-events/{tenant}/+/+/{device.object_id}", qos=1)
    assert [c.value for c in mqtt_device.expect("suback")] == [1]
    await wait_binding_federated(pipeline, f"fence-events.{tenant}.*.*.{device.object_id}")
    async with AmqpEvents(pipeline) as amqp:
        for fid in geoms:
            await amqp.watch(fid)
            await watcher.watch(f"fence-events/{tenant}/{name_of(fid)}/+/+")
        early = await asyncio.to_thread(publish_steps, mqtt_device, device, steps)
        await amqp.until(last_per_fence(expected))
    assert amqp.events(device.key) == expected
    mine = [body for _, body in amqp.got if as_tuple(body)[2] == device.key]
    # the events name the fence and the object as the tenant gave them, with the tenant beside
    assert {(b["tenant"], b["object_id"]) for b in mine} == {(tenant, device.object_id)}
    assert {b["fence_id"] for b in mine} == {name_of(a), name_of(b)}
    ids = [body["event_id"] for body in mine]
    assert all(EVENT_ID.match(i) for i in ids) and len(set(ids)) == len(ids)
    assert all(key == t.event_routing_key(as_tuple(body)[0], body["event"], as_tuple(body)[2])
               for key, body in amqp.got)
    assert all(key.startswith(f"fence-events.{tenant}.") for key, _ in amqp.got)

    over_mqtt = await watcher.until(len(expected), device.key)
    assert sorted(as_tuple(body) for _, body in over_mqtt) == expected
    assert all(topic == f"fence-events/{b['tenant']}/{b['fence_id']}/{b['event']}/{b['object_id']}"
               for topic, b in over_mqtt)
    assert sorted(b["event_id"] for _, b in over_mqtt) == sorted(ids)
    own: list[tuple[str, dict[str, Any]]] = []  # the device's own topic (other fences ignored)
    while len(own) < len(expected):
        topic, body = early.pop(0) if early else mqtt_device.expect("message")
        assert topic.endswith(f"/{device.object_id}") and topic.startswith(f"fence-events/{tenant}/")
        if as_tuple(json.loads(body))[0] in geoms:
            own.append((topic, json.loads(body)))
    assert sorted(as_tuple(body) for _, body in own) == expected


async def test_silence_ends_in_a_timeout_leave(pipeline: ConnectionSettings, fences: FenceManager,
                                              tenant: str) -> None:
    fid, obj = tid(tenant, "ft"), tid(tenant, "obj")
    geom = box(9.530, 47.100, 9.540, 47.110)
    await fences.put(FenceSpec(fence_id=fid, geometry=geom, timeout_s=2.0), create=True)
    steps = trajectory([(9.525, 47.105), (9.535, 47.105)])
    async with AmqpEvents(pipeline) as amqp:
        await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        timeout_leave = (fid, "leave", obj, steps[-1].ts + 2.0, "timeout")
        await amqp.until({fid: timeout_leave})
    assert amqp.events(obj) == [(fid, "enter", obj, steps[-1].ts, "entered"), timeout_leave]


async def test_fence_moved_under_an_object(pipeline: ConnectionSettings, fences: FenceManager,
                                          tenant: str) -> None:
    fid, obj = tid(tenant, "fm"), tid(tenant, "obj")
    here, elsewhere = box(9.550, 47.100, 9.560, 47.110), box(9.570, 47.100, 9.580, 47.110)
    await fences.put(FenceSpec(fence_id=fid, geometry=here, timeout_s=600), create=True)
    steps = trajectory([(9.545, 47.105), (9.555, 47.105)])
    async with AmqpEvents(pipeline) as amqp:
        await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        entered = (fid, "enter", obj, steps[-1].ts, "entered")
        await amqp.until({fid: entered})

        # a change's events are dated at the change, or at the position it was decided from
        # when that is later (the trajectory's clock runs ahead of the manager's)
        last = steps[-1].ts
        moved = await fences.put(FenceSpec(fence_id=fid, geometry=elsewhere, timeout_s=600), create=False)
        changed_at = max(await change_time(pipeline, fid), last)
        await amqp.until({fid: (fid, "leave", obj, changed_at, "fence_changed")})
        assert moved.version == 2

        await fences.put(FenceSpec(fence_id=fid, geometry=here, timeout_s=600), create=False)
        back_at = max(await change_time(pipeline, fid), last)
        await amqp.until({fid: (fid, "enter", obj, back_at, "fence_changed")})

        await fences.remove(fid)
        deleted_at = max(await change_time(pipeline, fid, deleted=True), last)
        await amqp.until({fid: (fid, "leave", obj, deleted_at, "fence_deleted")})
    assert amqp.events(obj) == sorted([entered, (fid, "leave", obj, changed_at, "fence_changed"),
                                    (fid, "enter", obj, back_at, "fence_changed"),
                                    (fid, "leave", obj, deleted_at, "fence_deleted")])


async def change_time(stack: ConnectionSettings, fence_id: str, deleted: bool = False) -> float:
    conn = await routing_store.connect(stack["postgres"]["dsn"])
    try:
        when = await conn.fetchval("SELECT updated_at FROM fence WHERE id = $1", fence_id)
    finally:
        await conn.close()
    return float(when.timestamp())


async def test_object_crossing_from_one_region_to_another(pipeline: ConnectionSettings,
                                                          fences: FenceManager, tenant: str) -> None:
    wm = await worldmap(pipeline)
    assert len(wm.regions) >= 2, "the default stack has two regions"
    lon = 9.60
    lo, hi = 47.05, 47.25  # the default map (over AREA) splits between these along 9.60 E
    south, north = region_at(wm, lon, lo), region_at(wm, lon, hi)
    assert south != north
    for _ in range(40):  # the latitude where the region changes along this meridian
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if region_at(wm, lon, mid) == south else (lo, mid)
    split = (lo + hi) / 2
    q_, r_, p_ = tid(tenant, "fq"), tid(tenant, "fr"), tid(tenant, "fp")
    geoms = {q_: box(lon - 0.01, split - 0.03, lon + 0.01, split - 0.015),   # south only
             r_: box(lon - 0.01, split - 0.01, lon + 0.01, split + 0.01),    # across the split
             p_: box(lon - 0.01, split + 0.015, lon + 0.01, split + 0.03)}   # north only
    for fid, g in geoms.items():
        await fences.put(FenceSpec(fence_id=fid, geometry=g, timeout_s=600), create=True)
    obj = tid(tenant, "obj")
    points = [(lon, split - 0.02), (lon, split - 0.005), (lon, split + 0.005), (lon, split + 0.02),
              (lon, split - 0.02), (lon, split + 0.005)]
    regions = [region_at(wm, x, y) for x, y in points]
    assert regions == [south, south, north, north, south, north]
    steps = trajectory(points)
    expected = expected_events(obj, steps, geoms)
    async with AmqpEvents(pipeline) as amqp:
        for fid in geoms:
            await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        await amqp.until(last_per_fence(expected))
    # no LEAVE of the fence across the split while the object stays in it (steps 1 -> 2)
    assert amqp.events(obj) == expected


# --------------------------------------------------------------------------- bad input


def malformed_inputs(tenant: str) -> list[tuple[str, str, bytes, str | None, str]]:
    """1,000 bad inputs: (exchange, routing key, body, content type, expected reason start),
    as `tenant`'s positions, and some by the contract before tenants (no tenant)."""
    one_mb = json.dumps({"lon": 9.5, "lat": 47.1, "ts": time.time(), "pad": "x" * (1 << 20)}).encode()
    now = time.time()
    mqtt_cases: list[tuple[bytes, str]] = [
        (b"{not json", "malformed JSON"),
        (b'{"lon": NaN, "lat": 47.1, "ts": 1.8e9}', "malformed JSON"),
        (json.dumps({"lon": 9.5, "lat": 91, "ts": now}).encode(), "lat 91 is outside"),
        (json.dumps({"lon": 181, "lat": 47, "ts": now}).encode(), "lon 181 is outside"),
        (json.dumps({"lat": 47.1, "ts": now}).encode(), "missing field 'lon'"),
        (json.dumps({"lon": "9.5", "lat": 47.1, "ts": now}).encode(), "lon must be a number"),
        (json.dumps({"lon": 9.5, "lat": 47.1, "ts": now * 1000}).encode(), "ts "),
        (json.dumps([9.5, 47.1]).encode(), "the body is a JSON list"),
        (one_mb, "body of"),
    ]
    gateway_cases: list[tuple[bytes, str | None, str]] = [
        (b"garbage", None, "malformed JSON"),
        (json.dumps({"positions": {"id": "x"}}).encode(), None, 'the body is not {"positions"'),
        (b"\xc1\xc1", "application/msgpack", "malformed msgpack"),
        (json.dumps({"positions": [{"id": "ok-1", "lon": 9.5, "lat": -95, "ts": now}]}).encode(), None,
         "1 of 1 positions refused"),
        (one_mb, None, "body of"),
    ]
    good = json.dumps({"lon": 9.5, "lat": 47.1, "ts": now}).encode()
    gateway_good = json.dumps({"positions": [{"id": "ok-1", "lon": 9.5, "lat": 47.1, "ts": now}]}).encode()
    out = []
    for i in range(1000):
        if i % 3 == 2:
            body, ctype, reason = gateway_cases[i % len(gateway_cases)]
            out.append((t.GATEWAY_EXCHANGE, tenant, body, ctype, reason))
        elif i % 50 == 7:
            out.append((t.MQTT_TOPIC_EXCHANGE, f"positions.{tenant}.-bad!id", b"{}", None, "routing key"))
        elif i % 50 == 17:  # the contract before tenants: a good position, but whose?
            out.append((t.MQTT_TOPIC_EXCHANGE, f"positions.{uid('old')}", good, None, "routing key"))
        elif i % 50 == 27:
            out.append((t.MQTT_TOPIC_EXCHANGE, f"positions.No_Tenant.{uid('x')}", good, None, "routing key"))
        elif i % 50 == 37:
            out.append((t.RETIRED_BATCHES_EXCHANGE, "", gateway_good, None,
                        f"{t.RETIRED_BATCHES_EXCHANGE} carries no tenant"))
        elif i % 50 == 47:
            out.append((t.GATEWAY_EXCHANGE, "Not_A_Tenant", gateway_good, None, "routing key"))
        else:
            body, reason = mqtt_cases[i % len(mqtt_cases)]
            out.append((t.MQTT_TOPIC_EXCHANGE, f"positions.{tenant}.{uid('bad')}", body, None, reason))
    return out


async def test_a_thousand_malformed_inputs_are_dead_lettered(pipeline: ConnectionSettings,
                                                             fences: FenceManager, tenant: str) -> None:
    cases = malformed_inputs(tenant)
    ids = {}
    async with await aio_pika.connect(pipeline["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)  # all routed
        exchanges = {n: await ch.get_exchange(n)
                     for n in (t.MQTT_TOPIC_EXCHANGE, t.GATEWAY_EXCHANGE, t.RETIRED_BATCHES_EXCHANGE)}
        for exchange, key, body, ctype, reason in cases:
            mid = uuid.uuid4().hex
            ids[mid] = reason
            await exchanges[exchange].publish(
                aio_pika.Message(body, message_id=mid, content_type=ctype,
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT), key, mandatory=True)
        dead: dict[str, AbstractIncomingMessage] = {}
        dl = await ch.get_queue(t.DEAD_LETTER_QUEUE)
        others = []
        async with asyncio.timeout(60), dl.iterator() as it:
            async for m in it:
                if m.message_id in ids:
                    dead[m.message_id] = m
                    await m.ack()
                    if len(dead) == len(ids):
                        break
                else:
                    others.append(m)
        for m in others:
            await m.nack(requeue=True)
    assert len(dead) == 1000
    for mid, m in dead.items():
        reason = text((m.headers or {})[t.REASON_HEADER])
        assert reason.startswith(ids[mid]) or ids[mid] in reason, (reason, ids[mid])
    # the sidecars are all still up and the pipeline still works
    assert all(sidecars.running(Settings.from_env()).values())
    fid, obj = tid(tenant, "fok"), tid(tenant, "obj")
    await fences.put(FenceSpec(fence_id=fid, geometry=box(9.590, 47.100, 9.600, 47.110), timeout_s=600),
                     create=True)
    steps = trajectory([(9.585, 47.105), (9.595, 47.105)])
    async with AmqpEvents(pipeline) as amqp:
        await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        await amqp.until({fid: (fid, "enter", obj, steps[-1].ts, "entered")})


def test_the_ground_truth_is_the_strict_interior() -> None:
    """The helper itself: a point on the boundary is outside, as the events contract says."""
    g = box(0, 0, 1, 1)
    steps = [Step(-1, 0.5, 1.0), Step(0.5, 0.5, 2.0), Step(1.0, 0.5, 3.0), Step(0.5, 0.5, 4.0)]
    assert expected_events("o", steps, {"f": g}) == [
        ("f", "enter", "o", 2.0, "entered"), ("f", "enter", "o", 4.0, "entered"),
        ("f", "leave", "o", 3.0, "exited")]
