"""The attack table's world (issue 36): two tenants on the live stack, a victim `A` whose vans
(with their drivers' names in their fields) sit in its depot fence, and an attacker `B` with an
editor, a viewer, its own devices (one named like A's van), gateway and application; an
outsider signed in to no tenant; the operator. Every attack runs against the real services
(RabbitMQ with its MQTT plugin, PostgreSQL, the Firebase Auth emulator, the API, the
sidecars), and the table of what was tried, what came back and what the legitimate request
beside it got is printed at the end, like the fault suite's."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aio_pika
import asyncpg
import httpx
import orjson
import pytest

from deploy import firebase_emulator as fe
from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence import tenants
from tests.security import table

SECURITY_DIR = Path(__file__).parent
DEADLINE = 30.0
CENTER = (8.5417, 47.3769)  # the depot: Zurich (a region like any other)
HALF = 0.004  # the depot's half side, degrees
VANS = ("van-1", "van-2", "van-3")
DRIVERS = {v: f"Dana Driver-{v}" for v in VANS}  # what a leak would show


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SECURITY_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if table.ROWS:
        terminalreporter.section(
            "attack table: each row refused, nothing revealed, the legitimate request beside it answered"
        )
        for line in table.table():
            terminalreporter.write_line(line)


@dataclass(frozen=True)
class Member:
    """A Firebase user (the Auth emulator) and the headers of a request as them."""

    uid: str
    token: str

    def headers(self, tenant: str | None = None) -> dict[str, str]:
        out = {"Authorization": f"Bearer {self.token}"}
        if tenant is not None:
            out["X-Geofence-Tenant"] = tenant
        return out


@dataclass
class World:
    stack: ConnectionSettings
    http: httpx.AsyncClient
    a: str  # the victim tenant
    b: str  # the attacker's tenant
    a_admin: Member
    b_editor: Member
    b_viewer: Member
    outsider: Member  # signed in, member of no tenant
    operator: Member
    secrets: dict[str, str] = field(default_factory=dict)  # RabbitMQ user -> password
    b_admin: Member | None = None  # the attacker's tenant's admin (webhooks are an admin's)

    def amqp(self, user: str, vhost: str) -> str:
        """The AMQP URL of one of the world's RabbitMQ users."""
        admin = urlsplit(self.stack["amqp"]["/"])
        return (
            f"amqp://{quote(user, safe='')}:{quote(self.secrets[user], safe='')}@{admin.hostname}:"
            f"{admin.port}/{quote(vhost, safe='')}"
        )

    def bbox(self, pad: float = 0.02) -> str:
        x, y = CENTER
        return f"{x - pad},{y - pad},{x + pad},{y + pad}"


def depot(fence_id: str = "depot", half: float = HALF, at: tuple[float, float] = CENTER) -> dict[str, Any]:
    x, y = at
    ring = [
        [x - half, y - half],
        [x + half, y - half],
        [x + half, y + half],
        [x - half, y + half],
        [x - half, y - half],
    ]
    return {
        "type": "Feature",
        "id": fence_id,
        "properties": {"name": fence_id, "timeout_s": 3600},
        "geometry": {"type": "Polygon", "coordinates": [ring]},
    }


async def until(check: Any, what: str, deadline: float = DEADLINE) -> Any:
    """Poll `check()` (a coroutine function) until it returns something truthy."""
    end = time.monotonic() + deadline
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(0.2)


