"""The fleet-over-fences workload, its shapely ground truth and the in-process core pipeline.

The anchor benchmark of the platform: F circular fences (32-gons, radius 200-800 m, centres
uniform in a 20 km box at 47 N) and N objects random-walking in the same box with ~20 m steps,
U position updates in rounds (every object moves once per round). Everything is seeded: the
same (seed, sizes) give the same fences, the same stream and so the same events, whichever
intake (core-only, AMQP batches, MQTT messages) carries the stream. Fences and the walk draw
from independent generators, so runs at F=1,000 and F=10,000 with one seed share the stream.

Used by `bench/e2e.py` (every mode) and by the unit tests (a small workload against the
reference). Nothing here is timed: callers time what they measure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from shapely.geometry import Polygon

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_events import Event
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo.core import XGeo
from fence import reference
from fence.x_fence.core import XFence
from hilbert_c.covering import EARTH_RADIUS_M
from ingress.core import XIngress

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

CENTRE = (9.55, 47.15)  # inside exchanges.worldmap.AREA, so the default worldmap splits it
BOX_SIDE_M = 20_000.0
RADIUS_M = (200.0, 800.0)
VERTICES = 32
STEP_M = 20.0
STEP_S = 1.0
T0 = 1_700_000_000.0
REGIONS = ("a", "b")
WORKERS = ("w0", "w1")
# Covering resolution: cells of ~1/20 of the radius keep the boundary ranges (exact test
# needed) at ~10-15% of a fence's covered area, with ~100-200 ranges per fence.
CELLS_PER_RADIUS = 20.0
# Above the natural range count at CELLS_PER_RADIUS: coarsening to fewer ranges also merges
# interior ranges into their boundary neighbours (a zero gap is the cheapest to fill), which
# turns most of a fence into "needs the exact test".
MAX_RANGES = 512
NO_TIMEOUT_S = 1e9  # the bench measures routing, not timeouts

EventTuple = reference.EventTuple  # (event, fence_id, object_id, ts, reason)


# -- geometry of the box ---------------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    """A square of side_m metres around (lon, lat), mapped linearly (plenty at 20 km)."""

    lon: float
    lat: float
    side_m: float

    @property
    def m_per_deg_lon(self) -> float:
        return math.radians(1.0) * EARTH_RADIUS_M * math.cos(math.radians(self.lat))

    @property
    def m_per_deg_lat(self) -> float:
        return math.radians(1.0) * EARTH_RADIUS_M

    def to_lonlat(self, x_m: F64, y_m: F64) -> tuple[F64, F64]:
        """Metres from the box's lower-left corner to lon/lat degrees."""
        half = self.side_m / 2.0
        return (self.lon + (x_m - half) / self.m_per_deg_lon,
                self.lat + (y_m - half) / self.m_per_deg_lat)

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        lon0, lat0 = self.to_lonlat(np.array([0.0]), np.array([0.0]))
        lon1, lat1 = self.to_lonlat(np.array([self.side_m]), np.array([self.side_m]))
        return float(lon0[0]), float(lat0[0]), float(lon1[0]), float(lat1[0])


DEFAULT_BOX = Box(*CENTRE, BOX_SIDE_M)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


def _names(prefix: str, n: int) -> list[str]:
    width = max(5, len(str(max(n - 1, 0))))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


# -- fences ----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Fence:
    fence_id: str
    lon: float
    lat: float
    radius_m: float
    geometry: Polygon
    hysteresis_m: float = 0.0  # exchanges/fence_options/band.py
    where: tuple[Any, ...] = ()  # exchanges/fence_options/where.py
    dwell_s: float = 0.0  # exchanges/fence_options/dwell.py
    cross: bool = False  # exchanges/fence_options/cross.py

    def routed_geometry(self) -> Any:
        return fence_def(self).routed_geometry()


def make_fences(n: int, seed: int, box: Box = DEFAULT_BOX,
                radius_m: tuple[float, float] = RADIUS_M) -> list[Fence]:
    """n circles (VERTICES-gons), centres uniform in the box, radius uniform in radius_m."""
    rng = _rng(seed, 1)
    x = rng.uniform(0.0, box.side_m, n)
    y = rng.uniform(0.0, box.side_m, n)
    r = rng.uniform(*radius_m, n)
    lon, lat = box.to_lonlat(x, y)
    return [Fence(fid, float(lo), float(la), float(rr), hk.circle(float(lo), float(la), float(rr), VERTICES))
            for fid, lo, la, rr in zip(_names("f", n), lon, lat, r, strict=True)]


def covering_bits(radius_m: float, lat: float, cells_per_radius: float = CELLS_PER_RADIUS) -> int:
    """The resolution whose cell side (geometric mean of width and height) is nearest to
    radius / cells_per_radius."""
    target = math.log(radius_m / cells_per_radius)

    def miss(bits: int) -> float:
        w, h = hk.cell_size_m(bits, lat)
        return abs(0.5 * math.log(w * h) - target)

    return min(range(hk.MIN_BITS, INDEX_BITS + 1), key=miss)


