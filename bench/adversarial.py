"""Adversarial positions through every role's core (issue 34): how long one batch holds each
role's event loop, whatever the positions.

    python -m bench.adversarial [--objects 10000] [--fences 2000] [--subscribers 200]
                                [--batch 1000] [--workers 2] [--seed 1]

The world: fences (32-gons, 150-600 m; a quarter each plain, with a 25 m hysteresis band, a
30 s dwell time, CROSS) and objects in five places (Montreal, Vaduz, both sides of the
antimeridian at Fiji, 84 N), proximity subscriptions on some objects (500 m, a few of 5 km and
50 km), three regions over the whole globe, the workers given. Every object has a position and
the pairs inside are known before the cases start.

The cases, each a run of batches (`--batch` rows): an ordinary batch (20 m steps), then
antipodal jumps, both poles, the antimeridian in both directions, (0, 0), ten objects
teleporting a hundred times each in a batch, one object teleporting `--batch` times, every
object jumping in one batch of `--objects` rows, and everyone back home.

Per case and role, the longest batch: x-ingress (its core, the proximity router, the map tap),
each x-geo (a region's routing), each x-fence (the worker's fence core and proximity matcher),
and, from single-row batches of the same kinds, the worst row. Times are perf_counter in one
process, the cores only (no broker, no serialisation): what a role's loop spends on a batch.
Target: no batch of 1,000 rows above 50 ms in any role (a larger batch is shown per 1,000 rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bench import report
from bench import workload as wl
from exchanges.batch import PositionBatch
from exchanges.hash_ring import HashRing
from exchanges.roam_cells import BlockOwners
from exchanges.roam_routing import DEFAULT_GRID, RoamRouter
from exchanges.subscriptions import Subscription
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from fence.x_fence.roaming import SLICE_ROWS, RoamMatcher, Rows
from ingress.map_tap import MapSampler

F64 = npt.NDArray[np.float64]
TARGET_MS = 50.0
PLACES = {"Montreal": (-73.57, 45.50), "Vaduz": (9.55, 47.15), "Fiji east": (179.93, -17.0),
          "Fiji west": (-179.93, -17.0), "84 N": (20.0, 84.0)}
SIDE_M = 12_000.0  # a place's box: the Fiji ones stay on their side of the antimeridian


@dataclass
class Times:
    """Seconds per role for one batch."""

    roles: dict[str, float] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=dict)  # the longest call without a yield
    events: int = 0
    roam_events: int = 0

    def add(self, role: str, seconds: float) -> None:
        self.roles[role] = self.roles.get(role, 0.0) + seconds
        self.held[role] = max(self.held.get(role, 0.0), seconds)


class World:
    """Every role's core in one process: x-ingress (core, proximity router, map tap), an x-geo
    per region, an x-fence per worker with its proximity matcher."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rng = np.random.default_rng(args.seed)
        workers = [f"w{i}" for i in range(args.workers)]
        worldmap = Worldmap.over_area(["a", "b", "c"], bbox=(-180.0, -90.0, 180.0, 90.0))
        self.pipe = wl.CorePipeline(regions=("a", "b", "c"), workers=workers, worldmap=worldmap)
        ring = HashRing(workers)
        grid = DEFAULT_GRID
        self.router = RoamRouter(grid, BlockOwners(grid, workers, ring.nodes_for_many))
        self.matchers = [RoamMatcher(grid, BlockOwners(grid, workers, ring.nodes_for_many), i)
                         for i in range(len(workers))]
        self.tap = MapSampler()
        self.workers = workers
        # objects: an equal share per place, uniform in its box
        n = args.objects
        self.ids = [f"obj-{i:06d}" for i in range(n)]
        home = np.array(list(PLACES.values()))[np.arange(n) % len(PLACES)]
        self.place_of = np.arange(n) % len(PLACES)
        jitter = self.rng.uniform(-0.5, 0.5, (n, 2)) * SIDE_M
        self.lon = home[:, 0] + jitter[:, 0] / (111_195.0 * np.cos(np.radians(home[:, 1])))
        self.lat = home[:, 1] + jitter[:, 1] / 111_195.0
        self.home = np.c_[self.lon, self.lat]
        self.ts = wl.T0
        # fences: a quarter each plain, hysteresis, dwell, cross, spread over the places
        fences: list[wl.Fence] = []
        per = max(1, args.fences // len(PLACES))
        for p, (lon, lat) in enumerate(PLACES.values()):
            box = wl.Box(lon, lat, SIDE_M)
            for k, f in enumerate(wl.make_fences(per, seed=args.seed + p, box=box, radius_m=(150.0, 600.0))):
                f = dataclasses.replace(f, fence_id=f"p{p}-{f.fence_id}")
                kind = k % 4
                fences.append(dataclasses.replace(f, hysteresis_m=25.0) if kind == 1 else
                              dataclasses.replace(f, dwell_s=30.0) if kind == 2 else
                              dataclasses.replace(f, cross=True) if kind == 3 else f)
        self.fences = fences
        self.pipe.define(fences, ts=self.ts - 10.0, timeout_s=1e9)
        # proximity subscriptions on some objects
        radii = [500.0] * 17 + [5_000.0] * 2 + [50_000.0]
        subs = [Subscription(f"near-{i}", self.ids[int(o)], radii[i % len(radii)])
                for i, o in enumerate(self.rng.choice(n, args.subscribers, replace=False))]
        for s in subs:
            self.router.set_radius(s.object, max(self.router.radius(s.object), s.radius_m))
            for m in self.matchers:
                m.add(s)
        self.subs = subs

    def feed(self, rows: np.ndarray, lon: F64, lat: F64) -> Times:
        """One batch: objects `rows` (indices, repeats allowed) at lon/lat, one second later."""
        self.ts += 1.0
        ids = [self.ids[i] for i in rows.tolist()]
        ts = np.full(len(ids), self.ts)
        batch = PositionBatch(ids, lon, lat, ts, np.zeros(len(ids), np.uint64), [])
        t = Times()
        pipe = self.pipe
        t0 = time.perf_counter()
        routed = pipe.ingress.route(batch)
        shares = self.router.route(ids, lon, lat, ts)
        self.tap.note(batch)
        t.add("x-ingress", time.perf_counter() - t0)
        to_worker: dict[str, list[WorkerBatch]] = {}
        for region, rb in routed.regions.items():
            t0 = time.perf_counter()
            got = pipe.geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced)
            t.add(f"x-geo {region}", time.perf_counter() - t0)
            for w, wb in got.items():
                to_worker.setdefault(w, []).append(wb)
        for i, w in enumerate(self.workers):
            # as the sidecar runs them: the fence core's step, then the proximity rows in
            # slices of SLICE_ROWS, the loop given back between them (fence/x_fence/sidecar.py)
            t0 = time.perf_counter()
            if w in to_worker:
                t.events += len(pipe.fence[w].route(WorkerBatch.concat(to_worker[w])))
            t.add(f"x-fence {w}", time.perf_counter() - t0)
            share = shares.get(i)
            if share is not None:
                r = share.rows
                part = Rows(batch.take(r), share.prev_lon, share.prev_lat, share.prev_extra)
                t0 = time.perf_counter()
                for found in self.matchers[i].apply_sliced([part]):
                    t.roam_events += len(found)
                    t.add(f"x-fence {w}", time.perf_counter() - t0)
                    t0 = time.perf_counter()
        self.lon[rows], self.lat[rows] = lon, lat
        return t


