"""The tenant wall in the cores (exchanges/tenancy.py): two tenants' fences and objects in one
area, with one object name used by both, through x-ingress, x-geo and x-fence (the core
pipeline of bench/workload.py). Every event pairs a fence with an object of its own tenant,
and the events are exactly the shapely reference computed tenant by tenant: bands, filters,
dwell and CROSS, whose per-candidate columns (interior flags, versions, previous positions)
must stay lined up with the candidates the wall sets aside."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from shapely.geometry import box

import hilbert_c as hk
from bench import workload as wl
from exchanges import shell
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_options import filters
from exchanges.tenancy import qualify, split, tenant_of
from exchanges.x_geo.core import XGeo
from fence.x_fence.core import XFence
from tests.unit.fuzz_sidecars import fence_sidecar
from tests.unit.test_core_fast_paths import OneWorker, feed, positions
from tests.unit.test_core_pipeline import BOX, run, split_in_box

TENANTS = ("a", "b")


def two_tenants(fences: list[wl.Fence], stream: wl.Stream) -> tuple[list[wl.Fence], wl.Stream]:
    """Every other fence is tenant b's, the rest a's; objects 2k and 2k+1 are a's and b's
    object of one name, o<k> (so the two tenants use the same ids without meeting)."""
    owned = [dataclasses.replace(f, fence_id=qualify(TENANTS[i % 2], f.fence_id))
             for i, f in enumerate(fences)]
    names = [qualify(TENANTS[i % 2], f"o{i // 2}") for i in range(len(stream.object_ids))]
    return owned, dataclasses.replace(stream, object_ids=names)


def per_tenant_reference(fences: list[wl.Fence], stream: wl.Stream,
                         region: npt.NDArray[np.int64] | None = None) -> list[wl.EventTuple]:
    """The reference of each tenant's objects against its own fences, together (`region`:
    each position's, for CROSS)."""
    out: list[wl.EventTuple] = []
    for tenant in TENANTS:
        mine = [f for f in fences if tenant_of(f.fence_id) == tenant]
        rows = np.flatnonzero(np.array([tenant_of(stream.object_ids[o]) == tenant
                                        for o in stream.obj.tolist()]))
        part = dataclasses.replace(stream, obj=stream.obj[rows], lon=stream.lon[rows], lat=stream.lat[rows],
                                   ts=stream.ts[rows],
                                   extra=[stream.extra[i] for i in rows.tolist()] if stream.extra else [])
        out += wl.reference_events(mine, part, region=None if region is None else region[rows])
    return out


@pytest.fixture(scope="module")
def shared_area() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    where = [(), filters.parse([["speed", "<", 40]])]
    fences = [dataclasses.replace(f, hysteresis_m=float([0, 0, 20][i % 3]), where=where[i % 2],
                                  dwell_s=float([0, 0, 0, 5][i % 4]))
              for i, f in enumerate(wl.make_fences(40, seed=4, box=BOX, radius_m=(120.0, 300.0)))]
    walk = wl.random_walk(200, 6_000, seed=4, box=BOX)
    rng = np.random.default_rng(13)
    walk = dataclasses.replace(walk, extra=[{"speed": float(v)} for v in rng.uniform(0.0, 60.0, len(walk))])
    fences, stream = two_tenants(fences, walk)
    return fences, stream, per_tenant_reference(fences, stream)


@pytest.mark.parametrize("batch", [200, 73, 1_000])
def test_each_tenants_objects_meet_its_own_fences_only(shared_area, batch: int) -> None:  # type: ignore[no-untyped-def]
    fences, stream, reference = shared_area
    got = run(fences, stream, batch)
    assert len(reference) > 300  # both tenants' objects really cross their fences
    assert {tenant_of(e[1]) for e in got} == set(TENANTS)
    assert all(tenant_of(e[1]) == tenant_of(e[2]) for e in got), "an event crossed tenants"
    assert wl.compare(got, reference) == []


def test_without_the_wall_the_tenants_would_meet(shared_area) -> None:  # type: ignore[no-untyped-def]
    """What the wall keeps out: the same positions against every fence give events pairing
    a fence with the other tenant's objects (so the test above could fail)."""
    fences, stream, reference = shared_area
    everyone = wl.reference_events(fences, stream)
    crossing = [e for e in everyone if tenant_of(e[1]) != tenant_of(e[2])]
    assert len(crossing) > 100
    assert Counter(e for e in everyone if tenant_of(e[1]) == tenant_of(e[2])) == Counter(reference)


def test_one_name_in_two_tenants_is_two_objects(shared_area) -> None:  # type: ignore[no-untyped-def]
    fences, stream, _ = shared_area
    got = run(fences, stream, 200)
    names = Counter(split(e[2])[1] for e in got)
    both = {n for n in names if {tenant_of(e[2]) for e in got if split(e[2])[1] == n} == set(TENANTS)}
    assert both, "some name has events in both tenants"


