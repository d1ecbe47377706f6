"""The attack table's rows against the broker's host defaults (issue 37): what a stock RabbitMQ
lets anyone do (guest, anonymous MQTT, epmd and the Erlang distribution on every interface,
unbounded connections, messages and dead letters) tried against this stack's broker."""

from __future__ import annotations

import asyncio
import time
import uuid
from urllib.parse import urlsplit

import aio_pika
import httpx
import orjson

from deploy import broker_host, exposure
from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq import devices
from deploy.settings import Settings, load_secrets
from exchanges import topology as t
from tests.integration.clients import api, q
from tests.security.attacks import holds, refused
from tests.security.conftest import DEADLINE, World
from tests.security.mqtt import Mqtt


async def test_mqtt_without_credentials_is_refused(world: World) -> None:
    try:
        Mqtt(world.stack, "", None, client_id=f"anon-{uuid.uuid4().hex[:8]}").close()
        answer = "accepted"
    except AssertionError as exc:
        answer = f"refused ({str(exc).rsplit(':', 1)[-1].strip()})"
    own = Mqtt(world.stack, f"{world.b}.van-1", world.secrets[f"{world.b}.van-1"])
    own.close()
    holds("outsider", "MQTT CONNECT with no user name or password (the plugin's default: guest)", answer,
          "a device's own login: accepted", answer.startswith("refused"))


async def test_guest_is_gone(world: World) -> None:
    admin = urlsplit(world.stack["amqp"]["/"])
    answer = await refused(aio_pika.connect(f"amqp://guest:guest@{admin.hostname}:{admin.port}/",
                                            timeout=DEADLINE))
    async with httpx.AsyncClient(timeout=DEADLINE) as http:
        whoami = world.stack["management"]["url"] + "api/whoami"
        web = (await http.get(whoami, auth=("guest", "guest"))).status_code
    users = {u["name"] for u in api(world.stack, "api/users")}
    holds("outsider", "guest/guest on AMQP and on the management API", f"AMQP {answer}, HTTP {web}",
          f"the user list: guest {'present' if 'guest' in users else 'absent'}",
          answer.startswith("refused") and web == 401 and "guest" not in users)


async def test_epmd_and_the_erlang_distribution_face_loopback_only(world: World) -> None:
    ports = (broker_host.EPMD_PORT, *broker_host.DIST_PORTS)
    bound = sorted({f"{x.address}:{x.port}" for x in exposure.listeners() if x.port in ports})
    settings = Settings.from_env()
    holds("outsider (another host)", "connect to epmd (4369) and the Erlang distribution (25672)",
          f"listening on {bound}",
          f"this host's name resolves to loopback: {broker_host.host_name_is_loopback()}",
          broker_host.dist_on_loopback(settings) and bool(bound) and not exposure.exposed(ports))


async def test_a_device_holds_two_connections_at_most(world: World) -> None:
    user = f"{world.b}.van-1"
    limit = cred.USER_LIMITS[t.DEVICE_TAG]["max-connections"]
    opened: list[Mqtt] = []
    try:
        for n in range(limit):
            opened.append(Mqtt(world.stack, user, world.secrets[user], client_id=f"{user}:{n}"))
        try:
            opened.append(Mqtt(world.stack, user, world.secrets[user], client_id=f"{user}:extra"))
            answer = "accepted"
        except AssertionError as exc:
            answer = f"refused ({str(exc).rsplit(':', 1)[-1].strip()})"
    finally:
        for client in opened:
            client.close()
    limits = api(world.stack, f"api/user-limits/{q(user)}")
    holds("a tenant's device", f"open connection {limit + 1} (a leaked password, a reconnect loop)", answer,
          f"the first {limit} accepted; limits {limits[0]['value'] if limits else None}",
          answer.startswith("refused") and len(opened) == limit)


async def test_a_message_over_the_size_bound_is_refused(world: World) -> None:
    gateway = f"{world.b}.gw"

    async def send(body: bytes) -> None:
        async with await aio_pika.connect(world.amqp(gateway, t.INGRESS_VHOST), timeout=DEADLINE) as conn:
            ch = await conn.channel()
            x = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
            await x.publish(aio_pika.Message(body), world.b, timeout=DEADLINE)

    answer = await refused(send(b"x" * (broker_host.MAX_MESSAGE_SIZE + 1)))
    legit = await refused(send(orjson.dumps({"positions": []})))
    holds("a tenant's gateway", f"publish {broker_host.MAX_MESSAGE_SIZE + 1:,} bytes", answer,
          f"a small batch: {legit}", answer.startswith("refused") and legit == "accepted")