# --------------------------------------------------------------------------- the cases

Case = Callable[[World, int], tuple[np.ndarray, F64, F64]]  # (world, rows) -> (objects, lon, lat)


def _some(w: World, n: int, where: np.ndarray | None = None) -> np.ndarray:
    pool = np.arange(len(w.ids)) if where is None else np.flatnonzero(where)
    return w.rng.choice(pool, min(n, pool.size), replace=False)


def ordinary(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = _some(w, n)
    step = w.rng.normal(0.0, 20.0 / 111_195.0, (o.size, 2))
    return o, w.lon[o] + step[:, 0], np.clip(w.lat[o] + step[:, 1], -90, 90)


def antipodes(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = _some(w, n)
    return o, np.where(w.lon[o] > 0, w.lon[o] - 180.0, w.lon[o] + 180.0), -w.lat[o]


def north_pole(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = _some(w, n)
    return o, w.rng.uniform(-180, 180, o.size), 90.0 - w.rng.uniform(0, 1e-4, o.size)


def south_pole(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = _some(w, n)
    return o, w.rng.uniform(-180, 180, o.size), -90.0 + w.rng.uniform(0, 1e-4, o.size)


def _across(w: World, n: int, frm: str) -> tuple[np.ndarray, F64, F64]:
    """Objects of one Fiji box to the mirror place on the other side of the antimeridian."""
    p = list(PLACES).index(frm)
    o = _some(w, n, w.place_of == p)
    return o, -w.lon[o], w.lat[o]


def antimeridian_east_to_west(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    return _across(w, n, "Fiji east")


def antimeridian_west_to_east(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    return _across(w, n, "Fiji west")


def null_island(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = _some(w, n)
    return o, np.zeros(o.size), np.zeros(o.size)


def _far(w: World, k: int) -> tuple[F64, F64]:
    return w.rng.uniform(-180, 180, k), np.degrees(np.arcsin(w.rng.uniform(-1, 1, k)))


def teleports(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    """Ten objects, each teleporting n / 10 times within the batch."""
    o = np.repeat(_some(w, 10), max(1, n // 10))
    w.rng.shuffle(o)
    return (o, *_far(w, o.size))


def one_object(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = np.repeat(_some(w, 1), n)
    return (o, *_far(w, n))


def everyone(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    """Every object jumps somewhere on Earth, in one batch (n ignored)."""
    o = np.arange(len(w.ids))
    return (o, *_far(w, o.size))


def back_home(w: World, n: int) -> tuple[np.ndarray, F64, F64]:
    o = np.arange(len(w.ids))
    return o, w.home[:, 0].copy(), w.home[:, 1].copy()


CASES: list[tuple[str, Case, bool]] = [  # (name, case, whole: one batch of every object)
    ("ordinary (20 m steps)", ordinary, False), ("antipodal jumps", antipodes, False),
    ("north pole", north_pole, False), ("south pole", south_pole, False),
    ("antimeridian E->W", antimeridian_east_to_west, False),
    ("antimeridian W->E", antimeridian_west_to_east, False), ("(0, 0)", null_island, False),
    ("10 objects x100 teleports", teleports, False), ("1 object x1000 teleports", one_object, False),
    ("every object in one batch", everyone, True), ("everyone back home", back_home, True),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--fences", type=int, default=2_000)
    ap.add_argument("--subscribers", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--batches", type=int, default=3, help="batches per case (the longest is shown)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    progress = report.Progress("setting up")
    progress.show(f"{args.fences:,} fences, {args.objects:,} objects, {args.subscribers} subscriptions")
    w = World(args)
    for lo in range(0, args.objects, args.batch):  # every object's first position, then some rounds
        o = np.arange(lo, min(lo + args.batch, args.objects))
        w.feed(o, w.lon[o].copy(), w.lat[o].copy())
    for _ in range(3):
        w.feed(*ordinary(w, args.batch))
    progress.close()
    print(f"adversarial positions: {len(w.fences):,} fences (plain, hysteresis 25 m, dwell 30 s, cross), "
          f"{args.objects:,} objects in {len(PLACES)} places, {args.subscribers} proximity subscriptions, "
          f"3 regions, {args.workers} workers, batches of {args.batch:,}")
    roles = ["x-ingress", *(f"x-geo {r}" for r in w.pipe.geo), *(f"x-fence {x}" for x in w.workers)]
    rows, worst_batch, worst_row = [], 0.0, 0.0
    progress = report.Progress("cases", len(CASES))
    for done, (name, case, whole) in enumerate(CASES):
        longest: dict[str, float] = {}
        held: dict[str, float] = {}
        events = roam = size = 0
        for _ in range(1 if whole else args.batches):
            objs, lon, lat = case(w, args.batch)
            t = w.feed(objs, lon, lat)
            size = max(size, objs.size)
            events, roam = events + t.events, roam + t.roam_events
            for r, sec in t.roles.items():
                longest[r] = max(longest.get(r, 0.0), sec)
                held[r] = max(held.get(r, 0.0), t.held[r])
            if not whole:  # and back, so the next batch jumps from home again
                home = w.home[objs]
                w.feed(objs, home[:, 0].copy(), home[:, 1].copy())
        row_worst: dict[str, float] = {}
        if not whole:  # single rows of the same kind: the worst one
            for _ in range(20):
                objs, lon, lat = case(w, 1)
                t = w.feed(objs[:1], lon[:1], lat[:1])
                for r, sec in t.roles.items():
                    row_worst[r] = max(row_worst.get(r, 0.0), sec)
                home = w.home[objs[:1]]
                w.feed(objs[:1], home[:, 0].copy(), home[:, 1].copy())
        per_k = 1_000.0 / max(size, 1)
        norm = {r: sec * (per_k if size > 1_000 else 1.0) for r, sec in held.items()}
        worst_batch = max(worst_batch, *norm.values())
        worst_row = max([worst_row, *row_worst.values()])
        rows.append([name, f"{size:,}", *(report.fmt(longest.get(r, 0.0) * 1e3, ".1f") for r in roles),
                     report.fmt(max(longest.values()) * 1e3, ".1f"),
                     report.fmt(max(norm.values()) * 1e3, ".1f"),
                     report.fmt(max(row_worst.values()) * 1e3, ".2f") if row_worst else "-",
                     f"{events:,}", f"{roam:,}"])
        progress.update(done + 1)
    progress.close()
    print(report.table(["case", "rows", *(f"{r} ms" for r in roles), "batch ms", "held /1k ms",
                        "worst row ms", "events", "nearby/faraway"], rows))
    print(f"role columns and `batch`: the longest batch of the case, each role's whole time on it; "
          f"`held /1k`: the longest the batch held any role's loop without giving it back (x-fence "
          f"yields between its fence step and each slice of {SLICE_ROWS} proximity rows), per 1,000 "
          f"rows; `worst row`: single-row batches of the kind; events: ENTER/LEAVE/CROSS of the case's "
          f"batches, and the proximity events")
    ordinary_ms = float(rows[0][len(roles) + 2].replace(",", ""))
    busiest = max(rows, key=lambda r: float(r[len(roles) + 2].replace(",", "")))
    verdict = "PASS" if worst_batch * 1e3 <= TARGET_MS else "FAIL"
    print(report.summary([f"longest hold of any role's loop {worst_batch * 1e3:.1f} ms per 1,000 rows "
                          f"(target {TARGET_MS:.0f} ms)", f"ordinary batch {ordinary_ms:.1f} ms",
                          f"busiest batch {busiest[len(roles) + 2]} ms ({busiest[0]}, "
                          f"{busiest[-1]} proximity events)", f"worst single row {worst_row * 1e3:.2f} ms"],
                         verdict))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
