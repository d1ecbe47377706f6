"""The traffic generator on the real extract ((c) OpenStreetMap contributors, ODbL 1.0).

The network is loaded once per module (~0.1 s); fleets are small and simulated time is cheap, so
the whole module runs in a few seconds. References are computed independently where it matters:
raw OSM ways read here with osmium for oneways, Bellman-Ford in numpy for shortest times,
breadth-first search for connectivity.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np
import numpy.typing as npt
import osmium
import pytest

from deploy.demo.osm_extract import (
    EARTH_RADIUS_M,
    EXTRACT,
    HIGHWAY_CLASSES,
    OSM_CREDIT,
    RoadNetwork,
    haversine_m,
    largest_scc,
    points_of_interest,
    road_network,
    strongly_connected_components,
)
from deploy.demo.traffic import SPEED_KMH, Fleet, Router

MAX_MPS = max(SPEED_KMH.values()) / 3.6


@pytest.fixture(scope="module")
def net() -> RoadNetwork:
    return road_network()


@pytest.fixture(scope="module")
def router(net: RoadNetwork) -> Router:
    return Router(net)


def _reach(n: int, src: npt.NDArray[np.int32], dst: npt.NDArray[np.int32], start: int) -> int:
    """Number of nodes reachable from start (BFS)."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        adj[a].append(b)
    seen = [False] * n
    seen[start] = True
    queue = deque([start])
    count = 1
    while queue:
        for w in adj[queue.popleft()]:
            if not seen[w]:
                seen[w] = True
                count += 1
                queue.append(w)
    return count


def _edge_set(net: RoadNetwork) -> set[tuple[int, int]]:
    return set(zip(net.src.tolist(), net.dst.tolist(), strict=True))