async def test_the_queues_a_client_fills_are_bounded(world: World) -> None:
    """dead-letters (a device's garbage ends there), the applications' app.* queues and the
    MQTT subscriptions: each with its length and byte bounds and drop-head."""
    app = f"{world.b}.app"
    mine = f"{t.app_queue_prefix(app)}idle-{uuid.uuid4().hex[:6]}"
    async with await aio_pika.connect(world.amqp(app, t.FENCES_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel()
        await ch.declare_queue(mine, durable=True)
        try:
            device = Mqtt(world.stack, f"{world.b}.van-1", world.secrets[f"{world.b}.van-1"])
            try:
                device.subscribe(f"fence-events/{world.b}/+/+/van-1")
                found = {}
                subscription = f"{t.MQTT_SUBSCRIPTION_QUEUE_PREFIX}{world.b}.van-1qos1"
                for vhost, name in [*((v, t.DEAD_LETTER_QUEUE) for v in (t.INGRESS_VHOST, t.FENCES_VHOST)),
                                    (t.FENCES_VHOST, mine), (t.INGRESS_VHOST, subscription)]:
                    got = await _policy_of(world, vhost, name)
                    found[f"{vhost}/{name}"] = got
            finally:
                device.close()
        finally:
            await ch.queue_delete(mine)
    bounded = all(p.get("overflow") == "drop-head" and p.get("max-length-bytes") and p.get("max-length")
                  for p in found.values())
    dead = found[f"{t.INGRESS_VHOST}/{t.DEAD_LETTER_QUEUE}"]
    holds("a tenant's device or application", "fill dead-letters, an app.* queue or an MQTT subscription",
          f"{len(found)} queues, each bounded: {bounded}",
          f"dead-letters: {dead.get('max-length-bytes', 0) // 2**20} MiB, drop-head",
          bounded and dead.get("max-length-bytes") == d.DEAD_LETTER_MAX_BYTES)


async def _policy_of(world: World, vhost: str, name: str) -> dict[str, object]:
    """The queue's effective policy (the management API fills it in a few seconds after a
    declare: polled)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        got = api(world.stack, f"api/queues/{q(vhost)}/{q(name)}") or {}
        policy = got.get("effective_policy_definition") or {}
        if policy or time.monotonic() > deadline:
            return dict(policy)
        await asyncio.sleep(0.2)


async def test_a_device_cannot_take_another_devices_client_id(world: World) -> None:
    """RabbitMQ's MQTT plugin keys sessions by client id alone: before the guard, a device
    logging in with another's id disconnected it (and could keep it offline)."""
    victim, attacker = f"{world.a}.van-1", f"{world.b}.van-1"
    held = Mqtt(world.stack, victim, world.secrets[victim])
    try:
        try:
            Mqtt(world.stack, attacker, world.secrets[attacker], client_id=victim).close()
            answer = "accepted"
        except AssertionError as exc:
            answer = f"refused ({str(exc).rsplit(':', 1)[-1].strip()})"
        still = held.publish(f"positions/{world.a}/van-1", orjson.dumps(
            {"lon": 2.35, "lat": 48.85, "ts": time.time()}))
    finally:
        held.close()
    holds("another tenant's device", "MQTT CONNECT with the victim's client id and its own credentials",
          answer, f"the victim, connected meanwhile, publishes: {still}",
          answer.startswith("refused") and still == "puback")


async def test_failed_mqtt_logins_lock_the_user_name_out(world: World) -> None:
    settings = Settings.from_env()
    pw = load_secrets(settings)
    name = f"lock-{uuid.uuid4().hex[:8]}"
    user = f"{world.b}.{name}"
    password = devices.add(settings, pw, world.b, name, None, lambda _: None)
    try:
        burst = int(2 * settings.guard_failed_logins) + 2  # the bucket's burst, and what refills meanwhile
        wrong = []
        for _ in range(burst):
            try:
                Mqtt(world.stack, user, "not-" + password).close()
                wrong.append("accepted")
            except AssertionError:
                wrong.append("refused")
        try:
            Mqtt(world.stack, user, password).close()
            right = "accepted"
        except AssertionError as exc:
            right = f"refused ({str(exc).rsplit(':', 1)[-1].strip()})"
        other = f"{world.b}.van-1"
        beside = Mqtt(world.stack, other, world.secrets[other])
        beside.close()
        async with httpx.AsyncClient(timeout=DEADLINE) as http:
            metrics = (await http.get(f"http://127.0.0.1:{settings.guard_port}/metrics")).text
    finally:
        devices.remove_device(settings, pw, world.b, name, lambda _: None)
    locked = [line for line in metrics.splitlines() if line.startswith("geofence_broker_lockouts_total")]
    holds("outsider guessing a device's password", f"{burst} wrong MQTT passwords, then the right one",
          f"{wrong.count('refused')} x refused, then the right one {right}",
          f"another device of the tenant logs in; {locked[0] if locked else 'no lock-out counted'}",
          wrong.count("refused") == burst and right.startswith("refused") and bool(locked)
          and int(locked[0].split()[-1]) >= 1)
