"""The fault suite's tenants (exchanges/tenancy.py): every fault run is two tenants sharing the
stack, `faults-a` and `faults-b`, and the fuzz run is a third, `faults-fuzz`.

- `ensure_tenants`: the tenants exist in PostgreSQL (created once, kept: a tenant that had fences
  keeps their rows and events, fence/tenants.py remove_tenant).
- `Split`: which tenant each fence and each object of the workload is (alternately, by index):
  the two tenants' objects walk through the same box, so x-geo routes positions of one tenant
  to the other's fences as candidates, and x-fence's wall must refuse every one of them.
  `reference` is the ground truth per tenant: each tenant's objects against its own fences
  only (the shapely reference run once per tenant, over that tenant's updates in stream order).
- `TenantGateway`: a tenant's gateway user (`<tenant>.<name>`, deploy/rabbitmq/devices.py),
  as bench/tenant.py's `Gateway` (whose tenant is fixed to `bench`) but of any tenant; a run
  makes one per tenant (`add_gateway`) and removes them (`remove_gateway`); a run killed
  half-way leaves users the next session removes (`remove_leftover_gateways`).
- `tenant_bodies`: the stream as gateway batches, each batch of updates cut in one message
  per tenant (its objects only), published under that tenant's routing key.

Trade-off: the objects keep distinct names across the tenants (the workload's, as before) so
that an event pairing a fence with another tenant's object is told on the wire as well as in
the archive (the name says whose object it is), at the price of not also testing two tenants'
objects of the same name (tests/unit/test_tenant_wall.py and the security table do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import msgpack
import numpy as np

from bench import broker_modes as bm
from bench import tenant as tn
from bench import workload as wl
from deploy.rabbitmq import devices
from deploy.settings import ConnectionSettings, Secrets, Settings
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence import tenants
from fence.reference import EventTuple
from tests.faults.clients import Body

TENANTS = ("faults-a", "faults-b")  # a fault run's two tenants
FUZZ_TENANT = "faults-fuzz"  # the fuzz run's
RUN_GATEWAY_PREFIX = "ft"  # a fault run's id (FaultRun.run_id) and its gateways' names start with it


async def ensure_tenants(dsn: str, ids: Sequence[str] = TENANTS) -> None:
    """The tenants exist in PostgreSQL (created if missing; concurrent creators are fine)."""
    pg = await asyncpg.connect(dsn)
    try:
        for tenant in ids:
            with contextlib.suppress(tenants.TenantExists):
                await tenants.add_tenant(pg, tenant, "fault suite (tests/faults)")
    finally:
        await pg.close()


# --------------------------------------------------------------------------- the split


@dataclass(frozen=True)
class Split:
    """The tenant of each fence and each object of a workload (by index)."""

    fence_tenant: tuple[str, ...]
    object_tenant: tuple[str, ...]

    @classmethod
    def alternate(cls, fences: int, objects: int, ids: Sequence[str] = TENANTS) -> Split:
        return cls(tuple(ids[i % len(ids)] for i in range(fences)),
                   tuple(ids[i % len(ids)] for i in range(objects)))

    @classmethod
    def copies(cls, fences: int, objects: int, ids: Sequence[str] = TENANTS) -> Split:
        """Every tenant its own copy of the `fences` (a list of them, repeated per tenant, as
        `copied` makes it), the objects alternately: each object meets exactly the fences it met
        with no tenant (the same events, in all), while every fence lies over the other
        tenant's objects too (which the wall keeps out)."""
        return cls(tuple(x for x in ids for _ in range(fences)),
                   tuple(ids[i % len(ids)] for i in range(objects)))

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.fence_tenant + self.object_tenant))

    def updates_of(self, stream: wl.Stream, tenant: str) -> np.ndarray:
        """Per update of the stream, whether its object is the tenant's."""
        mine = np.array([x == tenant for x in self.object_tenant], bool)
        return mine[stream.obj]

    def reference(self, fences: Sequence[wl.Fence], stream: wl.Stream) -> list[EventTuple]:
        """The ground truth, names unqualified: each tenant's objects against its own fences."""
        out: list[EventTuple] = []
        for tenant in self.tenants:
            mask = self.updates_of(stream, tenant)
            extra = [x for x, m in zip(stream.extra, mask.tolist(), strict=True) if m] if stream.extra else []
            part = wl.Stream(stream.object_ids, stream.obj[mask], stream.lon[mask], stream.lat[mask],
                             stream.ts[mask], extra)
            mine = [f for f, x in zip(fences, self.fence_tenant, strict=True) if x == tenant]
            out += wl.reference_events(mine, part)
        return out


