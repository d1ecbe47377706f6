"""The benchmarks' tenant: what every benchmark on the running stack shares since names are
qualified inside the pipeline (exchanges/tenancy.py).

- `TENANT` ("bench") owns every fence, subscription and object a benchmark puts on the stack;
  `ensure_tenant` creates it in PostgreSQL (fence.id and roam_subscription.id carry it, a
  foreign key to tenant(id)), once, whoever runs first (idempotent).
- `qualified(name)`: `bench:<name>`, what PostgreSQL, the control messages and the events'
  qualified pair hold; what a device or gateway publishes stays the bare name (x-ingress
  qualifies it by the tenant of the routing key).
- `run_gateway()`: a gateway user of the tenant for one run (`bench.gw-<random>`, made by
  deploy/rabbitmq/devices.add_gateway, removed at the end however the run ends): it publishes
  batches to `ingress.gateway` with the tenant as the routing key, and MQTT positions
  `positions/bench/<id>` (any client id). The shared user `gateway` and the fanout
  `ingress.batches` are retired.
- `event_tuple(wire)`: an event of fence.event-batches (JSON: `tenant`, unqualified `fence_id`
  and `object_id`) as the reference's tuple, the ids qualified again
  (exchanges.fence_events.qualified_ids), so the comparison with the shapely reference stays
  exact; None for another tenant's event.

Trade-off: a gateway user per run (two management API calls in, two out) rather than one kept
between runs: no password to store anywhere, and nothing of a run outlives it but a user a
killed run could not remove (`bench.gw-*`, tagged gf-gateway: `geofence gateway list --tenant
bench` shows them, `geofence gateway remove` takes them away).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from urllib.parse import quote

import asyncpg

from deploy.rabbitmq import devices
from deploy.settings import Settings, amqp_url, load_secrets
from exchanges import topology as t
from exchanges.fence_events import qualified_ids
from exchanges.tenancy import qualify
from fence import reference, tenants

TENANT = "bench"
TENANT_NAME = "Benchmarks (bench/)"

EventTuple = reference.EventTuple  # (event, fence_id, object_id, ts, reason), ids qualified


def qualified(name: str) -> str:
    """`bench:<name>`: a fence's, an object's or a subscription's id inside the pipeline."""
    return qualify(TENANT, name)


async def ensure_tenant(conn: asyncpg.Connection | str) -> None:
    """The tenant exists in PostgreSQL (created if it does not): a connection or a DSN."""
    pg = await asyncpg.connect(conn) if isinstance(conn, str) else conn
    try:
        with contextlib.suppress(tenants.TenantExists):
            await tenants.add_tenant(pg, TENANT, TENANT_NAME)
    finally:
        if isinstance(conn, str):
            await pg.close()


# --------------------------------------------------------------------------- the run's gateway


# The runs' clients over TLS (AMQPS, MQTTS, the stack's CA) instead of the plain loopback
# listeners: `bench.e2e --tls`, to measure what TLS costs a gateway or a device (issue 37).
USE_TLS = [False]


@dataclass(frozen=True)
class Gateway:
    """A gateway user of the tenant: its AMQP URL (vhost gf-ingress) and MQTT login."""

    name: str
    password: str
    settings: Settings
    tls: bool = False

    @property
    def user(self) -> str:
        return f"{TENANT}.{self.name}"

    @property
    def amqp_url(self) -> str:
        if not self.tls:
            return amqp_url(self.settings, self.password, t.INGRESS_VHOST, self.user)
        s = self.settings
        who = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return (f"amqps://{who}@{s.host}:{s.amqps_port}/{quote(t.INGRESS_VHOST, safe='')}"
                f"?cafile={quote(str(s.tls_ca_file), safe='')}")

    @property
    def routing_key(self) -> str:
        """Its batches' routing key on ingress.gateway: the tenant."""
        return TENANT

    def mqtt(self) -> dict[str, object]:
        """host, port, username (`gf-ingress:<user>`), password: a paho client's login."""
        login: dict[str, object] = {"host": self.settings.host, "port": self.settings.mqtt_port,
                                    "username": devices.mqtt_login(self.user), "password": self.password}
        if self.tls:  # a publisher calls tls_set(ca_certs=...)
            login.update(port=self.settings.mqtts_port, ca=str(self.settings.tls_ca_file))
        return login


def _quiet(_: str) -> None:
    pass


@contextlib.contextmanager
def gateway(settings: Settings | None = None) -> Iterator[Gateway]:
    """A new gateway user of the tenant for the duration of the block, removed after it."""
    settings = settings or Settings.from_env()
    pw = load_secrets(settings)
    name = f"gw-{uuid.uuid4().hex[:10]}"
    password = devices.add_gateway(settings, pw, TENANT, name, None, _quiet)
    try:
        yield Gateway(name, password, settings, USE_TLS[0])
    finally:
        with contextlib.suppress(devices.DeviceError):
            devices.remove_gateway(settings, pw, TENANT, name, _quiet)


@contextlib.asynccontextmanager
async def run_gateway(given: Gateway | None = None, settings: Settings | None = None
                      ) -> AsyncIterator[Gateway]:
    """`given`, or a gateway of its own for the block (made and removed off the event loop)."""
    if given is not None:
        yield given
        return
    cm = gateway(settings)
    gw = await asyncio.to_thread(cm.__enter__)
    try:
        yield gw
    finally:
        await asyncio.to_thread(cm.__exit__, None, None, None)


# --------------------------------------------------------------------------- events


def event_tuple(wire: object) -> EventTuple | None:
    """An event of fence.event-batches as the reference's tuple, its fence and object qualified
    again by its tenant; None unless it is one of the tenant's (anything else on the exchange,
    another tenant's event or what a test of the archiver publishes there, is passed over)."""
    if not isinstance(wire, dict) or wire.get("tenant") != TENANT:
        return None
    fence_id, object_id = qualified_ids(wire)
    if not isinstance(fence_id, str) or not isinstance(object_id, str):
        return None
    try:
        return (wire["event"], fence_id, object_id, wire["ts"], wire["reason"])
    except KeyError:
        return None


def run_events(batch: object, prefix: str) -> list[EventTuple]:
    """The tenant's events of one batch (a JSON array) whose fence and object are both a run's
    (their names start with `prefix`: `bench:<prefix>...` qualified), as reference tuples."""
    return [e for e, _ in run_events_with_ids(batch, prefix)]


def run_events_with_ids(batch: object, prefix: str) -> list[tuple[EventTuple, str | None]]:
    """`run_events` with each event's `event_id` (None where a body has none)."""
    if not isinstance(batch, list):
        return []
    qualified_prefix = qualified(prefix)
    out = []
    for wire in batch:
        e = event_tuple(wire)
        if e is not None and e[1].startswith(qualified_prefix) and e[2].startswith(qualified_prefix):
            event_id = wire.get("event_id") if isinstance(wire, dict) else None
            out.append((e, event_id if isinstance(event_id, str) else None))
    return out