async def publish_batch(world: World, gateway: str, tenant_key: str, positions: list[dict[str, Any]]) -> None:
    """A gateway's batch on ingress.gateway under `tenant_key`, confirmed by the broker."""
    async with await aio_pika.connect(world.amqp(gateway, t.INGRESS_VHOST), timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        x = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
        await x.publish(
            aio_pika.Message(
                orjson.dumps({"positions": positions}), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            ),
            routing_key=tenant_key,
            timeout=DEADLINE,
        )


def vans_at(now: float, dx: float = 0.0) -> list[dict[str, Any]]:
    x, y = CENTER
    return [
        {
            "id": v,
            "lon": x + dx + 0.0005 * k,
            "lat": y + 0.0005 * k,
            "ts": now,
            "type": "delivery-van",
            "driver": DRIVERS[v],
        }
        for k, v in enumerate(VANS)
    ]


@pytest.fixture(scope="session")
async def world(stack: ConnectionSettings) -> AsyncIterator[World]:
    run = uuid.uuid4().hex[:8]
    a, b = f"sec-a-{run}", f"sec-b-{run}"
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    project = stack["firebase"]["project"]
    if not fe.running(host, int(port)):
        pytest.fail("the Firebase Auth emulator is not running: `geofence up` starts it", pytrace=False)

    def user(claims: dict[str, Any] | None = None) -> Member:
        email, password = f"{uuid.uuid4().hex[:12]}@example.org", uuid.uuid4().hex
        uid, token = fe.sign_up(host, int(port), project, email, password)
        if claims:
            fe.set_claims(host, int(port), project, uid, claims)
            token = fe.sign_in(host, int(port), project, email, password)
        return Member(uid, token)

    a_admin, b_editor, b_viewer, outsider, b_admin = user(), user(), user(), user(), user()
    operator = user({"geofence_operator": True})
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await tenants.add_tenant(pg, a, "the victim (security suite)")
        await tenants.add_tenant(pg, b, "the attacker (security suite)")
        await tenants.put_member(pg, a, a_admin.uid, "admin")
        await tenants.put_member(pg, b, b_editor.uid, "editor")
        await tenants.put_member(pg, b, b_viewer.uid, "viewer")
        await tenants.put_member(pg, b, b_admin.uid, "admin")
    finally:
        await pg.close()
    settings = Settings.from_env()
    pw = load_secrets(settings)
    secrets: dict[str, str] = {}
    quiet = lambda _: None  # noqa: E731
    made: list[tuple[Any, str, str]] = []
    for tenant in (a, b):
        secrets[f"{tenant}.gw"] = devices.add_gateway(settings, pw, tenant, "gw", None, quiet)
        made.append((devices.remove_gateway, tenant, "gw"))
        secrets[f"{tenant}.app"] = devices.add_app(settings, pw, tenant, "app", None, quiet)
        made.append((devices.remove_app, tenant, "app"))
        secrets[f"{tenant}.van-1"] = devices.add(settings, pw, tenant, "van-1", None, quiet)
        made.append((devices.remove_device, tenant, "van-1"))
    assert stack["api"] is not None, "the stack runs no API"
    async with httpx.AsyncClient(base_url=stack["api"], timeout=DEADLINE) as http:
        w = World(stack, http, a, b, a_admin, b_editor, b_viewer, outsider, operator, secrets, b_admin)
        r = await http.post("/fences", json=depot(), headers=a_admin.headers())
        assert r.status_code == 201, r.text
        await publish_batch(w, f"{a}.gw", a, vans_at(time.time()))

        async def a_sees_its_vans() -> bool:
            got = await http.get("/objects/within", params={"fence_id": "depot"}, headers=a_admin.headers())
            return got.status_code == 200 and {o["id"] for o in got.json()["objects"]} >= set(VANS)

        await until(a_sees_its_vans, "the victim's vans in its depot (x-geo)")

        async def inside() -> bool:
            got = await http.get("/fences/depot/objects", headers=a_admin.headers())
            return got.status_code == 200 and {o["object_id"] for o in got.json()["objects"]} >= set(VANS)

        await until(inside, "the victim's vans inside its depot (x-fence)")
        try:
            yield w
        finally:
            for tenant, member in ((a, a_admin), (b, b_editor)):
                listed = await http.get("/fences", headers=member.headers(tenant))
                for f in listed.json().get("features", []) if listed.status_code == 200 else []:
                    await http.delete(f"/fences/{quote(f['id'], safe='')}", headers=member.headers(tenant))
            for remove, tenant, name in made:
                with contextlib.suppress(devices.DeviceError):  # a test removed it already
                    remove(settings, pw, tenant, name, quiet)


__all__ = [
    "CENTER",
    "DRIVERS",
    "VANS",
    "Member",
    "World",
    "depot",
    "publish_batch",
    "qualify",
    "until",
    "vans_at",
]
