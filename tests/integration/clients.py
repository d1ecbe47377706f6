"""Clients and helpers the integration tests share: aio-pika publish / take with
deadlines, the management API, the `geofence` command, a tenant's credentials (devices over
MQTT with paho, gateways and applications over AMQP), Auth emulator accounts."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import queue
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aio_pika
import paho.mqtt.client as mqtt
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from paho.mqtt.enums import CallbackAPIVersion

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.login_guard import client_id_for
from exchanges.tenancy import qualify
from fence.service import OPERATOR_CLAIM, TENANT_HEADER

DEADLINE = 20.0  # seconds, for any single wait
POLL = 0.1


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


def close_connection(stack: ConnectionSettings, connection: str) -> None:
    """The broker closes a client's connection (management API, as the administrator)."""
    auth = base64.b64encode(f"{t.ADMIN_USER}:{stack['mqtt']['password']}".encode()).decode()
    request = urllib.request.Request(stack["management"]["url"] + f"api/connections/{q(connection)}",
                                     method="DELETE", headers={"Authorization": f"Basic {auth}",
                                                               "X-Reason": "test: a broker-side close"})
    with urllib.request.urlopen(request, timeout=DEADLINE):
        pass


def q(name: str) -> str:
    return quote(name, safe="")


async def poll(check: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(POLL)


@dataclass(frozen=True)
class Login:
    """A tenant's own RabbitMQ user, `<tenant>.<name>`: a gateway's (gf-ingress) or an
    application's (gf-fences), made by `geofence gateway|app add NAME --tenant T`."""

    tenant: str
    name: str
    password: str

    @property
    def user(self) -> str:
        return f"{self.tenant}.{self.name}"


def login_url(stack: ConnectionSettings, login: Login, vhost: str) -> str:
    """The AMQP URL of `vhost` as `login` (the stack's host and port)."""
    base = urlsplit(stack["amqp"][vhost])
    netloc = f"{quote(login.user, safe='')}:{quote(login.password, safe='')}@{base.hostname}:{base.port}"
    return urlunsplit((base.scheme, netloc, base.path, base.query, base.fragment))


def url(stack: ConnectionSettings, user: str | Login, vhost: str) -> str:
    """As the administrator, a sidecar user (by name) or a tenant's `Login`."""
    if isinstance(user, Login):
        return login_url(stack, user, vhost)
    return stack["amqp"][vhost] if user == t.ADMIN_USER else stack["users"][user][vhost]


async def connect(stack: ConnectionSettings, user: str | Login, vhost: str) -> AbstractRobustConnection:
    return await aio_pika.connect_robust(url(stack, user, vhost), timeout=DEADLINE)


async def publish(stack: ConnectionSettings, user: str | Login, vhost: str, exchange: str,
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


async def take(stack: ConnectionSettings, user: str | Login, vhost: str, queue_name: str,
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
    """A tenant's device: RabbitMQ user `<tenant>.<object_id>` (its MQTT login's user part and
    its client id), publishing `positions/<tenant>/<object_id>`. Without a tenant, a presence
    sensor (the platform's): user and client id its own id."""

    object_id: str
    password: str
    tenant: str = ""

    @property
    def user(self) -> str:
        return f"{self.tenant}.{self.object_id}" if self.tenant else self.object_id

    @property
    def key(self) -> str:
        """Its id inside the pipeline, `<tenant>:<object_id>` (exchanges/tenancy.py)."""
        return qualify(self.tenant, self.object_id)

    @property
    def topic(self) -> str:
        return f"{t.POSITIONS_TOPIC_PREFIX}/{self.tenant}/{self.object_id}"


def add_device(tenant: str) -> Device:
    """A new device user of `tenant` (`geofence device add --tenant`, password on stdin)."""
    made = Device(f"t-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex, tenant)
    done = geofence("device", "add", made.object_id, "--tenant", tenant, "--password-stdin",
                    stdin=made.password + "\n")
    assert done.returncode == 0, done.stderr
    assert made.password not in done.stdout + done.stderr
    return made


def add_login(kind: str, tenant: str) -> Login:
    """A tenant's gateway or application user (`geofence gateway|app add`), password on stdin."""
    made = Login(tenant, f"{kind}-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex)
    done = geofence(kind, "add", made.name, "--tenant", tenant, "--password-stdin",
                    stdin=made.password + "\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert made.password not in done.stdout + done.stderr
    return made


def remove_login(stack: ConnectionSettings, kind: str, login: Login) -> None:
    """`geofence gateway|app remove`, if the user is still there."""
    if api(stack, f"api/users/{q(login.user)}") is not None:
        removed = geofence(kind, "remove", login.name, "--tenant", login.tenant)
        assert removed.returncode == 0, removed.stderr


class MqttDevice:
    """A paho client logged in as a device (no automatic reconnect: a refusal shows)."""

    def __init__(self, stack: ConnectionSettings, dev: Device, clean_session: bool = True,
                 admin: bool = False) -> None:
        """`admin`: logged in as the stack's administrator (may publish and subscribe to any
        topic), `dev` ignored."""
        cfg = stack["mqtt"]
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        admin_user = cfg["username"].split(":", 1)[1]
        client_id = client_id_for(admin_user, f"admin-{uuid.uuid4().hex[:12]}") if admin else dev.user
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=clean_session, protocol=mqtt.MQTTv311,
                                  reconnect_on_failure=False)
        if admin:
            self.client.username_pw_set(f"{cfg['ingress_vhost']}:{admin_user}",
                                        cfg["password"])
        else:
            self.client.username_pw_set(f"{cfg['ingress_vhost']}:{dev.user}", dev.password)
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


# --------------------------------------------------------------------------- Firebase accounts


@dataclass(frozen=True)
class Account:
    """A user of the stack's Auth emulator and its ID token; `tenant`: the one it names with
    the X-Geofence-Tenant header (None: none named, the API picks its only tenant)."""

    uid: str
    token: str
    tenant: str | None = None

    @property
    def auth(self) -> dict[str, str]:
        out = {"Authorization": f"Bearer {self.token}"}
        if self.tenant is not None:
            out[TENANT_HEADER] = self.tenant
        return out

    def acting_in(self, tenant: str | None) -> Account:
        """The same user naming `tenant` in its requests."""
        return Account(self.uid, self.token, tenant)


Firebase = tuple[str, int, str]  # the Auth emulator's host, port and project


def account(firebase: Firebase) -> Account:
    host, port, project = firebase
    uid, token = fe.sign_up(host, port, project, f"{uuid.uuid4().hex[:12]}@example.org", uuid.uuid4().hex)
    return Account(uid, token)


def operator_account(firebase: Firebase) -> Account:
    """A new user whose token carries the geofence_operator claim (set, then signed in again)."""
    host, port, project = firebase
    email, password = f"{uuid.uuid4().hex[:12]}@example.org", uuid.uuid4().hex
    uid, _ = fe.sign_up(host, port, project, email, password)
    fe.set_claims(host, port, project, uid, {OPERATOR_CLAIM: True})
    return Account(uid, fe.sign_in(host, port, project, email, password))


def add_member(tenant: str, uid: str, role: str) -> None:
    """`uid` a member of `tenant` with `role` (`geofence tenant member add`; also a change)."""
    done = geofence("tenant", "member", "add", tenant, uid, "--role", role)
    assert done.returncode == 0, done.stderr


def member(firebase: Firebase, tenant: str, role: str = "editor") -> Account:
    """A new user, a member of `tenant` with `role`."""
    made = account(firebase)
    add_member(tenant, made.uid, role)
    return made


async def moving(stack: ConnectionSettings, tenant: str, object_id: str, stop: asyncio.Event,
                 lat: float = 47.02) -> list[tuple[float, float]]:
    """Positions of `tenant`'s object (`positions.<tenant>.<object_id>`, as the administrator),
    a step east every 0.2 s at `lat`, until `stop` (outside every fence); the places sent."""
    sent = []
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        k = 0
        while not stop.is_set():
            lon = 9.40 + 0.0001 * k
            body = json.dumps({"lon": lon, "lat": lat, "ts": time.time()}).encode()
            await ex.publish(aio_pika.Message(body), f"{t.POSITIONS_TOPIC_PREFIX}.{tenant}.{object_id}")
            sent.append((lon, lat))
            k += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    return sent
