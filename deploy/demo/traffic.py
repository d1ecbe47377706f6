"""Real-time traffic generator for the live fleet demo and load tests.

After the location-based pub/sub paper's generator (seed 004, section 3): every vehicle lives on
the real road network of the shipped OpenStreetMap extract ((c) OpenStreetMap contributors,
ODbL 1.0), starts at a random home node, drives the fastest route to a random destination, drives
back home (a round trip), then picks a new destination, forever. Reported positions carry
Gaussian GPS noise, since real traces never sit exactly on the road.

Pure: no I/O besides reading the extract through `deploy.demo.osm_extract`; no clock (the caller says
which simulated time it wants), no threads.

Determinism: a vehicle's trips depend only on (seed, vehicle number, network), never on how
often or when positions are asked for, nor on the fleet's size (vehicle 7 of a 10-car fleet drives
as vehicle 7 of a 1000-car fleet). The noise has its own random stream, so it is reproducible
for a given seed *and* a given sequence of calls.

Cost model: a leg's route is computed when the vehicle starts it (Dijkstra, ~5 ms on the ~11k
node network); in between, `positions(t)` is a handful of numpy operations over all vehicles.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from deploy.demo.osm_extract import EARTH_RADIUS_M, HIGHWAY_CLASSES, OSM_CREDIT, RoadNetwork, road_network

__all__ = [
    "OSM_CREDIT",
    "SPEED_KMH",
    "Fleet",
    "FleetSummary",
    "Leg",
    "Router",
    "road_network",
]

# Cruise speed per road class, km/h: Swiss/Liechtenstein limits (motorway 120, outside built-up
# areas 80, inside 50, residential zones 30, encounter zones 20) lowered to what a car averages
# there, since the generator has no junction delays, traffic lights or acceleration. Links are
# slower than their road (curves, merging). A vehicle drives an edge at exactly its class speed,
# so this table is also the hard upper bound on the speed of a noise-free trace.
SPEED_KMH: dict[str, float] = {
    "motorway": 100.0,
    "motorway_link": 60.0,
    "trunk": 80.0,
    "trunk_link": 50.0,
    "primary": 70.0,
    "primary_link": 50.0,
    "secondary": 60.0,
    "secondary_link": 45.0,
    "tertiary": 50.0,
    "tertiary_link": 40.0,
    "unclassified": 50.0,
    "residential": 30.0,
    "living_street": 15.0,
    "service": 20.0,
}
assert set(SPEED_KMH) == set(HIGHWAY_CLASSES)

_F64 = npt.NDArray[np.float64]
_I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Leg:
    """A route: `nodes[i] -> nodes[i+1]` is edge `edges[i]`; `time_s`/`dist_m` are cumulative
    from the first node (so `time_s[0] == dist_m[0] == 0` and `time_s[-1]` is the duration)."""

    nodes: _I64
    edges: _I64
    time_s: _F64
    dist_m: _F64


class Router:
    """Fastest routes (travel time = length / class speed) by Dijkstra with a binary heap.

    The CSR arrays are copied to Python lists once: indexing numpy arrays element by element
    is ~10x slower than lists in the relaxation loop. The search stops when the target is
    settled: ~5 ms per random pair on Liechtenstein, ~12 ms for a full tree. No cache: a
    vehicle's legs rarely repeat (outbound and return differ because of oneways, destinations
    are random), and one full tree per home would cost ~90 KB per vehicle to save ~5 ms per leg.
    """

    def __init__(self, network: RoadNetwork, speed_kmh: dict[str, float] | None = None) -> None:
        speeds = speed_kmh or SPEED_KMH
        mps = np.array([speeds[c] / 3.6 for c in HIGHWAY_CLASSES], dtype=np.float64)
        if not (mps > 0).all():
            raise ValueError("every road class needs a positive speed")
        self.network = network
        self.edge_speed_mps: _F64 = mps[network.highway]
        self.edge_time_s: _F64 = network.length_m / self.edge_speed_mps
        self._indptr: list[int] = network.indptr.tolist()
        self._heads: list[int] = network.dst.tolist()
        self._tails: list[int] = network.src.tolist()
        self._cost: list[float] = self.edge_time_s.tolist()
        self.searches = 0

    def route(self, source: int, target: int) -> Leg:
        """The fastest route from source to target (ties go the same way on every run).

        Raises ValueError if target is unreachable, which road_network's strongly connected
        graph rules out.
        """
        n = len(self._indptr) - 1
        if not (0 <= source < n and 0 <= target < n):
            raise ValueError(f"node out of range: {source} -> {target} (n={n})")
        self.searches += 1
        indptr, heads, cost = self._indptr, self._heads, self._cost
        inf = float("inf")
        dist = [inf] * n
        pred = [-1] * n  # edge by which the best path enters the node
        dist[source] = 0.0
        heap = [(0.0, source)]
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            d, u = pop(heap)
            if u == target:
                break
            if d > dist[u]:
                continue  # stale entry (lazy deletion instead of decrease-key)
            for k in range(indptr[u], indptr[u + 1]):
                v = heads[k]
                nd = d + cost[k]
                if nd < dist[v]:
                    dist[v] = nd
                    pred[v] = k
                    push(heap, (nd, v))
        else:
            if source != target:
                raise ValueError(f"node {target} unreachable from {source}")
        edges: list[int] = []
        tails = self._tails
        v = target
        while v != source:
            k = pred[v]
            edges.append(k)
            v = tails[k]
        edges.reverse()
        e = np.asarray(edges, dtype=np.int64)
        nodes = np.empty(e.size + 1, dtype=np.int64)
        nodes[0] = source
        nodes[1:] = self.network.dst[e]
        time_s = np.zeros(e.size + 1)
        np.cumsum(self.edge_time_s[e], out=time_s[1:])
        dist_m = np.zeros(e.size + 1)
        np.cumsum(self.network.length_m[e], out=dist_m[1:])
        return Leg(nodes=nodes, edges=e, time_s=time_s, dist_m=dist_m)


@dataclass(frozen=True)
class FleetSummary:
    vehicles: int
    time_s: float  # simulated time of the latest positions call
    km_driven: float  # by all vehicles up to time_s
    legs_computed: int  # routes computed so far (started legs, the one in progress included)
    round_trips_done: int  # completed returns home, all vehicles
    reports: int  # noisy positions handed out (vehicles x positions() calls)


class Fleet:
    """Vehicles doing round trips home -> random destination -> home, forever.

    Public state (read-only for callers): `ids` ("car-0001"...; the same list is returned by
    every call), `home`, `destination` (of the current leg) and `legs_started` per vehicle,
    `now` (latest simulated time asked), counters `legs_computed`, `reports`, `compactions`.

    State layout (the invariant the vectorised step relies on): the current leg of every vehicle
    lives in flat "buffer" arrays as a run of route nodes `_lo[v].._hi[v]` with absolute arrival
    times `_t` (seconds since start), odometer readings `_odo` and the edge leaving each node
    `_edge` (-1 at a leg's last node, and while parked); `_cur[v]` is the segment the vehicle is
    on: `_t[cur] <= now < _t[cur + 1]`, `_lo <= _cur < _hi`. Finished legs stay behind in the
    buffer until a compaction drops them, so memory is bounded by the live legs (~300 nodes per
    leg on Liechtenstein), not by how long the demo runs.

    Time only moves forward (`t` below the latest one raises ValueError): the state is the
    present, with no history.
    """

    def __init__(
        self,
        network: RoadNetwork,
        vehicles: int,
        seed: int,
        noise_m: float = 5.0,
        *,
        departure_spread_s: float = 0.0,
        router: Router | None = None,
    ) -> None:
        """`departure_spread_s`: each vehicle stays parked at home for a uniform random time
        in [0, departure_spread_s) before its first leg. 0 (the default) starts every vehicle at
        t=0, which routes the whole fleet in the first step (~1 s per 100 vehicles); a spread
        of a few minutes spreads that cost and looks more like a real morning. The draw is made
        whatever the spread, so the trips themselves do not depend on it, only their timing.
        `router`: share one Router (its Python adjacency lists) between fleets."""
        if vehicles < 1:
            raise ValueError("a fleet needs at least one vehicle")
        if noise_m < 0:
            raise ValueError("noise_m must be >= 0")
        if departure_spread_s < 0:
            raise ValueError("departure_spread_s must be >= 0")
        if network.n_nodes < 2:
            raise ValueError("the network needs at least two nodes for a trip")
        self.network = network
        self.router = router or Router(network)
        self.noise_m = float(noise_m)
        self.ids: list[str] = [f"car-{i + 1:04d}" for i in range(vehicles)]
        # One stream per vehicle (trips) and one for the noise, all children of the seed.
        self._rngs = [np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, i)))
                      for i in range(vehicles)]
        self._noise = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
        n = network.n_nodes
        self.home: _I64 = np.array([int(r.integers(n)) for r in self._rngs], dtype=np.int64)
        departure = np.array([r.random() for r in self._rngs]) * float(departure_spread_s)
        self.destination: _I64 = self.home.copy()  # of the current leg
        self.legs_started: _I64 = np.zeros(vehicles, dtype=np.int64)  # per vehicle
        self.legs_computed = 0
        self.reports = 0
        self.compactions = 0
        self.now = 0.0
        # Buffer: each vehicle starts with a "parked" pseudo-leg, home -> home from t=0 to its
        # departure; when it ends the vehicle routes its first real leg.
        cap = max(1024, 64 * vehicles)
        self._t: _F64 = np.zeros(cap)
        self._odo: _F64 = np.zeros(cap)
        self._edge: _I64 = np.full(cap, -1, dtype=np.int64)
        self._node: _I64 = np.zeros(cap, dtype=np.int64)
        self._size = 2 * vehicles
        self._t[1 : 2 * vehicles : 2] = departure
        self._node[0 : 2 * vehicles : 2] = self.home
        self._node[1 : 2 * vehicles : 2] = self.home
        self._lo: _I64 = np.arange(0, 2 * vehicles, 2, dtype=np.int64)
        self._hi: _I64 = self._lo + 1
        self._cur: _I64 = self._lo.copy()

    # --- public API ---------------------------------------------------------------------------

    def positions(self, t: float) -> tuple[list[str], _F64, _F64]:
        """(ids, lon, lat) as reported at simulated time t: true position plus independent
        Gaussian noise of `noise_m` metres standard deviation on each axis (east, north) of a
        local metric frame (so the radial error is Rayleigh, mean ~1.25 noise_m)."""
        _, lon, lat = self.true_positions(t)
        self.reports += lon.size
        if self.noise_m > 0:
            e, nn = self._noise.normal(0.0, self.noise_m, size=(2, lon.size))
            lat_r = np.radians(lat)
            lon = lon + np.degrees(e / (EARTH_RADIUS_M * np.cos(lat_r)))
            lat = lat + np.degrees(nn / EARTH_RADIUS_M)
        return self.ids, lon, lat

    def true_positions(self, t: float) -> tuple[list[str], _F64, _F64]:
        """(ids, lon, lat) noise-free, on the road, at simulated time t (t >= the latest t)."""
        k, f = self._advance(t)
        lon0, lat0 = self.network.lon[self._node[k]], self.network.lat[self._node[k]]
        lon1, lat1 = self.network.lon[self._node[k + 1]], self.network.lat[self._node[k + 1]]
        # Linear in lon/lat along one edge: edges are tens of metres (750 m at most), where the
        # difference to a great-circle interpolation is far below a millimetre.
        return self.ids, lon0 + f * (lon1 - lon0), lat0 + f * (lat1 - lat0)

    def current_edges(self) -> _I64:
        """The edge each vehicle is on at the latest time asked (index into the network's edge
        arrays; -1 while parked before departure)."""
        return self._edge[self._cur].copy()

    def leg_end_s(self) -> _F64:
        """When each vehicle's current leg ends (simulated seconds): at that instant it is at
        the leg's destination, and starts its next leg from there."""
        return self._t[self._hi].copy()

    def odometer_m(self) -> _F64:
        """Metres driven by each vehicle up to the latest time asked."""
        k = self._cur
        t0, t1 = self._t[k], self._t[k + 1]
        f = self._fraction(self.now, t0, t1)
        return self._odo[k] + f * (self._odo[k + 1] - self._odo[k])

    def summary(self) -> FleetSummary:
        return FleetSummary(
            vehicles=len(self.ids),
            time_s=self.now,
            km_driven=float(self.odometer_m().sum()) / 1000.0,
            legs_computed=self.legs_computed,
            round_trips_done=int((np.maximum(self.legs_started - 1, 0) // 2).sum()),
            reports=self.reports,
        )

    # --- the step -----------------------------------------------------------------------------

    def _advance(self, t: float) -> tuple[_I64, _F64]:
        """Move every vehicle to time t; return its segment start and fraction along it."""
        t = float(t)
        if not t >= self.now:  # also rejects NaN
            raise ValueError(f"time goes forward only: {t} < {self.now}")
        self.now = t
        ended = np.flatnonzero(self._t[self._hi] <= t)
        if ended.size:
            for v in ended.tolist():
                self._next_legs(v, t)
        cur = self._cur
        # Cursor walk: each pass moves every vehicle past at most one node; at 1 Hz a car
        # crosses a few nodes per step, so a few passes. Far jumps in time go per vehicle.
        for _ in range(8):
            nxt = cur + 1
            move = (nxt < self._hi) & (self._t[nxt] <= t)
            if not move.any():
                break
            cur[move] += 1
        else:
            for v in np.flatnonzero((cur + 1 < self._hi) & (self._t[cur + 1] <= t)).tolist():
                run = self._t[cur[v] : self._hi[v] + 1]
                cur[v] += int(np.searchsorted(run, t, side="right")) - 1
        return cur, self._fraction(t, self._t[cur], self._t[cur + 1])

    @staticmethod
    def _fraction(t: float, t0: _F64, t1: _F64) -> _F64:
        span = t1 - t0
        out = np.ones_like(span)  # a zero-time segment counts as already crossed
        np.divide(t - t0, span, out=out, where=span > 0)
        return np.clip(out, 0.0, 1.0)

    def _next_legs(self, v: int, t: float) -> None:
        """Start vehicle v's legs until the current one ends after t."""
        while self._t[self._hi[v]] <= t:
            start_t = float(self._t[self._hi[v]])
            odo = float(self._odo[self._hi[v]])
            at = int(self._node[self._hi[v]])
            if at == self.home[v]:
                # Outbound: a fresh random destination, not home itself.
                n = self.network.n_nodes
                dest = int(self._rngs[v].integers(n - 1))
                dest += dest >= at
            else:
                dest = int(self.home[v])
            leg = self.router.route(at, dest)
            self.legs_computed += 1
            self.legs_started[v] += 1
            self.destination[v] = dest
            self._append(v, leg, start_t, odo)

    def _append(self, v: int, leg: Leg, start_t: float, odo: float) -> None:
        m = leg.nodes.size
        if self._size + m > self._t.size:
            self._compact(m)
        a, b = self._size, self._size + m
        self._t[a:b] = start_t + leg.time_s
        self._odo[a:b] = odo + leg.dist_m
        self._node[a:b] = leg.nodes
        self._edge[a : b - 1] = leg.edges
        self._edge[b - 1] = -1
        self._lo[v], self._hi[v], self._cur[v] = a, b - 1, a
        self._size = b

    def _compact(self, need: int) -> None:
        """Drop finished legs from the buffer; grow it if the live legs still fill half."""
        live = int((self._hi - self._lo + 1).sum())
        cap = self._t.size
        while live + need > cap // 2:
            cap *= 2
        t, odo, node, edge = (np.empty(cap), np.empty(cap),
                              np.empty(cap, dtype=np.int64), np.full(cap, -1, dtype=np.int64))
        pos = 0
        for v in range(len(self.ids)):
            lo, hi = int(self._lo[v]), int(self._hi[v]) + 1
            m = hi - lo
            t[pos : pos + m] = self._t[lo:hi]
            odo[pos : pos + m] = self._odo[lo:hi]
            node[pos : pos + m] = self._node[lo:hi]
            edge[pos : pos + m] = self._edge[lo:hi]
            self._cur[v] += pos - lo
            self._lo[v], self._hi[v] = pos, pos + m - 1
            pos += m
        self._t, self._odo, self._node, self._edge = t, odo, node, edge
        self._size = pos
        self.compactions += 1
