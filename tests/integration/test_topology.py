"""The pipeline's RabbitMQ topology, on the real broker with real clients (aio-pika, paho).

Each test publishes as the user of the sidecar that publishes there and consumes as the user
of the sidecar that consumes there, so permissions are proven both ways. Messages are told
apart by a fresh uuid; a consumer sets aside (and requeues at the end) whatever is not its
own. Every wait has a deadline (polls, queues, asyncio.timeout); nothing sleeps to
synchronise. Device users are created per test (uuid names) and removed afterwards.

What RabbitMQ 3.10's MQTT plugin does on a refusal (checked below): a PUBLISH to a topic the
topic permission forbids makes the broker close the connection (no PUBACK; the log says
"closing due to an authorization failure"); a SUBSCRIBE to a forbidden filter fails the
internal queue.bind and the broker closes the connection too (no SUBACK, no 0x80 code).
"""

from __future__ import annotations

import asyncio
import base64
import json
import queue
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq
import paho.mqtt.client as mqtt
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from paho.mqtt.enums import CallbackAPIVersion

from deploy.local_stack import ConnectionSettings, Settings
from exchanges import topology as t
from exchanges.topology import Topology

DEADLINE = 20.0  # seconds, for any single wait
POLL = 0.1


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="session")
def topology() -> Topology:
    """The regions and workers the stack was set up with (GEOFENCE_REGIONS, _WORKERS)."""
    return Settings.from_env().topology


