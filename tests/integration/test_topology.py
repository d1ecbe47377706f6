"""The pipeline's RabbitMQ topology, on the real broker with real clients (aio-pika, paho).

Each test publishes as the user of the sidecar (or the tenant's credential: device, gateway,
application) that publishes there and consumes as the user of the sidecar that consumes there,
so permissions are proven both ways, and what a tenant's credential may not do (another
tenant's topics and keys, another application's queues) is refused. Messages are told apart by
a fresh uuid; a consumer sets aside (and requeues at the end) whatever is not its own. Every
wait has a deadline (polls, queues, asyncio.timeout); nothing sleeps to synchronise. Device
users are created per test (uuid names) and removed afterwards; the gateway and application
users are the session's tenant's (tests/integration/conftest.py).

What RabbitMQ 3.10's MQTT plugin does on a refusal (checked below): a PUBLISH to a topic the
topic permission forbids makes the broker close the connection (no PUBACK; the log says
"closing due to an authorization failure"); a SUBSCRIBE to a forbidden filter fails the
internal queue.bind and the broker closes the connection too (no SUBACK, no 0x80 code). Over
AMQP a refusal closes the channel (ACCESS_REFUSED), which aiormq raises as
ChannelAccessRefused.
"""

from __future__ import annotations

import json
import time
import uuid

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractIncomingMessage

from deploy.settings import ConnectionSettings
from exchanges import ingress_partitions
from exchanges import topology as t
from exchanges.tenancy import qualify
from exchanges.topology import Topology
from tests.integration.clients import (
    DEADLINE,
    Device,
    Login,
    MqttDevice,
    api,
    connect,
    geofence,
    poll,
    publish,
    q,
    take,
    text,
    with_body,
    with_id,
)

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
                                   t.FEDERATION_USER, t.ARCHIVER_USER, t.VENUES_USER, t.WEBHOOKS_USER}
    # the shared users of no tenant are retired: `geofence up` deleted them from the broker
    assert api(stack, f"api/users/{q(t.GATEWAY_USER)}") is None
    assert api(stack, f"api/users/{q(t.CLIENT_USER)}") is None
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
    groups = {t.INGRESS_VHOST: [*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE, t.FOLLOW_QUEUE],
              t.FENCES_VHOST: [*(q for w in topology.workers
                                 for q in (t.fence_queue(w), t.fence_control_queue(w))),
                               t.ARCHIVE_QUEUE, t.WEBHOOKS_QUEUE, t.API_QUEUE],
              **{t.region_vhost(r): [t.GEO_POSITIONS_QUEUE, t.GEO_CONTROL_QUEUE]
                 for r in topology.regions}}
    for vhost, names in groups.items():
        for name in names:
            info = api(stack, f"api/queues/{q(vhost)}/{q(name)}")
            assert info is not None, f"no queue {name} in {vhost}"
            assert info["durable"] is True
            assert info["policy"] == t.INPUT_LIMITS_POLICY, (vhost, name)
            assert info["type"] == "quorum", (vhost, name)
            # one consumer at a time by the broker's rule, but for the API's shared queues
            shared = name in (t.API_QUEUE, t.FOLLOW_QUEUE)
            assert info["arguments"].get("x-single-active-consumer", False) is not shared, (vhost, name)
            assert info["effective_policy_definition"] == {
                "dead-letter-exchange": t.DEAD_LETTER_EXCHANGE, "max-length": 1_000_000,
                "max-length-bytes": 2 * 1024**3, "overflow": "reject-publish", "delivery-limit": 10,
                "dead-letter-strategy": "at-least-once"}
        dead = api(stack, f"api/queues/{q(vhost)}/{q(t.DEAD_LETTER_QUEUE)}")
        assert dead is not None and dead["durable"] is True
        assert dead["policy"] == t.DEAD_LETTER_LIMITS_POLICY  # bounded, oldest dropped, no dead-letter loop
        assert "dead-letter-exchange" not in dead["effective_policy_definition"]


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


# The sidecars consume their input queues (exclusively): a message that is not what they
# expect comes back as a dead letter, with the reason and the queue it came from. That proves
# the path and the sidecar's dead-lettering at once.