def _metres(lon0: npt.ArrayLike, lat0: npt.ArrayLike, lon1: npt.ArrayLike, lat1: npt.ArrayLike
            ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(east, north) metres from point 0 to point 1 (local equirectangular frame)."""
    lat = np.radians(np.asarray(lat0, dtype=np.float64))
    east = np.radians(np.subtract(lon1, lon0)) * EARTH_RADIUS_M * np.cos(lat)
    north = np.radians(np.subtract(lat1, lat0)) * EARTH_RADIUS_M
    return east, north


# --- the network ----------------------------------------------------------------------------


def test_network_shape_and_csr(net: RoadNetwork) -> None:
    assert 9_000 < net.n_nodes < 13_000  # "roads ~10k nodes"
    assert net.n_edges > net.n_nodes
    assert net.node_id.size == np.unique(net.node_id).size == net.n_nodes
    assert (net.src != net.dst).all()  # no self loops
    assert (np.diff(net.src) >= 0).all()  # sorted by source
    assert net.indptr[0] == 0 and net.indptr[-1] == net.n_edges
    assert (np.repeat(np.arange(net.n_nodes), np.diff(net.indptr)) == net.src).all()
    assert set(np.unique(net.highway).tolist()) <= set(range(len(HIGHWAY_CLASSES)))
    lon0, lat0, lon1, lat1 = net.bbox
    assert (net.lon >= lon0).all() and (net.lon <= lon1).all()
    assert (net.lat >= lat0).all() and (net.lat <= lat1).all()
    assert "OpenStreetMap contributors" in OSM_CREDIT


def test_network_strongly_connected(net: RoadNetwork) -> None:
    # Independent of Tarjan: every node reachable from node 0, and node 0 from every node.
    assert _reach(net.n_nodes, net.src, net.dst, 0) == net.n_nodes
    assert _reach(net.n_nodes, net.dst, net.src, 0) == net.n_nodes
    assert net.dropped_nodes > 0  # the raw data has dead-end oneways and fragments to drop


def test_scc_small_graphs_and_deep_chain() -> None:
    # 0<->1->2<->3, 4 alone: components {0,1}, {2,3}, {4}; the largest is the first found.
    src = np.array([0, 1, 1, 2, 3])
    dst = np.array([1, 0, 2, 3, 2])
    labels = strongly_connected_components(5, src, dst)
    assert labels[0] == labels[1] != labels[2] == labels[3] != labels[4]
    assert len(set(labels.tolist())) == 3
    # A 3-cycle beats the 2-cycle.
    mask = largest_scc(6, np.array([0, 1, 2, 3, 4, 2]), np.array([1, 2, 0, 4, 3, 3]))
    assert mask.tolist() == [True, True, True, False, False, False]
    # A cycle 100k nodes deep: far past any recursion limit.
    n = 100_000
    ring = strongly_connected_components(n, np.arange(n), (np.arange(n) + 1) % n)
    assert (ring == 0).all()
    chain = strongly_connected_components(n, np.arange(n - 1), np.arange(1, n))
    assert np.unique(chain).size == n


def test_edge_lengths_plausible(net: RoadNetwork) -> None:
    east, north = _metres(net.lon[net.src], net.lat[net.src], net.lon[net.dst], net.lat[net.dst])
    flat = np.hypot(east, north)
    assert np.allclose(net.length_m, flat, rtol=3e-3)  # haversine vs. flat Earth over metres
    assert (net.length_m > 0).all() and net.length_m.max() < 2_000
    assert 10 < np.median(net.length_m) < 100
    # Both directions of a two-way segment have the same length.
    back = {(d, s): k for k, (s, d) in enumerate(zip(net.src.tolist(), net.dst.tolist(), strict=True))}
    pairs = [(k, back[(s, d)]) for k, (s, d) in enumerate(zip(net.src.tolist(), net.dst.tolist(),
                                                            strict=True)) if (s, d) in back]
    assert len(pairs) > net.n_edges // 2
    a, b = np.array(pairs).T
    assert np.allclose(net.length_m[a], net.length_m[b])
    # Liechtenstein: a few hundred km of drivable road, counted once per direction.
    assert 400 < net.length_m.sum() / 1000 < 1200
    assert haversine_m(9.5, 47.0, 9.5, 48.0) == pytest.approx(111_195, rel=1e-3)


def _raw_oneway_pairs() -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """Directed OSM node pairs (a, b) that must be oneway a->b, and pairs from two-way ways."""
    oneway: set[tuple[int, int]] = set()
    twoway: set[tuple[int, int]] = set()
    for way in osmium.FileProcessor(str(EXTRACT), osmium.osm.WAY):
        assert isinstance(way, osmium.osm.Way)
        tags = way.tags
        if tags.get("highway") not in HIGHWAY_CLASSES:
            continue
        refs = [n.ref for n in way.nodes]
        pairs = list(itertools.pairwise(refs))
        flag = tags.get("oneway")
        if flag == "yes" or (flag is None and tags.get("junction") == "roundabout"):
            oneway.update(pairs)
        elif flag == "-1":
            oneway.update((b, a) for a, b in pairs)
        else:
            twoway.update(pairs)
            twoway.update((b, a) for a, b in pairs)
    return oneway, twoway


def test_oneways_respected(net: RoadNetwork, router: Router) -> None:
    oneway, twoway = _raw_oneway_pairs()
    index = {int(i): k for k, i in enumerate(net.node_id.tolist())}
    edges = _edge_set(net)
    checked = 0
    for a, b in sorted(oneway - twoway):
        if a in index and b in index and (index[a], index[b]) in edges:
            assert (index[b], index[a]) not in edges, (a, b)
            checked += 1
    assert checked > 200  # oneway=yes, oneway=-1 and roundabouts all present in Liechtenstein
    # A route against a oneway segment goes round: more than one edge, and never b->a directly.
    a, b = next((index[a], index[b]) for a, b in sorted(oneway - twoway)
                if a in index and b in index and (index[a], index[b]) in edges)
    back = router.route(b, a)
    assert back.edges.size > 1
    assert (b, a) not in set(zip(back.nodes[:-1].tolist(), back.nodes[1:].tolist(), strict=True))
    assert router.route(a, b).time_s[-1] <= router.edge_time_s[net.indptr[a] + np.flatnonzero(
        net.dst[net.indptr[a]:net.indptr[a + 1]] == b)[0]] + 1e-9


def test_path_is_a_chain_of_edges(net: RoadNetwork, router: Router) -> None:
    rng = np.random.default_rng(3)
    for a, b in rng.integers(0, net.n_nodes, size=(30, 2)).tolist():
        leg = router.route(a, b)
        assert leg.nodes[0] == a and leg.nodes[-1] == b
        assert (net.src[leg.edges] == leg.nodes[:-1]).all()
        assert (net.dst[leg.edges] == leg.nodes[1:]).all()
        assert np.allclose(np.diff(leg.time_s), router.edge_time_s[leg.edges])
        assert np.allclose(np.diff(leg.dist_m), net.length_m[leg.edges])
        assert leg.time_s[0] == leg.dist_m[0] == 0.0
    same = router.route(5, 5)
    assert same.edges.size == 0 and same.nodes.tolist() == [5]


def test_routes_are_fastest(net: RoadNetwork, router: Router) -> None:
    """Dijkstra against Bellman-Ford (vectorised numpy relaxation, a different algorithm)."""
    source = 1234
    dist = np.full(net.n_nodes, np.inf)
    dist[source] = 0.0
    for _ in range(net.n_nodes):
        cand = dist[net.src] + router.edge_time_s
        new = dist.copy()
        np.minimum.at(new, net.dst, cand)
        if np.array_equal(new, dist):
            break
        dist = new
    assert np.isfinite(dist).all()
    for target in np.random.default_rng(4).integers(0, net.n_nodes, 40).tolist():
        assert router.route(source, target).time_s[-1] == pytest.approx(dist[target], rel=1e-9)


# --- the fleet ------------------------------------------------------------------------------


def test_fleet_stays_in_bbox(net: RoadNetwork, router: Router) -> None:
    fleet = Fleet(net, 12, seed=11, noise_m=5.0, router=router)
    lon0, lat0, lon1, lat1 = net.bbox
    margin_lat = np.degrees(40.0 / EARTH_RADIUS_M)  # 8 sigma
    margin_lon = margin_lat / np.cos(np.radians(47.3))
    for t in range(0, 2 * 3600, 20):
        ids, lon, lat = fleet.positions(float(t))
        assert len(ids) == lon.size == lat.size == 12
        assert ((lon > lon0 - margin_lon) & (lon < lon1 + margin_lon)).all()
        assert ((lat > lat0 - margin_lat) & (lat < lat1 + margin_lat)).all()
        _, tlon, tlat = fleet.true_positions(float(t))
        assert (tlon >= net.lon.min()).all() and (tlon <= net.lon.max()).all()
        assert (tlat >= net.lat.min()).all() and (tlat <= net.lat.max()).all()
    assert ids[0] == "car-0001" and ids[-1] == "car-0012"
    summary = fleet.summary()
    assert summary.round_trips_done > 12 and summary.legs_computed > 24
    assert summary.reports == 12 * 360
    assert 0 < summary.km_driven < 12 * MAX_MPS * 2 * 3600 / 1000
    assert summary.km_driven == pytest.approx(fleet.odometer_m().sum() / 1000)


def test_speeds_within_class_limits(net: RoadNetwork, router: Router) -> None:
    fleet = Fleet(net, 30, seed=5, router=router)
    dt = 0.5
    _, lon, lat = fleet.true_positions(0.0)
    edge = fleet.current_edges()
    odo = fleet.odometer_m()
    same_edge_checks = 0
    for step in range(1, 2400):  # 20 simulated minutes
        _, lon2, lat2 = fleet.true_positions(step * dt)
        edge2 = fleet.current_edges()
        odo2 = fleet.odometer_m()
        moved = haversine_m(lon, lat, lon2, lat2)
        assert (moved <= MAX_MPS * dt * 1.003 + 1e-6).all()  # a chord is never longer than the road
        assert (odo2 - odo <= MAX_MPS * dt * (1 + 1e-9)).all()
        on = (edge == edge2) & (edge >= 0)
        if on.any():
            limit = router.edge_speed_mps[edge[on]]
            assert (moved[on] <= limit * dt * 1.003 + 1e-6).all()
            # Along one straight edge the car drives exactly at its class speed.
            assert np.allclose((odo2 - odo)[on], limit * dt, rtol=1e-6)
            same_edge_checks += int(on.sum())
        lon, lat, edge, odo = lon2, lat2, edge2, odo2
    assert same_edge_checks > 30 * 1000


def test_deterministic_for_a_seed(net: RoadNetwork, router: Router) -> None:
    a = Fleet(net, 10, seed=42, router=router)
    b = Fleet(net, 10, seed=42, router=router)
    c = Fleet(net, 10, seed=43, router=router)
    for t in np.arange(0.0, 1200.0, 7.5).tolist():
        _, la, pa = a.positions(t)
        _, lb, pb = b.positions(t)
        _, lc, _ = c.positions(t)
        assert np.array_equal(la, lb) and np.array_equal(pa, pb)
    assert not np.array_equal(la, lc)
    assert np.array_equal(a.home, b.home) and not np.array_equal(a.home, c.home)
    # Trips do not depend on the fleet's size nor on when positions are asked for.
    big = Fleet(net, 20, seed=42, router=router)
    for t in (600.0, 1199.0, 1200.0):
        _, ba, bb = big.true_positions(t)
    _, ta, tb = a.true_positions(1200.0)
    assert np.array_equal(ta, ba[:10]) and np.array_equal(tb, bb[:10])


@pytest.mark.parametrize("seed", [9, 10, 11])
def test_round_trip_returns_home(net: RoadNetwork, router: Router, seed: int) -> None:
    fleet = Fleet(net, 1, seed=seed, router=router)
    _, lon, lat = fleet.true_positions(0.0)
    home = int(fleet.home[0])
    assert lon[0] == net.lon[home] and lat[0] == net.lat[home]
    seen_dests = set()
    while fleet.legs_started[0] < 6:  # three round trips
        end = float(fleet.leg_end_s()[0])
        dest = int(fleet.destination[0])
        outbound = fleet.legs_started[0] % 2 == 1
        assert (dest != home) if outbound else (dest == home)
        if outbound:
            seen_dests.add(dest)
        assert fleet.summary().round_trips_done == (fleet.legs_started[0] - 1) // 2
        _, lon, lat = fleet.true_positions(end)  # the instant the leg ends: at its destination
        assert lon[0] == net.lon[dest] and lat[0] == net.lat[dest]
    assert len(seen_dests) == 3  # a new destination every round trip
    assert fleet.home[0] == home
    assert fleet.summary().round_trips_done == 2  # the third is under way


def test_noise_statistics(net: RoadNetwork, router: Router) -> None:
    sigma = 5.0
    fleet = Fleet(net, 50, seed=21, noise_m=sigma, router=router)
    east: list[npt.NDArray[np.float64]] = []
    north: list[npt.NDArray[np.float64]] = []
    for t in range(200):  # 50 vehicles x 200 reports (one leg each: routing is the cost here)
        _, lon, lat = fleet.positions(float(t))
        _, tlon, tlat = fleet.true_positions(float(t))  # same t: same true position
        e, n = _metres(tlon, tlat, lon, lat)
        east.append(e)
        north.append(n)
    e_all, n_all = np.concatenate(east), np.concatenate(north)  # 10,000 samples each
    for x in (e_all, n_all):
        assert abs(x.mean()) < 0.25  # standard error 0.05 m
        assert x.std(ddof=1) == pytest.approx(sigma, rel=0.04)  # standard error 0.7 %
    assert abs(np.corrcoef(e_all, n_all)[0, 1]) < 0.05
    # Independent per report: the same vehicle's consecutive errors are uncorrelated.
    stack = np.stack(east)
    assert abs(np.corrcoef(stack[:-1].ravel(), stack[1:].ravel())[0, 1]) < 0.05
    quiet = Fleet(net, 5, seed=21, noise_m=0.0, router=router)
    _, lon, lat = quiet.positions(100.0)
    _, tlon, tlat = quiet.true_positions(100.0)
    assert np.array_equal(lon, tlon) and np.array_equal(lat, tlat)


def test_time_goes_forward_only(net: RoadNetwork, router: Router) -> None:
    fleet = Fleet(net, 2, seed=1, router=router)
    fleet.positions(10.0)
    fleet.positions(10.0)  # the same instant again is fine (a second report)
    with pytest.raises(ValueError):
        fleet.positions(9.0)
    with pytest.raises(ValueError):
        fleet.positions(float("nan"))


def test_departure_spread_parks_then_same_trips(net: RoadNetwork, router: Router) -> None:
    parked = Fleet(net, 20, seed=8, departure_spread_s=600.0, router=router)
    now = Fleet(net, 20, seed=8, router=router)
    _, lon, lat = parked.true_positions(0.0)
    assert np.array_equal(lon, net.lon[parked.home]) and np.array_equal(lat, net.lat[parked.home])
    assert parked.legs_computed == 0
    departure = parked.leg_end_s()
    assert (departure > 0).all() and (departure < 600).all() and np.unique(departure).size == 20
    # Same trips, shifted by each vehicle's departure.
    _, nlon, nlat = now.true_positions(300.0)
    for v in np.argsort(departure).tolist():
        _, plon, plat = parked.true_positions(float(departure[v]) + 300.0)
        assert plon[v] == nlon[v] and plat[v] == nlat[v]


def test_long_jump_in_time_and_compaction(net: RoadNetwork, router: Router) -> None:
    """Far steps (many legs at once, cursor far ahead) agree with small steps."""
    fine = Fleet(net, 6, seed=2, router=router)
    coarse = Fleet(net, 6, seed=2, router=router)
    for step in range(0, 3 * 3600 + 1, 5):
        fine.true_positions(float(step))
    for t in (0.0, 77.0, 3600.0, 3 * 3600.0):
        _, clon, clat = coarse.true_positions(t)
    _, flon, flat = fine.true_positions(3 * 3600.0)
    assert np.array_equal(clon, flon) and np.array_equal(clat, flat)
    assert np.array_equal(fine.odometer_m(), coarse.odometer_m())
    assert fine.summary().legs_computed == coarse.summary().legs_computed
    assert fine.compactions > 3 and coarse.compactions > 3


# --- points of interest ---------------------------------------------------------------------


def test_points_of_interest(net: RoadNetwork) -> None:
    pois = points_of_interest()
    assert len(pois) > 100
    assert all(name.strip() for name, _, _, _ in pois)
    assert all(kind.split("=")[0] in ("amenity", "tourism", "shop", "historic") for *_, kind in pois)
    lon0, lat0, lon1, lat1 = net.bbox
    assert all(lon0 <= lon <= lon1 and lat0 <= lat <= lat1 for _, lon, lat, _ in pois)
    assert pois == sorted(pois, key=lambda p: (p[0], p[3], p[1], p[2]))
    assert points_of_interest(limit=10) == pois[:10]
    museum = [p for p in pois if p[0] == "Liechtensteinisches Landesmuseum Vaduz"]
    assert len(museum) == 1 and museum[0][3] == "tourism=museum"
    kinds = {kind for *_, kind in pois}
    assert {"amenity=restaurant", "amenity=fuel"} <= kinds