def geofence(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("geofence")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "deploy.cli"]
    return subprocess.run([*argv, *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def api(stack: ConnectionSettings, path: str) -> Any:
    """GET on the management API as the administrator; None for a 404."""
    auth = base64.b64encode(f"{t.ADMIN_USER}:{stack['mqtt']['password']}".encode()).decode()
    request = urllib.request.Request(stack["management"]["url"] + path,
                                     headers={"Authorization": f"Basic {auth}"})
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def q(name: str) -> str:
    return quote(name, safe="")


async def poll(check: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(POLL)


def url(stack: ConnectionSettings, user: str, vhost: str) -> str:
    return stack["amqp"][vhost] if user == t.ADMIN_USER else stack["users"][user][vhost]


async def connect(stack: ConnectionSettings, user: str, vhost: str) -> AbstractRobustConnection:
    return await aio_pika.connect_robust(url(stack, user, vhost), timeout=DEADLINE)


async def publish(stack: ConnectionSettings, user: str, vhost: str, exchange: str,
                  routing_key: str, body: bytes = b"{}") -> str:
    """Publish one persistent message with confirms and mandatory; returns its message id."""
    message_id = uuid.uuid4().hex
    async with await connect(stack, user, vhost) as connection:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange)  # passive: the topology declared it
        await target.publish(aio_pika.Message(body, message_id=message_id,
                                              delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                             routing_key=routing_key, mandatory=True, timeout=DEADLINE)
    return message_id


async def take(stack: ConnectionSettings, user: str, vhost: str, queue_name: str,
               wanted: Callable[[AbstractIncomingMessage], bool],
               settle: str = "ack") -> AbstractIncomingMessage:
    """Consume `queue_name` as `user` until a wanted message comes; ack (or reject without
    requeue) it, and requeue the others at the end."""
    others: list[AbstractIncomingMessage] = []
    async with await connect(stack, user, vhost) as connection:
        channel = await connection.channel()
        source = await channel.get_queue(queue_name)  # passive
        try:
            async with asyncio.timeout(DEADLINE), source.iterator() as messages:
                async for message in messages:
                    if wanted(message):
                        if settle == "ack":
                            await message.ack()
                        else:
                            await message.reject(requeue=False)
                        return message
                    others.append(message)
        finally:
            for other in others:
                await other.nack(requeue=True)
    raise AssertionError("unreachable")


def with_id(message_id: str) -> Callable[[AbstractIncomingMessage], bool]:
    return lambda m: m.message_id == message_id


def with_body(body: bytes) -> Callable[[AbstractIncomingMessage], bool]:
    return lambda m: m.body == body


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- MQTT devices


@dataclass
class Device:
    object_id: str
    password: str


@pytest.fixture
def device(stack: ConnectionSettings) -> Iterator[Device]:
    """A fresh device user, removed afterwards."""
    made = Device(f"t-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex)
    done = geofence("device", "add", made.object_id, "--password-stdin", stdin=made.password + "\n")
    assert done.returncode == 0, done.stderr
    assert made.password not in done.stdout + done.stderr
    try:
        yield made
    finally:
        if api(stack, f"api/users/{q(made.object_id)}") is not None:
            removed = geofence("device", "remove", made.object_id)
            assert removed.returncode == 0, removed.stderr


class MqttDevice:
    """A paho client logged in as a device (no automatic reconnect: a refusal shows)."""

    def __init__(self, stack: ConnectionSettings, dev: Device, clean_session: bool = True) -> None:
        cfg = stack["mqtt"]
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=dev.object_id,
                                  clean_session=clean_session, protocol=mqtt.MQTTv311,
                                  reconnect_on_failure=False)
        self.client.username_pw_set(f"{cfg['ingress_vhost']}:{dev.object_id}", dev.password)
        self.client.on_connect = lambda c, u, f, reason, p: self.events.put(("connack", reason))
        self.client.on_disconnect = lambda c, u, f, reason, p: self.events.put(("disconnect", reason))
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.events.put(("suback", codes))
        self.client.on_publish = lambda c, u, mid, reason, p: self.events.put(("puback", mid))
        self.client.on_message = lambda c, u, msg: self.events.put(
            ("message", (msg.topic, bytes(msg.payload))))
        self.client.connect(cfg["host"], cfg["port"], keepalive=30)
        self.client.loop_start()
        kind, reason = self.next_event()
        assert kind == "connack" and not reason.is_failure, f"MQTT login refused: {reason}"

    def next_event(self) -> tuple[str, Any]:
        try:
            return self.events.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError(f"no MQTT event within {DEADLINE:g}s") from None

    def expect(self, kind: str) -> Any:
        event, value = self.next_event()
        assert event == kind, f"expected {kind}, got {event} {value}"
        return value

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def mqtt_device(stack: ConnectionSettings, device: Device) -> Iterator[MqttDevice]:
    client = MqttDevice(stack, device)
    try:
        yield client
    finally:
        client.close()


# --------------------------------------------------------------------------- the topology is there


def test_apply_again_changes_nothing(stack: ConnectionSettings) -> None:
    done = geofence("topology", "apply", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "nothing to change" in done.stdout, done.stdout


def test_inspect_topology_reports_everything_running(stack: ConnectionSettings) -> None:
    done = geofence("inspect", "topology")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("gf-ingress", "gf-fences", "x-ingress.positions", "x-fence.w1.control",
                 "running"):
        assert name in done.stdout
    assert stack["mqtt"]["password"] not in done.stdout


async def test_federation_links_are_running(stack: ConnectionSettings, topology: Topology) -> None:
    wanted = {(t.FENCES_VHOST, t.FENCE_IN_EXCHANGE, t.upstream_name(t.region_vhost(r)))
              for r in topology.regions}
    wanted.add((t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.upstream_name(t.FENCES_VHOST)))

    def running() -> bool:
        links = api(stack, "api/federation-links") or []
        up = {(lk["vhost"], lk["exchange"], lk["upstream"]) for lk in links
              if lk.get("status") == "running"}
        return wanted <= up

    await poll(running, "the federation links to run")


async def test_every_sidecar_user_logs_in_where_status_says(stack: ConnectionSettings,
                                                           topology: Topology) -> None:
    assert set(stack["users"]) == {t.INGRESS_USER, t.GEO_USER, t.FENCE_USER, t.MANAGER_USER,
                                   t.FEDERATION_USER, t.GATEWAY_USER}
    assert set(stack["amqp"]) == {"/", *topology.vhosts}
    assert stack["mqtt"]["ingress_vhost"] == t.INGRESS_VHOST
    for user, vhosts in stack["users"].items():
        for vhost in vhosts:
            async with await connect(stack, user, vhost):
                pass
    for vhost in stack["amqp"]:
        async with await aio_pika.connect(stack["amqp"][vhost], timeout=DEADLINE):
            pass


async def test_input_queues_carry_the_length_limit_and_dead_letter_policy(
        stack: ConnectionSettings, topology: Topology) -> None:
    groups = {t.INGRESS_VHOST: [t.POSITIONS_QUEUE, t.BATCHES_QUEUE],
              t.FENCES_VHOST: [q for w in topology.workers
                               for q in (t.fence_queue(w), t.fence_control_queue(w))],
              **{t.region_vhost(r): [t.GEO_POSITIONS_QUEUE, t.GEO_CONTROL_QUEUE]
                 for r in topology.regions}}
    for vhost, names in groups.items():
        for name in names:
            info = api(stack, f"api/queues/{q(vhost)}/{q(name)}")
            assert info is not None, f"no queue {name} in {vhost}"
            assert info["durable"] is True
            assert info["policy"] == t.INPUT_LIMITS_POLICY, (vhost, name)
            assert info["effective_policy_definition"] == {
                "dead-letter-exchange": t.DEAD_LETTER_EXCHANGE, "max-length": 1_000_000,
                "overflow": "reject-publish"}
        dead = api(stack, f"api/queues/{q(vhost)}/{q(t.DEAD_LETTER_QUEUE)}")
        assert dead is not None and dead["durable"] is True and not dead.get("policy")


async def test_other_queues_get_the_dead_letter_policy(stack: ConnectionSettings,
                                                      topology: Topology) -> None:
    vhost, name = t.region_vhost(topology.regions[0]), f"test.topology.{uuid.uuid4().hex}"
    async with await aio_pika.connect(stack["amqp"][vhost], timeout=DEADLINE) as connection:
        channel = await connection.channel()
        scratch = await channel.declare_queue(name, auto_delete=True)
        try:
            def has_policy() -> bool:
                info = api(stack, f"api/queues/{q(vhost)}/{q(name)}")
                return bool(info and info.get("policy") == t.DEAD_LETTER_POLICY)

            await poll(has_policy, f"policy {t.DEAD_LETTER_POLICY} on {name}")
            info = api(stack, f"api/queues/{q(vhost)}/{q(name)}")
            assert info["effective_policy_definition"] == {
                "dead-letter-exchange": t.DEAD_LETTER_EXCHANGE}
        finally:
            await scratch.delete(if_unused=False, if_empty=False)


# --------------------------------------------------------------------------- the pipeline's paths


async def test_x_geo_output_reaches_x_fence_through_federation(stack: ConnectionSettings,
                                                               topology: Topology) -> None:
    await test_federation_links_are_running(stack, topology)
    worker = topology.workers[0]
    for region in topology.regions:
        upstream_vhost = t.region_vhost(region)

        def key_propagated(vhost: str = upstream_vhost) -> bool:  # copied by the link
            found = api(stack, f"api/exchanges/{q(vhost)}/{q(t.FENCE_IN_EXCHANGE)}"
                               "/bindings/source") or []
            return any(b["routing_key"] == worker for b in found)

        await poll(key_propagated, f"binding key {worker} on x-fence.in in {upstream_vhost}")
        message_id = await publish(stack, t.GEO_USER, upstream_vhost, t.FENCE_IN_EXCHANGE, worker,
                                   json.dumps({"region": region}).encode())
        got = await take(stack, t.FENCE_USER, t.FENCES_VHOST, t.fence_queue(worker),
                         with_id(message_id))
        assert json.loads(got.body) == {"region": region}
        assert got.routing_key == worker


async def test_x_ingress_output_reaches_x_geo(stack: ConnectionSettings, topology: Topology) -> None:
    vhost = t.region_vhost(topology.regions[-1])
    message_id = await publish(stack, t.INGRESS_USER, vhost, t.GEO_IN_EXCHANGE, "anything")
    await take(stack, t.GEO_USER, vhost, t.GEO_POSITIONS_QUEUE, with_id(message_id))


async def test_fence_manager_reaches_x_geo_and_x_fence_control(stack: ConnectionSettings,
                                                               topology: Topology) -> None:
    vhost, worker = t.region_vhost(topology.regions[0]), topology.workers[-1]
    message_id = await publish(stack, t.MANAGER_USER, vhost, t.GEO_CONTROL_EXCHANGE, "")
    await take(stack, t.GEO_USER, vhost, t.GEO_CONTROL_QUEUE, with_id(message_id))
    message_id = await publish(stack, t.MANAGER_USER, t.FENCES_VHOST, t.FENCE_CONTROL_EXCHANGE,
                               worker)
    await take(stack, t.FENCE_USER, t.FENCES_VHOST, t.fence_control_queue(worker),
               with_id(message_id))


async def test_gateway_batches_reach_x_ingress(stack: ConnectionSettings) -> None:
    message_id = await publish(stack, t.GATEWAY_USER, t.INGRESS_VHOST, t.BATCHES_EXCHANGE, "",
                               b'{"positions": []}')
    await take(stack, t.INGRESS_USER, t.INGRESS_VHOST, t.BATCHES_QUEUE, with_id(message_id))


async def test_gateway_cannot_reach_x_geo_in(stack: ConnectionSettings, topology: Topology) -> None:
    rights = api(stack, f"api/users/{t.GATEWAY_USER}/permissions")
    assert [(r["vhost"], r["write"]) for r in rights] == [(t.INGRESS_VHOST, r"^ingress\.batches$")]
    gateway = stack["users"][t.GATEWAY_USER][t.INGRESS_VHOST]
    region_url = gateway.rsplit("/", 1)[0] + "/" + q(t.region_vhost(topology.regions[0]))
    # The broker answers connection.open on a vhost without rights with connection.close
    # (ACCESS_REFUSED), which aiormq reports as an unexpected frame.
    with pytest.raises(aiormq.exceptions.AMQPError):
        connection = await aio_pika.connect(region_url, timeout=DEADLINE)
        await connection.close()


@pytest.mark.parametrize(("user", "vhost", "exchange"), [
    (t.GATEWAY_USER, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE),  # only devices publish positions
    (t.GEO_USER, "REGION", t.GEO_IN_EXCHANGE),  # x-geo never feeds itself (REGION: the first)
    (t.FENCE_USER, t.FENCES_VHOST, t.FENCE_IN_EXCHANGE),
    (t.MANAGER_USER, t.FENCES_VHOST, t.EVENTS_EXCHANGE),
    (t.INGRESS_USER, t.INGRESS_VHOST, t.BATCHES_EXCHANGE),
])
async def test_publishing_outside_ones_rights_is_refused(stack: ConnectionSettings,
                                                         topology: Topology, user: str,
                                                         vhost: str, exchange: str) -> None:
    vhost = t.region_vhost(topology.regions[0]) if vhost == "REGION" else vhost
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=f"access to exchange '{exchange}'"):
        await publish(stack, user, vhost, exchange, "w0")


async def test_sidecars_cannot_declare(stack: ConnectionSettings) -> None:
    async with await connect(stack, t.INGRESS_USER, t.INGRESS_VHOST) as connection:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.declare_queue(f"test.topology.{uuid.uuid4().hex}", auto_delete=True)


async def test_rejected_position_is_dead_lettered(stack: ConnectionSettings) -> None:
    body = json.dumps({"lon": "not a number", "token": uuid.uuid4().hex}).encode()
    # As devices' positions arrive: amq.topic, "positions.<id>".
    await publish(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE,
                  "positions.t-dead-letter", body)
    await take(stack, t.INGRESS_USER, t.INGRESS_VHOST, t.POSITIONS_QUEUE, with_body(body),
               settle="reject")
    dead = await take(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.DEAD_LETTER_QUEUE, with_body(body))
    death = (dead.headers or {})["x-death"]
    assert isinstance(death, list) and isinstance(death[0], dict)
    assert text(death[0]["reason"]) == "rejected"
    assert text(death[0]["queue"]) == t.POSITIONS_QUEUE


# --------------------------------------------------------------------------- devices over MQTT


async def test_device_position_lands_in_x_ingress_positions(stack: ConnectionSettings,
                                                            device: Device,
                                                            mqtt_device: MqttDevice) -> None:
    payload = json.dumps({"lon": 9.52, "lat": 47.14, "ts": time.time(),
                          "token": uuid.uuid4().hex}).encode()
    mqtt_device.client.publish(f"positions/{device.object_id}", payload, qos=1)
    mqtt_device.expect("puback")
    got = await take(stack, t.INGRESS_USER, t.INGRESS_VHOST, t.POSITIONS_QUEUE, with_body(payload))
    assert got.routing_key == f"positions.{device.object_id}"


async def test_device_cannot_publish_for_another(stack: ConnectionSettings, device: Device) -> None:
    forged = json.dumps({"lon": 0, "lat": 0, "ts": 0, "token": uuid.uuid4().hex}).encode()
    client = MqttDevice(stack, device)
    try:
        client.client.publish(f"positions/t-other-{uuid.uuid4().hex[:8]}", forged, qos=1)
        event, _ = client.next_event()
        assert event == "disconnect"  # RabbitMQ 3.10 closes the connection, no PUBACK
    finally:
        client.close()
    # Anything the broker had accepted before closing would sit ahead of this sentinel.
    sentinel = json.dumps({"sentinel": uuid.uuid4().hex}).encode()
    again = MqttDevice(stack, device)
    try:
        again.client.publish(f"positions/{device.object_id}", sentinel, qos=1)
        again.expect("puback")
    finally:
        again.close()
    seen: list[bytes] = []

    def sentinel_or_record(message: AbstractIncomingMessage) -> bool:
        seen.append(message.body)
        return message.body == sentinel

    await take(stack, t.INGRESS_USER, t.INGRESS_VHOST, t.POSITIONS_QUEUE, sentinel_or_record)
    assert forged not in seen


def test_device_cannot_subscribe_to_another_devices_events(stack: ConnectionSettings,
                                                           device: Device) -> None:
    client = MqttDevice(stack, device)
    try:
        client.client.subscribe(f"object-events/t-other-{uuid.uuid4().hex[:8]}/#", qos=1)
        event, _ = client.next_event()
        assert event == "disconnect"  # RabbitMQ 3.10 closes the connection, no SUBACK
    finally:
        client.close()
    client = MqttDevice(stack, device)
    try:
        client.client.subscribe("fence-events/#", qos=0)  # nor to every fence's events
        event, _ = client.next_event()
        assert event == "disconnect"
    finally:
        client.close()


async def test_fence_event_reaches_the_device_over_mqtt(stack: ConnectionSettings, device: Device,
                                                        mqtt_device: MqttDevice,
                                                        topology: Topology) -> None:
    await test_federation_links_are_running(stack, topology)
    mqtt_device.client.subscribe(f"object-events/{device.object_id}/#", qos=1)
    codes = mqtt_device.expect("suback")
    assert [c.value for c in codes] == [1]
    binding_key = f"object-events.{device.object_id}.#"

    def propagated() -> bool:  # the federation link copies the new binding to gf-fences
        found = api(stack, f"api/exchanges/{q(t.FENCES_VHOST)}/{q(t.EVENTS_MQTT_EXCHANGE)}"
                           "/bindings/source") or []
        return any(b["routing_key"] == binding_key for b in found)

    await poll(propagated, f"binding {binding_key} on fence.events.mqtt in gf-fences")
    fence_id = f"f-{uuid.uuid4().hex[:8]}"
    _, per_object = t.mqtt_event_routing_keys(fence_id, device.object_id, "enter")
    event = {"event": "enter", "fence_id": fence_id, "object_id": device.object_id,
             "ts": time.time(), "reason": "entered", "event_id": uuid.uuid4().hex}
    await publish(stack, t.FENCE_USER, t.FENCES_VHOST, t.EVENTS_MQTT_EXCHANGE, per_object,
                  json.dumps(event).encode())
    topic, payload = mqtt_device.expect("message")
    assert topic == f"object-events/{device.object_id}/{fence_id}/enter"
    assert json.loads(payload) == event


def test_device_list_and_remove(stack: ConnectionSettings, device: Device) -> None:
    listed = geofence("device", "list")
    assert listed.returncode == 0 and device.object_id in listed.stdout.split()
    client = MqttDevice(stack, device, clean_session=False)  # a durable subscription queue
    client.client.subscribe(f"object-events/{device.object_id}/#", qos=1)
    client.expect("suback")
    qos1 = f"{t.MQTT_SUBSCRIPTION_QUEUE_PREFIX}{device.object_id}qos1"
    assert api(stack, f"api/queues/{q(t.INGRESS_VHOST)}/{q(qos1)}") is not None
    try:
        removed = geofence("device", "remove", device.object_id)
        assert removed.returncode == 0, removed.stderr
        assert client.expect("disconnect") is not None  # its connection was closed
    finally:
        client.close()
    assert api(stack, f"api/users/{q(device.object_id)}") is None
    assert api(stack, f"api/queues/{q(t.INGRESS_VHOST)}/{q(qos1)}") is None
    assert device.object_id not in geofence("device", "list").stdout.split()


def test_device_names_of_sidecars_are_refused(stack: ConnectionSettings) -> None:
    for name in (t.INGRESS_USER, t.ADMIN_USER, "bad.name"):
        done = geofence("device", "add", name, "--password-stdin", stdin="x\n")
        assert done.returncode == 1, done.stdout + done.stderr