async def dead_letter_of(stack: ConnectionSettings, vhost: str, message_id: str,
                         source: str) -> AbstractIncomingMessage:
    dead = await take(stack, t.ADMIN_USER, vhost, t.DEAD_LETTER_QUEUE, with_id(message_id))
    headers = dead.headers or {}
    assert text(headers["x-geofence-source"]) == source
    assert text(headers[t.REASON_HEADER])
    return dead


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
        got = await dead_letter_of(stack, t.FENCES_VHOST, message_id, t.fence_queue(worker))
        assert json.loads(got.body) == {"region": region}
        assert "msgpack" in text((got.headers or {})[t.REASON_HEADER])


async def test_x_ingress_output_reaches_x_geo(stack: ConnectionSettings, topology: Topology) -> None:
    vhost = t.region_vhost(topology.regions[-1])
    message_id = await publish(stack, t.INGRESS_USER, vhost, t.GEO_IN_EXCHANGE, "anything")
    await dead_letter_of(stack, vhost, message_id, t.GEO_POSITIONS_QUEUE)


async def test_fence_manager_reaches_x_geo_and_x_fence_control(stack: ConnectionSettings,
                                                               topology: Topology) -> None:
    vhost, worker = t.region_vhost(topology.regions[0]), topology.workers[-1]
    message_id = await publish(stack, t.MANAGER_USER, vhost, t.GEO_CONTROL_EXCHANGE, "")
    await dead_letter_of(stack, vhost, message_id, t.GEO_CONTROL_QUEUE)
    message_id = await publish(stack, t.MANAGER_USER, t.FENCES_VHOST, t.FENCE_CONTROL_EXCHANGE,
                               worker)
    await dead_letter_of(stack, t.FENCES_VHOST, message_id, t.fence_control_queue(worker))


async def test_gateway_batches_reach_x_ingress(stack: ConnectionSettings, gateway: Login) -> None:
    """A tenant's gateway publishes to ingress.gateway under its tenant's key."""
    message_id = await publish(stack, gateway, t.INGRESS_VHOST, t.GATEWAY_EXCHANGE, gateway.tenant,
                               b'{"positions": "not a list"}')
    dead = await dead_letter_of(stack, t.INGRESS_VHOST, message_id, t.BATCHES_QUEUE)
    headers = dead.headers or {}
    assert text(headers[t.REASON_HEADER]) == 'the body is not {"positions": [...]}'
    assert text(headers["x-geofence-routing-key"]) == gateway.tenant


async def test_gateway_cannot_reach_x_geo_in(stack: ConnectionSettings, topology: Topology,
                                             gateway: Login) -> None:
    rights = api(stack, f"api/users/{q(gateway.user)}/permissions")
    assert [(r["vhost"], r["configure"], r["write"], r["read"]) for r in rights] == [
        (t.INGRESS_VHOST, "^$", r"^(ingress\.gateway|amq\.topic)$", "^$")]
    topics = api(stack, f"api/users/{q(gateway.user)}/topic-permissions")
    assert sorted((r["exchange"], r["write"]) for r in topics) == [
        (t.MQTT_TOPIC_EXCHANGE, rf"^positions\.{gateway.tenant}\.[^.#*]+$"),
        (t.GATEWAY_EXCHANGE, f"^{gateway.tenant}$")]
    region_url = stack["amqp"][t.region_vhost(topology.regions[0])]
    region_url = f"amqp://{q(gateway.user)}:{q(gateway.password)}@{region_url.split('@', 1)[1]}"
    # The broker answers connection.open on a vhost without rights with connection.close
    # (ACCESS_REFUSED), which aiormq reports as an unexpected frame.
    with pytest.raises(aiormq.exceptions.AMQPError):
        connection = await aio_pika.connect(region_url, timeout=DEADLINE)
        await connection.close()


async def test_a_gateway_publishes_only_under_its_tenant(stack: ConnectionSettings, gateway: Login,
                                                         other_tenant: str) -> None:
    """Another tenant's key on ingress.gateway, the retired fanout ingress.batches (no tenant)
    and the sidecars' exchanges are refused; its own key is routed (mandatory, confirmed)."""
    await publish(stack, gateway, t.INGRESS_VHOST, t.GATEWAY_EXCHANGE, gateway.tenant,
                  b'{"positions": "not a list"}')  # (dead-lettered by x-ingress)
    for exchange, key, words in ((t.GATEWAY_EXCHANGE, other_tenant, f"topic '{other_tenant}'"),
                                 (t.GATEWAY_EXCHANGE, "#", "topic '#'"),
                                 (t.RETIRED_BATCHES_EXCHANGE, gateway.tenant,
                                  f"exchange '{t.RETIRED_BATCHES_EXCHANGE}'"),
                                 (t.FOLLOW_EXCHANGE, "", f"exchange '{t.FOLLOW_EXCHANGE}'"),
                                 (t.DEAD_LETTER_EXCHANGE, "", f"exchange '{t.DEAD_LETTER_EXCHANGE}'")):
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=words):
            await publish(stack, gateway, t.INGRESS_VHOST, exchange, key, b'{"positions": []}')