def fence_bindings(fence: Fence, worldmap: Worldmap, version: int = 1,
                   max_ranges: int | None = MAX_RANGES,
                   cells_per_radius: float = CELLS_PER_RADIUS) -> dict[str, FenceBinding]:
    """The fence's covering at INDEX_BITS, clipped to each region that owns part of it."""
    bits = covering_bits(fence.radius_m, fence.lat, cells_per_radius)
    cov = hk.cover(fence.routed_geometry(), bits, max_ranges=max_ranges).to_bits(INDEX_BITS)
    cross = fence_def(fence, version).cross_box()
    return {region: FenceBinding(fence.fence_id, version, r, f, cross)
            for region, (r, f) in worldmap.clip(cov.ranges, cov.interior).items()}


def fence_def(fence: Fence, version: int = 1, timeout_s: float = NO_TIMEOUT_S) -> FenceDef:
    return FenceDef(fence_id=fence.fence_id, version=version, geometry=fence.geometry, timeout_s=timeout_s,
                    hysteresis_m=fence.hysteresis_m,
                    where=fence.where, dwell_s=fence.dwell_s, cross=fence.cross)


# -- the stream ------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Chunk:
    """Consecutive updates of the stream (start = index of the first one)."""

    start: int
    ids: list[str]
    lon: F64
    lat: F64
    ts: F64
    extra: list[dict[str, Any] | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self) -> PositionBatch:
        """As x-ingress receives it: no Hilbert index yet."""
        return PositionBatch(self.ids, self.lon, self.lat, self.ts, np.zeros(len(self.ids), np.uint64),
                             self.extra)


@dataclass(frozen=True, eq=False)
class Stream:
    """U updates in publish order: object (index into object_ids), lon, lat, ts."""

    object_ids: list[str]
    obj: npt.NDArray[np.int32]
    lon: F64
    lat: F64
    ts: F64
    extra: list[dict[str, Any] | None] = field(default_factory=list)  # per update (or none at all)

    def __len__(self) -> int:
        return int(self.obj.size)

    def ids(self, lo: int = 0, hi: int | None = None) -> list[str]:
        names = self.object_ids
        return [names[i] for i in self.obj[lo:hi].tolist()]

    def chunks(self, size: int) -> Iterator[Chunk]:
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        for lo in range(0, len(self), size):
            hi = min(lo + size, len(self))
            yield Chunk(lo, self.ids(lo, hi), self.lon[lo:hi], self.lat[lo:hi], self.ts[lo:hi],
                        self.extra[lo:hi])


class Walk:
    """Objects random-walking in the box, one round at a time (every object moves once, in
    a fresh random order): objects start uniform in the box, each step is step_m in a random
    direction, reflected at the box's edges. Long runs (bench/soak.py) take rounds as they go."""

    def __init__(self, n_objects: int, seed: int, object_ids: list[str], box: Box = DEFAULT_BOX,
                 step_m: float = STEP_M) -> None:
        if n_objects < 1:
            raise ValueError("need at least one object")
        self.n, self.box, self.step_m, self.ids = n_objects, box, step_m, object_ids
        self.rng = _rng(seed, 2)
        self.x = self.rng.uniform(0.0, box.side_m, n_objects)
        self.y = self.rng.uniform(0.0, box.side_m, n_objects)

    def rounds(self, ts: F64) -> Stream:
        """len(ts) rounds, round r stamped ts[r]."""
        count, n = len(ts), self.n
        obj = np.empty(count * n, np.int32)
        xs, ys, tss = np.empty(count * n), np.empty(count * n), np.empty(count * n)
        for r in range(count):
            heading = self.rng.uniform(0.0, 2.0 * math.pi, n)
            self.x = _reflect(self.x + self.step_m * np.cos(heading), self.box.side_m)
            self.y = _reflect(self.y + self.step_m * np.sin(heading), self.box.side_m)
            order = self.rng.permutation(n)
            at = slice(r * n, (r + 1) * n)
            obj[at], xs[at], ys[at], tss[at] = order, self.x[order], self.y[order], ts[r]
        lon, lat = self.box.to_lonlat(xs, ys)
        return Stream(self.ids, obj, lon, lat, tss)


