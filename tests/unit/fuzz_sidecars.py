"""The sidecars' batch handlers without a broker, for the fuzz tests (tests/unit/test_fuzz_*.py):
stand-ins for aio-pika's messages and exchanges, publishing captured in memory, and an
x-ingress, x-geo and x-fence sidecar each set up over two regions and two workers, with one
fence covering the world: f-all (the platform's own, no tenant) unless a test names another
(`tenant_fence`: a tenant's, which sees that tenant's objects only, exchanges/tenancy.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast
from unittest import mock

import numpy as np
from aio_pika.abc import AbstractIncomingMessage
from shapely.geometry import box

from exchanges import shell
from exchanges.batch import RegionBatch, pack, unpack
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.hash_ring import HashRing
from exchanges.tenancy import qualify
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo import sidecar as geo_sidecar_module
from exchanges.x_geo.core import XGeo
from exchanges.x_geo.sidecar import GeoSidecar
from fence.x_fence import sidecar as fence_sidecar_module
from fence.x_fence.sidecar import FenceSidecar
from ingress.core import XIngress
from ingress.positions import TS_MIN
from ingress.sidecar import IngressSidecar
from tests.unit.fuzz_contract import (
    Pos,
    assert_reason,
    positions_of,
)


@dataclass
class Msg:
    """What the handlers read of an aio-pika incoming message."""

    body: bytes
    routing_key: str | None = ""
    content_type: str | None = None
    exchange: str | None = "amq.topic"  # ("": x-ingress's own hand-ons, ingress/partition_split.py)
    headers: dict[str, Any] | None = None
    message_id: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None

    async def ack(self, multiple: bool = False) -> None:
        """Settled by a pipeline's tail (exchanges/shell/pipeline.py): nothing to do here."""


@dataclass(frozen=True)
class Exchange:
    name: str


@contextlib.contextmanager
def captured() -> Iterator[list[shell.Out]]:
    """shell.publish_all into a list (every publish confirmed at once)."""
    outs: list[shell.Out] = []

    async def publish_all(o: Sequence[shell.Out | shell.Plains], counters: shell.Counters,
                          deadline: float | None = None, retry: bool = True) -> None:
        outs.extend(m for x in o for m in (x.outs() if isinstance(x, shell.Plains) else [x]))

    # the roles' calls (shell.publish_all) and a pipeline's (shell.send: publish.publish_all)
    with mock.patch.object(shell, "publish_all", publish_all), \
            mock.patch.object(shell.publish, "publish_all", publish_all):
        yield outs


async def drained(sc: Any, handled: Awaitable[None]) -> None:
    """A handler's call, then its pipeline's tails (a pipelined sidecar's batch is settled there)."""
    await handled
    pipeline = getattr(sc, "pipeline", None)
    if pipeline is not None:
        await pipeline.drain()


def to(o: shell.Out, exchange: Exchange) -> bool:
    return cast(Any, o.exchange) is exchange


def incoming(messages: Sequence[Msg]) -> list[AbstractIncomingMessage]:
    return cast(list[AbstractIncomingMessage], list(messages))


def numbered(o: shell.Out) -> int:
    assert o.headers is not None
    return cast(int, o.headers["n"])


def dead_letters(outs: Sequence[shell.Out], dlx: Exchange) -> list[shell.Out]:
    """The dead-lettered messages, checked: a reason (not an internal error), the source."""
    dead = [o for o in outs if to(o, dlx)]
    for o in dead:
        assert o.headers is not None
        assert_reason(o.headers["x-geofence-reason"])
        assert not str(o.headers["x-geofence-reason"]).startswith("internal error"), o.headers
        assert o.headers["x-geofence-source"]
    return dead


SIDECAR = shell.SidecarConfig("test", "", "amqp://fuzz@localhost/", "postgresql://fuzz@localhost/",
                              ("a", "b"), ("w0", "w1"))