def test_a_gateway_publishes_its_tenants_positions_over_mqtt(stack: ConnectionSettings, gateway: Login,
                                                             other_tenant: str) -> None:
    """A network server logged in as the tenant's gateway: any of its tenant's objects, no
    other tenant's, no position of no tenant."""
    as_gateway = Device(gateway.name, gateway.password, gateway.tenant)  # its login: <tenant>.<name>
    client = MqttDevice(stack, as_gateway)
    try:
        body = json.dumps({"lon": 9.52, "lat": 91, "ts": time.time()})
        for object_id in (f"gw-a-{uuid.uuid4().hex[:6]}", f"gw-b-{uuid.uuid4().hex[:6]}"):
            info = client.client.publish(f"positions/{gateway.tenant}/{object_id}", body, qos=1)
            assert client.expect("puback") == info.mid
    finally:
        client.close()
    for topic in (f"positions/{other_tenant}/gw-{uuid.uuid4().hex[:6]}",
                  f"positions/gw-{uuid.uuid4().hex[:6]}", f"fence-events/{gateway.tenant}/x/enter/y"):
        client = MqttDevice(stack, as_gateway)
        try:
            client.client.publish(topic, b"{}", qos=1)
            event, _ = client.next_event()
            assert event == "disconnect", topic
        finally:
            client.close()