def copied(fences: Sequence[wl.Fence], ids: Sequence[str] = TENANTS) -> list[wl.Fence]:
    """The fences once per tenant (Split.copies' order): the same names in every tenant."""
    return [f for _ in ids for f in fences]


def tenant_bodies(stream: wl.Stream, batch: int, object_tenant: Sequence[str]) -> list[Body]:
    """Every `batch` updates of the stream as one gateway message per tenant (msgpack, the
    tenant's updates of them in stream order), keyed by the tenant; a message's range (lo, hi)
    is the batch's, its `n` the tenant's updates in it."""
    owner = np.array(object_tenant)
    out: list[Body] = []
    for c in stream.chunks(batch):
        whose = owner[stream.obj[c.start:c.start + len(c)]]
        lon, lat, ts = c.lon.tolist(), c.lat.tolist(), c.ts.tolist()
        for tenant in dict.fromkeys(whose.tolist()):
            at = np.flatnonzero(whose == tenant).tolist()
            positions = [{"id": c.ids[i], "lon": lon[i], "lat": lat[i], "ts": ts[i]} for i in at]
            out.append(Body(c.start, c.start + len(c), msgpack.packb({"positions": positions}), key=tenant,
                            n=len(at)))
    return out


# --------------------------------------------------------------------------- gateways


@dataclass(frozen=True)
class TenantGateway(tn.Gateway):
    """A gateway user of `tenant` (bench/tenant.py's Gateway is the `bench` tenant's)."""

    tenant: str = ""

    @property
    def user(self) -> str:
        return devices.user_of(self.tenant, self.name)

    @property
    def routing_key(self) -> str:
        return self.tenant


def _quiet(_: str) -> None:
    pass


def add_gateway(settings: Settings, pw: Secrets, tenant: str, name: str) -> TenantGateway:
    """A new gateway user `<tenant>.<name>` (a generated password)."""
    password = devices.add_gateway(settings, pw, tenant, name, None, _quiet)
    return TenantGateway(name, password, settings, tenant=tenant)


def remove_gateway(settings: Settings, pw: Secrets, gw: TenantGateway) -> None:
    with contextlib.suppress(devices.DeviceError):
        devices.remove_gateway(settings, pw, gw.tenant, gw.name, _quiet)


def remove_leftover_gateways(settings: Settings, pw: Secrets,
                             which: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """The gateway users runs of the suite left behind (a run killed before its clean-up),
    removed; returns them. `which`: (tenant, name prefix) pairs, by default the fault runs'
    (`RUN_GATEWAY_PREFIX` in TENANTS). Only while no such run is going on."""
    gone = []
    for tenant, prefix in which if which is not None else [(x, RUN_GATEWAY_PREFIX) for x in TENANTS]:
        for user in devices.list_devices(settings, pw, tenant, tag=t.GATEWAY_TAG):
            name = user.removeprefix(f"{tenant}.")
            if name.startswith(prefix):
                with contextlib.suppress(devices.DeviceError):
                    devices.remove_gateway(settings, pw, tenant, name, _quiet)
                    gone.append(user)
    return gone


def qualified(tenant_of: Sequence[str], names: Sequence[str]) -> list[str]:
    """Names as the pipeline has them, each qualified by its tenant."""
    return [qualify(x, n) for x, n in zip(tenant_of, names, strict=True)]


async def remove_leftover_fences(conn: ConnectionSettings) -> int:
    """The fences runs of the suite left behind (a run that could not clean up: PostgreSQL or
    the broker away at its end), removed through the fence service; returns how many. Only
    while no run is going on. They would otherwise weigh on every later run (a worker's
    start reads the fences it owns)."""
    pg = await asyncpg.connect(conn["postgres"]["dsn"])
    try:
        ids = [r["id"] for r in await pg.fetch(
            "SELECT id FROM fence WHERE deleted_at IS NULL AND tenant = ANY($1::text[]) AND id LIKE '%:b%'",
            list(TENANTS))]
    finally:
        await pg.close()
    if ids:
        async with bm.fence_manager(conn, Settings.from_env()) as m:
            await bm.remove_stored(m, ids)
    return len(ids)