def random_walk(n_objects: int, n_updates: int, seed: int, box: Box = DEFAULT_BOX,
                step_m: float = STEP_M, step_s: float = STEP_S, t0: float = T0) -> Stream:
    """U updates of `Walk`, round r stamped t0 + r * step_s. The last round is cut short when
    n_updates is not a multiple of n_objects."""
    if n_objects < 1 or n_updates < 0:
        raise ValueError("need at least one object and a non-negative number of updates")
    rounds = -(-n_updates // n_objects)
    ts = np.asarray(t0 + np.arange(rounds) * step_s, np.float64)
    st = Walk(n_objects, seed, _names("o", n_objects), box, step_m).rounds(ts)
    return Stream(st.object_ids, st.obj[:n_updates], st.lon[:n_updates], st.lat[:n_updates],
                  st.ts[:n_updates].copy())


def _reflect(v: F64, side: float) -> F64:
    v = np.where(v < 0.0, -v, v)
    return np.where(v > side, 2.0 * side - v, v)


# -- the ground truth ------------------------------------------------------------------------

def reference_events(fences: Sequence[Fence], stream: Stream, chunk: int = 100_000,
                     region: npt.NDArray[np.integer[Any]] | None = None) -> list[EventTuple]:
    """ENTER / LEAVE from shapely alone, update by update in stream order (fence.reference),
    and CROSS for the fences that detect it (`region`: each position's, see
    reference.cross_events)."""
    crossing = [f for f in fences if f.cross]
    crossed = reference.cross_events([f.fence_id for f in crossing], [f.geometry for f in crossing],
                                     stream.object_ids, stream.obj, stream.lon, stream.lat, stream.ts, region,
                                     extras=stream.extra or None,
                                     fences=[fence_def(f) for f in crossing]) if crossing else []
    return crossed + reference.reference_events([f.fence_id for f in fences], [f.geometry for f in fences],
                                      stream.object_ids, stream.obj, stream.lon, stream.lat, stream.ts, chunk,
                                      extras=stream.extra or None, fences=[fence_def(f) for f in fences])


def as_tuples(events: Sequence[Event]) -> list[EventTuple]:
    return [(e.event, e.fence_id, e.object_id, e.ts, e.reason) for e in events]


compare = reference.compare


# -- the core pipeline -----------------------------------------------------------------------

@dataclass
class StageTimes:
    """Seconds spent per stage (perf_counter)."""

    ingress: float = 0.0
    geo: float = 0.0
    fence: float = 0.0
    batches: int = 0
    updates: int = 0
    per_worker: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.ingress + self.geo + self.fence


class CorePipeline:
    """x-ingress -> x-geo (one per region) -> x-fence (one per worker), in one process.

    The ceiling of the platform: the routing cores with no broker, no serialisation and no
    network. Per batch, each region's x-geo gets its positions together with the handover
    notices of objects that left it (so an object crossing the border and back within one
    batch is told in time order), and each worker gets one WorkerBatch: what every region
    routed to it, merged, so it sees the batch's positions in time order whatever region they
    came through (a notice and the position it accompanies, one update, are one observation).
    """

    def __init__(self, regions: Sequence[str] = REGIONS, workers: Sequence[str] = WORKERS,
                 worldmap: Worldmap | None = None, hot: dict[str, int] | None = None) -> None:
        self.worldmap = worldmap or Worldmap.over_area(list(regions))
        self.ring = HashRing(list(workers), hot=hot)  # hot: fences with N masters
        self.ingress = XIngress(self.worldmap)
        self.geo = {r: XGeo(r, list(workers), self.ring) for r in self.worldmap.regions}
        self.fence = {w: XFence(w) for w in workers}
        self.times = StageTimes(per_worker={w: 0.0 for w in workers})

    def define(self, fences: Sequence[Fence], ts: float = T0 - 1.0,
               max_ranges: int | None = MAX_RANGES, cells_per_radius: float = CELLS_PER_RADIUS,
               timeout_s: float = NO_TIMEOUT_S, version: int = 1) -> list[Event]:
        """Bind (or re-bind) every fence in the regions it touches or touched and define it
        on its worker, with each region's re-check rows behind the definition (as the
        sidecars do: exchanges/x_geo/sidecar.py)."""
        events: list[Event] = []
        for f in fences:
            per_region = fence_bindings(f, self.worldmap, version, max_ranges, cells_per_radius)
            for w in self.ring.masters(f.fence_id):
                events += self.fence[w].define(fence_def(f, version, timeout_s), ts)
            for region, geo in self.geo.items():
                for w, recheck in (geo.change(f.fence_id, version, per_region.get(region)) or {}).items():
                    if len(recheck.positions):
                        events += self.fence[w].route(recheck)
        for geo in self.geo.values():
            geo.compact()
        return events

    def feed(self, batch: PositionBatch) -> list[Event]:
        t0 = time.perf_counter()
        routed = self.ingress.route(batch)
        t1 = time.perf_counter()
        to_worker: dict[str, list[WorkerBatch]] = {}
        for region, rb in routed.regions.items():
            for w, wb in self.geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate,
                                                announced=rb.announced).items():
                to_worker.setdefault(w, []).append(wb)
        t2 = time.perf_counter()
        events: list[Event] = []
        for w, wbs in to_worker.items():
            tw = time.perf_counter()
            events += self.fence[w].route(WorkerBatch.concat(wbs))
            self.times.per_worker[w] += time.perf_counter() - tw
        t3 = time.perf_counter()
        t = self.times
        t.ingress, t.geo, t.fence = t.ingress + t1 - t0, t.geo + t2 - t1, t.fence + t3 - t2
        t.batches, t.updates = t.batches + 1, t.updates + len(batch)
        return events

    def inside_pairs(self) -> int:
        return sum(int(x.stats()["inside_pairs"]) for x in self.fence.values())