@pytest.mark.parametrize(("user", "vhost", "exchange"), [
    (t.INGRESS_USER, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE),  # only devices and gateways publish positions
    (t.GEO_USER, "REGION", t.GEO_IN_EXCHANGE),  # x-geo never feeds itself (REGION: the first)
    (t.FENCE_USER, t.FENCES_VHOST, t.FENCE_IN_EXCHANGE),
    (t.MANAGER_USER, t.FENCES_VHOST, t.EVENTS_EXCHANGE),
    (t.MANAGER_USER, t.FENCES_VHOST, t.TENANT_BATCHES_EXCHANGE),
    (t.INGRESS_USER, t.INGRESS_VHOST, t.GATEWAY_EXCHANGE),
    (t.INGRESS_USER, t.INGRESS_VHOST, t.RETIRED_BATCHES_EXCHANGE),
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


async def test_rejected_position_is_dead_lettered(stack: ConnectionSettings, tenant: str) -> None:
    body = json.dumps({"lon": "not a number", "token": uuid.uuid4().hex}).encode()
    # As devices' positions arrive: amq.topic, "positions.<tenant>.<id>".
    key = f"positions.{tenant}.t-dead-letter"
    message_id = await publish(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, key, body)
    # from the partition queue RabbitMQ's consistent-hash exchange chose (exchanges/ingress_partitions.py)
    partition = ingress_partitions.queue_name(ingress_partitions.partition_of_key(key))
    dead = await dead_letter_of(stack, t.INGRESS_VHOST, message_id, partition)
    assert dead.body == body
    headers = dead.headers or {}
    assert text(headers[t.REASON_HEADER]) == "missing fields 'lat', 'ts'"
    assert text(headers["x-geofence-routing-key"]) == key


async def test_a_position_of_no_tenant_is_dead_lettered_with_the_reason(stack: ConnectionSettings) -> None:
    """The contract before tenants (MQTT positions/<id>) is still bound, so such a position is
    dead-lettered with the reason rather than dropped as unroutable."""
    body = json.dumps({"lon": 9.5, "lat": 47.1, "ts": time.time(), "token": uuid.uuid4().hex}).encode()
    message_id = await publish(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE,
                               "positions.t-no-tenant", body)
    dead = await dead_letter_of(stack, t.INGRESS_VHOST, message_id, t.POSITIONS_QUEUE)
    reason = text((dead.headers or {})[t.REASON_HEADER])
    assert reason.startswith(
        "routing key 'positions.t-no-tenant' is not positions.<tenant>.<object_id>"), reason


# --------------------------------------------------------------------------- devices over MQTT


async def test_device_position_reaches_x_ingress(stack: ConnectionSettings, device: Device,
                                                mqtt_device: MqttDevice) -> None:
    payload = json.dumps({"lon": 9.52, "lat": 91, "ts": time.time(), "token": uuid.uuid4().hex}).encode()
    mqtt_device.client.publish(device.topic, payload, qos=1)
    mqtt_device.expect("puback")
    got = await take(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.DEAD_LETTER_QUEUE, with_body(payload))
    headers = got.headers or {}
    assert text(headers["x-geofence-routing-key"]) == f"positions.{device.tenant}.{device.object_id}"
    assert text(headers[t.REASON_HEADER]) == "lat 91 is outside [-90, 90]"


async def test_device_cannot_publish_for_another(stack: ConnectionSettings, device: Device,
                                                 other_tenant: str) -> None:
    """Not another device's topic of its tenant, not its own id under another tenant, not the
    topic of no tenant (positions/<id>)."""
    forged = [json.dumps({"lon": 0, "lat": 0, "ts": 0, "token": uuid.uuid4().hex}).encode() for _ in range(3)]
    topics = (f"positions/{device.tenant}/t-other-{uuid.uuid4().hex[:8]}",
              f"positions/{other_tenant}/{device.object_id}",
              f"positions/{device.object_id}")
    for topic, body in zip(topics, forged, strict=True):
        client = MqttDevice(stack, device)
        try:
            client.client.publish(topic, body, qos=1)
            event, _ = client.next_event()
            assert event == "disconnect", topic  # RabbitMQ 3.10 closes the connection, no PUBACK
        finally:
            client.close()
    # Anything the broker had accepted before closing would sit ahead of this sentinel (all
    # are invalid positions, so x-ingress dead-letters them in order).
    sentinel = json.dumps({"sentinel": uuid.uuid4().hex}).encode()
    again = MqttDevice(stack, device)
    try:
        again.client.publish(device.topic, sentinel, qos=1)
        again.expect("puback")
    finally:
        again.close()
    seen: list[bytes] = []

    def sentinel_or_record(message: AbstractIncomingMessage) -> bool:
        seen.append(message.body)
        return message.body == sentinel

    await take(stack, t.ADMIN_USER, t.INGRESS_VHOST, t.DEAD_LETTER_QUEUE, sentinel_or_record)
    assert not set(forged) & set(seen)


def test_device_cannot_subscribe_to_another_devices_events(stack: ConnectionSettings, device: Device,
                                                           other_tenant: str) -> None:
    for topic in (f"fence-events/{device.tenant}/+/+/t-other-{uuid.uuid4().hex[:8]}",  # another device's
                  f"fence-events/{other_tenant}/+/+/{device.object_id}",  # its id in another tenant
                  f"fence-events/+/+/+/{device.object_id}",  # every tenant's
                  f"fence-events/+/+/{device.object_id}",  # the topic of no tenant
                  "fence-events/#"):  # nor to every fence's events
        client = MqttDevice(stack, device)
        try:
            client.client.subscribe(topic, qos=1)
            event, _ = client.next_event()
            assert event == "disconnect", topic  # RabbitMQ 3.10 closes the connection, no SUBACK
        finally:
            client.close()


async def test_fence_event_reaches_the_device_over_mqtt(stack: ConnectionSettings, device: Device,
                                                        mqtt_device: MqttDevice,
                                                        topology: Topology) -> None:
    await test_federation_links_are_running(stack, topology)
    mqtt_device.client.subscribe(f"fence-events/{device.tenant}/+/+/{device.object_id}", qos=1)
    codes = mqtt_device.expect("suback")
    assert [c.value for c in codes] == [1]
    binding_key = f"fence-events.{device.tenant}.*.*.{device.object_id}"

    def propagated() -> bool:  # the federation link copies the new binding to gf-fences
        found = api(stack, f"api/exchanges/{q(t.FENCES_VHOST)}/{q(t.EVENTS_EXCHANGE)}"
                           "/bindings/source") or []
        return any(b["routing_key"] == binding_key for b in found)

    await poll(propagated, f"binding {binding_key} on fence.events in gf-fences")
    fence_id = f"f-{uuid.uuid4().hex[:8]}"
    # as x-fence publishes it: keyed by the qualified ids, the names unqualified in the body
    per_object = t.event_routing_key(qualify(device.tenant, fence_id), "enter", device.key)
    assert per_object == f"fence-events.{device.tenant}.{fence_id}.enter.{device.object_id}"
    event = {"schema": 1, "event": "enter", "tenant": device.tenant, "fence_id": fence_id,
             "object_id": device.object_id, "ts": time.time(), "reason": "entered",
             "event_id": uuid.uuid4().hex}
    await publish(stack, t.FENCE_USER, t.FENCES_VHOST, t.EVENTS_EXCHANGE, per_object,
                  json.dumps(event).encode())
    topic, payload = mqtt_device.expect("message")
    assert topic == f"fence-events/{device.tenant}/{fence_id}/enter/{device.object_id}"
    assert json.loads(payload) == event


def test_device_list_and_remove(stack: ConnectionSettings, device: Device, other_tenant: str) -> None:
    listed = geofence("device", "list", "--tenant", device.tenant)
    assert listed.returncode == 0 and device.user in listed.stdout.split()
    assert device.user in geofence("device", "list").stdout.split()  # every tenant's
    assert device.user not in geofence("device", "list", "--tenant", other_tenant).stdout.split()
    rows = json.loads(geofence("device", "list", "--tenant", device.tenant, "--json").stdout)
    assert {"user": device.user, "tenant": device.tenant, "name": device.object_id} in rows
    assert {r["tenant"] for r in rows} == {device.tenant}
    client = MqttDevice(stack, device, clean_session=False)  # a durable subscription queue
    client.client.subscribe(f"fence-events/{device.tenant}/+/+/{device.object_id}", qos=1)
    client.expect("suback")
    qos1 = f"{t.MQTT_SUBSCRIPTION_QUEUE_PREFIX}{device.user}qos1"
    assert api(stack, f"api/queues/{q(t.INGRESS_VHOST)}/{q(qos1)}") is not None
    try:
        # another tenant has no such device: refused, nothing removed
        wrong = geofence("device", "remove", device.object_id, "--tenant", other_tenant)
        assert wrong.returncode == 1 and "no device" in wrong.stderr, wrong.stdout + wrong.stderr
        assert api(stack, f"api/users/{q(device.user)}") is not None
        removed = geofence("device", "remove", device.object_id, "--tenant", device.tenant)
        assert removed.returncode == 0, removed.stderr
        assert client.expect("disconnect") is not None  # its connection was closed
    finally:
        client.close()
    assert api(stack, f"api/users/{q(device.user)}") is None
    assert api(stack, f"api/queues/{q(t.INGRESS_VHOST)}/{q(qos1)}") is None
    assert device.user not in geofence("device", "list").stdout.split()


def test_device_names_never_reach_another_user(stack: ConnectionSettings, tenant: str,
                                               gateway: Login) -> None:
    """A device is `<tenant>.<id>`: a sidecar's name makes a device of that name in the tenant,
    never touches the sidecar user; a bad id or tenant, or a user of another kind of the tenant
    (its gateway), is refused."""
    for name in ("bad.name", "bad name", ""):
        done = geofence("device", "add", name, "--tenant", tenant, "--password-stdin", stdin="x\n")
        assert done.returncode == 1, done.stdout + done.stderr
    done = geofence("device", "add", "d-1", "--tenant", "Bad_Tenant", "--password-stdin", stdin="x\n")
    assert done.returncode == 1 and "tenant" in done.stderr, done.stdout + done.stderr
    done = geofence("device", "add", "d-1", "--password-stdin", stdin="x\n")
    assert done.returncode == 2 and "--tenant" in done.stderr  # a device is always a tenant's
    done = geofence("device", "add", gateway.name, "--tenant", tenant, "--password-stdin", stdin="x\n")
    assert done.returncode == 1 and "exists" in done.stderr, done.stdout + done.stderr
    assert t.GATEWAY_TAG in str(api(stack, f"api/users/{q(gateway.user)}")["tags"])
    before = api(stack, f"api/users/{q(t.INGRESS_USER)}")
    done = geofence("device", "add", t.INGRESS_USER, "--tenant", tenant, "--password-stdin", stdin="x\n")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{tenant}.{t.INGRESS_USER}" in done.stdout
        assert api(stack, f"api/users/{q(t.INGRESS_USER)}") == before  # the sidecar's untouched
    finally:
        geofence("device", "remove", t.INGRESS_USER, "--tenant", tenant)
    assert api(stack, f"api/users/{q(f'{tenant}.{t.INGRESS_USER}')}") is None