@pytest.fixture(scope="module")
def crossing_tenants() -> tuple[list[wl.Fence], wl.Stream, list[wl.EventTuple]]:
    """Small fences detecting CROSS and sparse walkers (120 m a step), two tenants, two regions."""
    fences = [dataclasses.replace(f, cross=True)
              for f in wl.make_fences(60, seed=6, box=BOX, radius_m=(20.0, 60.0))]
    walk = wl.random_walk(200, 8_000, seed=6, box=BOX, step_m=120.0)
    fences, stream = two_tenants(fences, walk)
    x, y = hk.lonlat_to_grid(stream.lon, stream.lat, INDEX_BITS)
    region = split_in_box().region_index(hk.encode_many(x, y, INDEX_BITS)).astype(np.int64)
    return fences, stream, per_tenant_reference(fences, stream, region)


@pytest.mark.parametrize("batch", [200, 1_000])
def test_cross_sees_its_own_tenant_only(crossing_tenants, batch: int) -> None:  # type: ignore[no-untyped-def]
    fences, stream, reference = crossing_tenants
    got = run(fences, stream, batch)
    assert sum(e[0] == "cross" for e in reference) > 50
    assert all(tenant_of(e[1]) == tenant_of(e[2]) for e in got), "an event crossed tenants"
    assert wl.compare(got, reference) == []


# --------------------------------------------------------------------------- shared presence


HIVE = box(9.500, 47.100, 9.510, 47.110)
INSIDE, OUTSIDE = (9.505, 47.105), (9.520, 47.105)


def shared_pipeline(counts_from: tuple[str, ...]) -> tuple[XGeo, XFence]:
    """One fence of tenant v (a venue's hive) counting the objects of `counts_from`."""
    geo, fence = XGeo("a", ["w0"], OneWorker()), XFence("w0")
    cov = hk.cover(HIVE, 21).to_bits(INDEX_BITS)
    geo.add_binding(FenceBinding("v:hive", 1, cov.ranges, cov.interior))
    fence.define(FenceDef(fence_id="v:hive", version=1, geometry=HIVE, timeout_s=600.0,
                          counts_from=counts_from), 0.0)
    return geo, fence


def test_a_fence_counts_the_objects_of_the_tenants_it_counts_from_only() -> None:
    geo, fence = shared_pipeline(("p",))
    points = [(o, *INSIDE, 1.0) for o in ("v:own", "p:phone", "q:stranger", "bare")]
    got = {(e[0], e[2]) for e in feed(geo, fence, points)}
    assert got == {("enter", "v:own"), ("enter", "p:phone")}
    assert {(e[0], e[2]) for e in feed(geo, fence, [(o, *OUTSIDE, 2.0) for o in ("v:own", "p:phone")])} == {
        ("leave", "v:own"), ("leave", "p:phone")}
    geo, fence = shared_pipeline(())  # without counts_from the wall holds for everyone
    assert {e[2] for e in feed(geo, fence, points)} == {"v:own"}


def test_a_share_withdrawn_lets_the_counted_objects_leave_at_the_change() -> None:
    geo, fence = shared_pipeline(("p",))
    feed(geo, fence, [("p:phone", *INSIDE, 1.0), ("v:own", *INSIDE, 1.0)])
    cov = hk.cover(HIVE, 21).to_bits(INDEX_BITS)
    rechecks = geo.change("v:hive", 2, FenceBinding("v:hive", 2, cov.ranges, cov.interior))
    events = fence.define(FenceDef(fence_id="v:hive", version=2, geometry=HIVE, timeout_s=600.0), 5.0)
    events += fence.route(rechecks["w0"]) if rechecks is not None else []
    assert [(e.event, e.object_id, e.reason) for e in events] == [("leave", "p:phone", "fence_changed")]


def test_a_presence_event_goes_out_as_a_count_under_a_key_no_tenant_binds() -> None:
    geo, fence = shared_pipeline(("p",))
    events = fence.route(geo.route(positions([("p:phone", *INSIDE, 1.0), ("v:own", *INSIDE, 1.0)]))["w0"])
    sc = fence_sidecar_for_outs()
    outs = sc.event_outs(events)
    per_event = next(o for o in outs if isinstance(o, shell.Plains))
    by_key = dict(zip(per_event.routing_keys, (orjson.loads(b) for b in per_event.bodies), strict=True))
    presence = {k: b for k, b in by_key.items() if k.startswith("presence.")}
    assert list(presence) == ["presence.v.hive.enter"]
    body = presence["presence.v.hive.enter"]
    assert body["shared"] is True and body["object_id"].startswith("anon-") and "phone" not in str(body)
    assert by_key["fence-events.v.hive.enter.own"]["object_id"] == "own"
    batches = [o for o in outs if isinstance(o, shell.Out)]
    archived = [e for o in batches if o.exchange is sc.event_batches for e in orjson.loads(o.body)]
    tenant_batches = [e for o in batches if o.exchange is sc.tenant_batches for e in orjson.loads(o.body)]
    assert len(archived) == 2 and any(e.get("shared") for e in archived)  # the archive counts them
    assert [e["object_id"] for e in tenant_batches] == ["own"]  # the tenant's stream: its own only
    assert all(b"phone" not in m for m in sc.map_tail)  # nor on the live map


def fence_sidecar_for_outs() -> Any:
    """An x-fence sidecar whose exchanges are stand-ins (only event_outs is used)."""
    return fence_sidecar()[0]
