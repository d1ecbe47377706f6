"""Far jumps (issue 34, part 1): a position far from its object's last one is two places, not
the area between them. A GPS glitch to (0, 0), a phone switched on after a flight, a tracker
moved to another continent, the poles and the antimeridian: the proximity router and the
workers' matchers give the brute-force reference's events, and what a row costs (the C loop's
index searches and entries looked at; the router's ring keys) does not grow with the distance.

Before the fix a mover's search box was the union of its old and new boxes: one object jumping
from Montreal to (-140, -50) cost ~2e8 index searches (0.7-1.6 s of a worker's event loop)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.hash_ring import HashRing
from exchanges.roam_cells import BlockOwners, RoamGrid, distances_m
from exchanges.roam_routing import DEFAULT_GRID, RoamRouter
from exchanges.subscriptions import Subscription
from fence.reference import roam_events
from fence.x_fence.roaming import RoamMatcher, roam_event_id
from tests.unit.test_roaming import Deployment, latest_of

# Places a jump may land: the extremes of the coordinate space and of the grids.
PLACES = [(0.0, 0.0), (-140.0, -50.0), (179.99999, 10.0), (-179.99999, 10.0), (180.0, -33.0),
          (-180.0, 45.0), (12.0, 89.99999), (-77.0, -89.99999), (0.0, 90.0), (0.0, -90.0),
          (-73.57, 45.50), (151.2, -33.87)]


def _fleet(seed: int, objects: int, rows: int, jump_p: float) -> tuple[list[str], Any, Any, Any]:
    """Objects in a few clusters (Montreal, the antimeridian, a pole), moving a little, and
    now and then jumping to one of PLACES or anywhere on Earth."""
    rng = np.random.default_rng(seed)
    homes = np.array([(-73.57, 45.50), (179.999, -16.0), (-179.999, -16.0), (40.0, 89.995), (5.0, -89.995)])
    pos = homes[rng.integers(0, len(homes), objects)] + rng.normal(0, 0.002, (objects, 2))
    who = rng.integers(0, objects, rows)
    lon, lat = np.empty(rows), np.empty(rows)
    for k, o in enumerate(who.tolist()):
        u = rng.random()
        if u < jump_p / 2:
            pos[o] = PLACES[int(rng.integers(len(PLACES)))]
        elif u < jump_p:
            pos[o] = (rng.uniform(-180, 180), rng.uniform(-90, 90))
        else:
            pos[o] += rng.normal(0, 0.0015, 2)
        pos[o, 0] = (pos[o, 0] + 180.0) % 360.0 - 180.0 if abs(pos[o, 0]) > 180 else pos[o, 0]
        pos[o, 1] = min(90.0, max(-90.0, pos[o, 1]))
        lon[k], lat[k] = pos[o]
    ts = 1_790_000_000.0 + np.cumsum(rng.random(rows) < 0.5).astype(np.float64)
    return [f"o-{o}" for o in who.tolist()], lon, lat, ts


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), n_workers=st.integers(1, 4), batch=st.sampled_from([1, 9, 100, 1000]),
       level=st.sampled_from([0, 12, 15]))
def test_far_jumps_poles_and_the_antimeridian_equal_the_brute_force_reference(seed: int, n_workers: int,
                                                                             batch: int, level: int) -> None:
    rng = np.random.default_rng(seed + 7)
    ids, lon, lat, ts = _fleet(seed, 30, 400, 0.15)
    owners = sorted(set(ids))
    radii = [50.0, 400.0, 5_000.0, 50_000.0]
    subs = [Subscription(f"s{j}", owners[int(rng.integers(len(owners)))], float(rng.choice(radii)))
            for j in range(int(rng.integers(1, 6)))]
    rmax = max(s.radius_m for s in subs)
    grid = RoamGrid(level, 2) if level else RoamGrid.for_radius(rmax, 2)
    d = Deployment(subs, n_workers, grid)
    got = d.feed(ids, lon, lat, ts, None, batch)
    want = roam_events(subs, ids, lon, lat, ts)
    assert Counter(e.key() for e in got) == Counter(want)
    assert len({e.id for e in got}) == len(got)
    latest = latest_of(ids, lon, lat, ts)
    for w in d.workers:  # a worker holds the latest position of what it holds, nothing stale
        assert all(latest[o] == p for o, p in w.held().items())


def _matcher_with_crowd(n_objects: int, n_subs: int) -> tuple[RoamMatcher, list[str], Any, Any]:
    """One worker holding a crowd in Montreal, some of them with 500 m subscriptions."""
    rng = np.random.default_rng(3)
    ring = HashRing(["w0"])
    m = RoamMatcher(DEFAULT_GRID, BlockOwners(DEFAULT_GRID, ["w0"], ring.nodes_for_many), 0)
    ids = [f"v-{i}" for i in range(n_objects)]
    for j in range(n_subs):
        m.add(Subscription(f"s{j}", ids[j], 500.0))
    lon = -73.57 + rng.uniform(-0.05, 0.05, n_objects)
    lat = 45.50 + rng.uniform(-0.05, 0.05, n_objects)
    nan = np.full(n_objects, np.nan)
    m.apply(ids, lon, lat, np.full(n_objects, 1_790_000_000.0), nan, nan)
    return m, ids, lon, lat


def _near_count(plon: Any, plat: Any, elon: Any, elat: Any) -> int:
    """Pairs (place, position) within 3 x the radius (500 m) + 2 km: a generous reach that
    holds any box of index cells around a place, and nothing far."""
    return sum(int((distances_m(x, y, elon, elat) <= 3 * 500.0 + 2_000.0).sum())
               for x, y in zip(plon, plat, strict=True))


def _work_of(m: RoamMatcher, ids: list[str], olon: Any, olat: Any, nlon: Any, nlat: Any) -> tuple[int, int]:
    before = m.work
    m.apply(ids, nlon, nlat, np.full(len(ids), 1_790_000_100.0), olon, olat)
    return m.work[0] - before[0], m.work[1] - before[1]


@pytest.mark.parametrize("to", [(-140.0, -50.0), (0.0, 0.0), (106.4, -45.5), (179.99999, 0.0),
                                (-179.99999, 0.0), (0.0, 89.99999), (0.0, -89.99999)])
def test_a_far_jump_costs_the_objects_near_its_two_places(to: tuple[float, float]) -> None:
    """600 objects of 2,000 (50 of them subscribers) jump at once to one place: the entries
    looked at are those near the old or the new place of each (counted here by brute force,
    within a generous 3 x the radius + 2 km that holds any box of cells), and the index
    searches a handful per box, wherever they land; near a pole a box spans every longitude,
    read by rows of cells, never cell by cell (65,536 columns at the index level)."""
    m, ids, lon, lat = _matcher_with_crowd(2_000, 50)
    movers = 600
    nlon, nlat = np.full(movers, to[0]), np.full(movers, to[1])
    searches, looked = _work_of(m, ids[:movers], lon[:movers], lat[:movers], nlon, nlat)
    near = _near_count(np.r_[lon[:movers], nlon], np.r_[lat[:movers], nlat], np.r_[lon, nlon],
                       np.r_[lat, nlat])
    assert looked <= 2 * near, (looked, near)
    assert searches <= movers * 4 * 2 * 8, searches
    short_m, _, _, _ = _matcher_with_crowd(2_000, 50)
    short = _work_of(short_m, ids[:movers], lon[:movers], lat[:movers], lon[:movers] + 0.001, lat[:movers])
    assert searches <= 2 * short[0] + movers * 16, (short, searches)


def test_repeated_teleports_of_one_object_in_a_batch_cost_a_batch_not_a_batch_per_row() -> None:
    """One object teleporting 1,000 times in one batch among 5,000 held positions: the batch
    is evaluated once (the old code cut it into 1,000 segments, each sorting every position)."""
    m, ids, lon, lat = _matcher_with_crowd(5_000, 20)
    rng = np.random.default_rng(1)
    jumps = np.array(PLACES)[rng.integers(0, len(PLACES), 1_000)]
    plon = np.concatenate([[lon[0]], jumps[:-1, 0]])
    plat = np.concatenate([[lat[0]], jumps[:-1, 1]])
    calls = []
    real = m._pairs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    m._pairs = counted  # type: ignore[method-assign]
    searches, looked = _work_of(m, [ids[0]] * 1_000, plon, plat, jumps[:, 0], jumps[:, 1])
    assert len(calls) == 1
    near = _near_count(np.r_[plon, jumps[:, 0]], np.r_[plat, jumps[:, 1]], np.r_[lon, jumps[:, 0]],
                       np.r_[lat, jumps[:, 1]])
    assert searches <= 1_000 * 4 * 2 * 8 and looked <= 2 * near, (searches, looked, near)


@pytest.mark.parametrize("lat", [89.9999, -89.9999, 0.0])
def test_the_router_costs_a_bounded_number_of_ring_keys_per_row_at_any_radius_or_latitude(lat: float) -> None:
    """A subscriber's box over more than WIDE_BLOCKS blocks goes to every worker: its keys are
    never computed block by block (near a pole a box spans every longitude: 8,192 blocks)."""
    ring = HashRing(["w0", "w1", "w2"])
    owners = BlockOwners(DEFAULT_GRID, list(ring.nodes), ring.nodes_for_many)
    sizes: list[int] = []
    real = DEFAULT_GRID.keys_of_blocks

    class Counting(RoamGrid):
        def keys_of_blocks(self, rows: Any, *boxes: Any) -> Any:
            got = real(rows, *boxes)
            sizes.append(int(got[1].size))
            return got

    grid = Counting(DEFAULT_GRID.level, DEFAULT_GRID.block_bits)
    owners = BlockOwners(grid, list(ring.nodes), ring.nodes_for_many)
    router = RoamRouter(grid, owners)
    router.set_radius("sub", 50_000.0)
    lons = np.array([-73.0, 120.0, -179.9999, 179.9999])
    shares = router.route(["sub"] * 4, lons, np.full(4, lat), np.arange(4, dtype=np.float64))
    assert max(sizes) <= owners.WIDE_BLOCKS * 8  # 8 rows' boxes at most (new and old), each bounded
    assert set(shares) == {0, 1, 2}  # a wide box reaches every worker
    # and a worker keeps such a subscriber's position by the same rule
    _, w = owners.box_workers(lons[-1:], np.array([lat]), np.array([50_000.0]))
    assert sorted(w.tolist()) == [0, 1, 2]


def test_a_box_of_a_few_blocks_goes_to_their_owners_only() -> None:
    ring = HashRing([f"w{i}" for i in range(8)])
    owners = BlockOwners(DEFAULT_GRID, list(ring.nodes), ring.nodes_for_many)
    lon, lat, r = np.array([9.52]), np.array([47.14]), np.array([300.0])
    _, w = owners.box_workers(lon, lat, r)
    _, keys = DEFAULT_GRID.box_keys(lon, lat, r)
    assert sorted(set(w.tolist())) == sorted(set(owners.of(keys).tolist()))
    assert len(set(w.tolist())) < 8
    assert math.isclose(DEFAULT_GRID.cell_height_m(), 610.7, rel_tol=0.01)


def test_event_ids_stay_those_of_roam_event_id() -> None:
    """The batch path builds the ids in columns; they are the ids roam_event_id gives (the
    ones consumers already dropped redeliveries by)."""
    sub = Subscription("meet", "a", 300.0)
    d = Deployment([sub], 2, RoamGrid(16, 0))
    lat = 47.1 + np.array([0.0, 1.0, 0.4, 0.6, -0.5, 0.6]) / 111.195
    lon = np.full(6, 9.5)
    got = d.feed(["a", "b", "a", "b", "a", "b"], lon, lat, np.arange(6, dtype=np.float64), None, 6)
    assert [e.kind for e in got] == ["nearby", "faraway"]
    movers = {3.0: ("b", 3), 4.0: ("a", 4)}  # the row that caused each event
    for e in got:
        mover, row = movers[e.ts]
        assert e.id == roam_event_id("meet", "b", e.kind, e.ts, mover, float(lon[row]), float(lat[row]))