WORLDMAP = Worldmap.over_area(["a", "b"], version=1)
WORKERS = ("w0", "w1")
RING = HashRing(list(WORKERS))  # immutable; building one costs ~10 ms (its virtual nodes)


def the_ring(workers: Sequence[str]) -> HashRing:
    assert tuple(workers) == WORKERS
    return RING


def full_binding(fence_id: str) -> FenceBinding:
    """A binding of every Hilbert index (every position is a candidate of the fence)."""
    return FenceBinding(fence_id, 1, np.array([[0, (1 << 52) - 1]], np.uint64), np.array([True]))


def fence_near_0_0(fence_id: str) -> FenceDef:
    return FenceDef(fence_id=fence_id, version=1, geometry=box(-20.0, -10.0, 20.0, 10.0), timeout_s=300.0,
                    name="everything near 0,0")


FULL = full_binding("f-all")
FENCE = fence_near_0_0("f-all")


def tenant_fence(tenant: str) -> tuple[FenceBinding, FenceDef]:
    """f-all of `tenant` (`<tenant>:f-all`): its binding for x-geo, its definition for x-fence."""
    fence_id = qualify(tenant, "f-all")
    return full_binding(fence_id), fence_near_0_0(fence_id)


def ingress_sidecar() -> tuple[IngressSidecar, Exchange, dict[str, Exchange]]:
    sc = IngressSidecar(SIDECAR, XIngress(WORLDMAP))
    dlx = Exchange("dead-letters")
    sc.dlx = cast(Any, dlx)
    sc.follow = cast(Any, Exchange("fence.follow"))
    regions = {r: Exchange(f"x-geo.in@{r}") for r in WORLDMAP.regions}
    sc.geo_in = cast(Any, regions)
    return sc, dlx, regions


def forwarded(outs: Sequence[shell.Out], regions: dict[str, Exchange]) -> list[Pos]:
    """What x-ingress sent on, read the way x-geo reads it, routed and packed the way x-geo
    does, and read the way x-fence reads that: every hop must understand what it gets."""
    got: list[Pos] = []
    for o in outs:
        if any(to(o, r) for r in regions.values()):
            rb = RegionBatch.from_wire(unpack(o.body))
            geo = XGeo("a", list(WORKERS), RING)
            geo.validate(rb.batch)
            geo.add_binding(FULL)
            for wb in geo.route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced).values():
                WorkerBatch.from_wire(unpack(pack("positions", parts=[wb.to_wire()]))["parts"][0])
            got += positions_of(rb.batch.take(np.flatnonzero(~rb.notice)))
    return got


def geo_sidecar(binding: FenceBinding = FULL) -> tuple[GeoSidecar, Exchange, Exchange]:
    with mock.patch.object(geo_sidecar_module, "HashRing", the_ring):
        sc = GeoSidecar(dataclasses.replace(SIDECAR, role="x-geo", instance="a"))
    sc.core.add_binding(binding)
    dlx, fence_in = Exchange("dead-letters"), Exchange("x-fence.in")
    sc.dlx, sc.fence_in = cast(Any, dlx), cast(Any, fence_in)
    return sc, dlx, fence_in


def fence_sidecar(worker: str = "w0", fence: FenceDef = FENCE) -> tuple[FenceSidecar, Exchange, Exchange]:
    config = dataclasses.replace(SIDECAR, role="x-fence", instance=worker)
    if hasattr(config, "persistence"):  # x-fence's snapshot and journal: not here
        config = dataclasses.replace(config, persistence=False)
    with mock.patch.object(fence_sidecar_module, "HashRing", the_ring):
        sc = FenceSidecar(config)
    sc.core.define(fence, TS_MIN)
    dlx, events = Exchange("dead-letters"), Exchange("fence.events")
    sc.dlx, sc.events = cast(Any, dlx), cast(Any, events)
    sc.event_batches = cast(Any, Exchange("fence.event-batches"))
    sc.tenant_batches = cast(Any, Exchange("fence.tenant-batches"))  # a tenant's events, by its key
    return sc, dlx, events
