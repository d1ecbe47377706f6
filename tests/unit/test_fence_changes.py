"""A new, replaced or moved fence decides ENTER / LEAVE from where each object is now.

The cores of the whole pipeline run in one process (x-ingress, two x-geo regions, two x-fence
workers) with a queue per hop, as the broker has them: each region's positions and control
queues, and one link per (region, worker) (x-fence.in, federated: ordered within a region,
not across regions). A scheduler delivers from them either to quiescence after each step of
the script (`sync`) or in a random interleaving (`race`): positions in flight while a fence
is being changed, regions applying a change at different moments, one region's stream
overtaking the other's.

The reference applies the documented rule (fence/x_fence/core.py, "Fence changes") to the
positions alone, in each object's time order: a position is judged against the fence as its
region had it when routing it; when a region applies a change, each object whose latest
position is in that region is decided against the new geometry (ENTER `entered` for a new
fence, `fence_changed` for a replaced one, LEAVE `fence_changed`; at the ts of that latest
position; not entered when last seen more than timeout_s before the change (one inside
that the new geometry holds is left to the timer, which this test does not run); a delete
LEAVEs `fence_deleted`.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch, RegionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_events import Event
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo.core import XGeo
from fence.reference import visit_problems
from fence.spec import bindings
from fence.x_fence.core import XFence
from ingress.core import XIngress

LON0, LAT0, LON1, LAT1 = 9.50, 47.10, 9.53, 47.12  # about 2.3 km x 2.2 km
PACIFIC = (-140.0, -50.0)
WORKERS = ["w0", "w1"]
EventTuple = tuple[str, str, str, float, str]


def split_worldmap() -> Worldmap:
    """Two regions whose border crosses the box."""
    lon, lat = np.meshgrid(np.linspace(LON0, LON1, 64), np.linspace(LAT0, LAT1, 64))
    x, y = hk.lonlat_to_grid(lon.ravel(), lat.ravel(), INDEX_BITS)
    return Worldmap.balanced(["a", "b"], hk.encode_many(x, y, INDEX_BITS))


def positions(rows: list[tuple[str, float, float, float]]) -> PositionBatch:
    lon = np.array([r[1] for r in rows], float)
    lat = np.array([r[2] for r in rows], float)
    return PositionBatch([r[0] for r in rows], lon, lat, np.array([r[3] for r in rows], float),
                         np.zeros(len(rows), np.uint64))


# -------------------------------------------------------------------------- the pipeline


@dataclass
class Sim:
    """The cores of x-ingress, x-geo per region and x-fence per worker, and the queues
    between them; `log` is what each x-geo applied, in its order (for the reference)."""

    worldmap: Worldmap
    workers: list[str] = field(default_factory=lambda: list(WORKERS))
    hot: dict[str, int] = field(default_factory=dict)  # fences with N masters (the ring's hot)

    def __post_init__(self) -> None:
        self.ring = HashRing(self.workers, hot=self.hot)
        self.regions = list(self.worldmap.regions)
        self.ingress = XIngress(self.worldmap)
        self.geo = {r: XGeo(r, self.workers, self.ring) for r in self.regions}
        self.fence = {w: XFence(w) for w in self.workers}
        self.pos_q: dict[str, deque[RegionBatch]] = {r: deque() for r in self.regions}
        self.ctl_q: dict[str, deque[tuple[Any, ...]]] = {r: deque() for r in self.regions}
        self.link: dict[tuple[str, str], deque[tuple[Any, ...]]] = {
            (r, w): deque() for r in self.regions for w in self.workers}
        self.version: dict[str, int] = {}
        self.created: set[tuple[str, int]] = set()  # (fence, the version that created it)
        self.bound: dict[str, set[str]] = {}  # fence -> the regions it binds (the manager's view)
        self.deleted: set[str] = set()
        self.log: dict[str, list[tuple[Any, ...]]] = {r: [] for r in self.regions}
        self.events: list[Event] = []

    # -- sources (the devices' gateway, the fence manager) ---------------------------------

    def publish_positions(self, rows: list[tuple[str, float, float, float]]) -> None:
        for r, rb in self.ingress.route(positions(rows)).regions.items():
            self.pos_q[r].append(rb)

    def publish_change(self, fid: str, geometry: shapely.Geometry, ts: float, timeout_s: float,
                       dwell_s: float = 0.0) -> None:
        v = self.version[fid] = self.version.get(fid, 0) + 1
        if fid not in self.bound:
            self.created.add((fid, v))
        b = bindings(geometry, self.worldmap)
        fence = FenceDef(fence_id=fid, version=v, geometry=geometry, timeout_s=timeout_s, dwell_s=dwell_s)
        told = [r for r in self.regions if r in b.per_region or r in self.bound.get(fid, set())]
        for r in told:
            self.ctl_q[r].append(("define", fence, ts, b.per_region.get(r), told))
        self.bound[fid] = set(b.per_region)

    def publish_drop(self, fid: str, ts: float) -> None:
        v = self.version[fid] = self.version[fid] + 1
        for r in self.regions:
            self.ctl_q[r].append(("drop", fid, v, ts))
        del self.bound[fid]
        self.deleted.add(fid)

    # -- the sidecars, one message at a time ------------------------------------------------

    def geo_positions(self, r: str) -> None:
        rb = self.pos_q[r].popleft()
        routed = self.geo[r].route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced)
        self.log[r].append(("pos", rb, {(w, oid, float(t)) for w, wb in routed.items()
                                        for oid, t in zip(wb.positions.ids, wb.positions.ts, strict=True)}))
        for w, wb in routed.items():
            self.link[(r, w)].append(("pos", wb))

    def geo_control(self, r: str) -> None:
        msg = self.ctl_q[r].popleft()
        geo = self.geo[r]
        if msg[0] == "define":
            _, fence, ts, new, told = msg
            binding = None if new is None else FenceBinding(fence.fence_id, fence.version, *new)
            rechecks = geo.change(fence.fence_id, fence.version, binding)
            self.log[r].append(("change", fence, ts, new is not None, rechecks is not None))
            for w, recheck in (rechecks or {}).items():
                self.link[(r, w)].append(("define", fence, ts, recheck, told, r))
        else:
            _, fid, v, ts = msg
            was_bound = fid in geo.fences()
            geo.remove_bindings([(fid, v)])
            self.log[r].append(("drop", fid, v, ts))
            if was_bound:
                for w in self.ring.masters(fid):
                    self.link[(r, w)].append(("drop", fid, v, ts))

    def worker_input(self, r: str, w: str) -> None:
        msg = self.link[(r, w)].popleft()
        x = self.fence[w]
        if msg[0] == "pos":
            self.events += x.route(msg[1])
        elif msg[0] == "define":
            _, fence, ts, recheck, told, region = msg
            self.events += x.define(fence, ts, told, region)
            self.events += x.route(recheck)
        else:
            _, fid, v, ts = msg
            self.events += x.drop(fid, v, ts)

    # -- scheduling --------------------------------------------------------------------------

    def actions(self) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = [(self.geo_positions, r) for r in self.regions if self.pos_q[r]]
        out += [(self.geo_control, r) for r in self.regions if self.ctl_q[r]]
        out += [(self.worker_input, r, w) for (r, w), q in self.link.items() if q]
        return out

    def quiesce(self) -> None:
        while acts := self.actions():
            fn, *args = acts[0]
            fn(*args)

    def settled(self, fid: str) -> bool:
        """No change of `fid` in flight, nor a position routed with an older version of it:
        a fence's successive changes are not in flight together (see docs/reference.md, "Fence changes")."""
        if any(m[0] != "pos" and (m[1].fence_id if m[0] == "define" else m[1]) == fid
               for q in self.ctl_q.values() for m in q):
            return False
        current = self.version.get(fid, 0)

        def older(wb: WorkerBatch) -> bool:
            v = wb.fence_versions()
            return any(f == fid and int(v[i]) < current for i, f in enumerate(wb.fences))

        for q in self.link.values():
            for m in q:
                if m[0] == "pos":
                    if older(m[1]):
                        return False
                elif (m[1].fence_id if m[0] == "define" else m[1]) == fid or \
                        (m[0] == "define" and older(m[3])):
                    return False
        # rows a worker holds for a handover notice are in flight too
        return not any(older(wb) or any(wb.fences[i] == fid for i in wb.rechecks().tolist() if i >= 0)
                       for x in self.fence.values() for wb in (c.rows for c in x._held.chunks))


# -------------------------------------------------------------------------- scripts


@dataclass(frozen=True)
class Step:
    kind: str  # positions | change | drop
    ts: float
    rows: tuple[tuple[str, float, float, float], ...] = ()
    fence_id: str = ""
    geometry: Any = None
    timeout_s: float = 0.0


def random_geometry(rng: random.Random) -> shapely.Geometry:
    lon, lat = rng.uniform(LON0, LON1), rng.uniform(LAT0, LAT1)
    if rng.random() < 0.5:
        return hk.circle(lon, lat, rng.uniform(150.0, 700.0))
    w, h = rng.uniform(0.002, 0.01), rng.uniform(0.002, 0.008)
    return box(lon - w / 2, lat - h / 2, lon + w / 2, lat + h / 2)


def moved(g: shapely.Geometry, rng: random.Random) -> shapely.Geometry:
    """A small move (a following fence) or a reshape in place."""
    if rng.random() < 0.6:
        return shapely.affinity.translate(g, rng.uniform(-0.003, 0.003), rng.uniform(-0.002, 0.002))
    return shapely.affinity.scale(g, rng.uniform(0.6, 1.5), rng.uniform(0.6, 1.5))


def script(seed: int, with_drops: bool) -> list[Step]:
    """Objects walking (sometimes jumping across the box, or to the South Pacific, or silent
    for a while) and fences created, moved, reshaped, replaced and deleted among them."""
    rng = random.Random(seed)
    objects = [f"o{i}" for i in range(rng.randint(2, 6))]
    where = {o: (rng.uniform(LON0, LON1), rng.uniform(LAT0, LAT1)) for o in objects}
    fences: dict[str, shapely.Geometry] = {}
    steps: list[Step] = []
    t = 1000.0
    for _ in range(rng.randint(15, 60)):
        t += rng.choice([1.0, 1.0, 2.0, 25.0])  # now and then a long pause: timeouts matter
        if rng.random() < 0.25:
            fid = f"f{rng.randint(0, 4)}"
            if fid not in fences:
                fences[fid] = random_geometry(rng)
            elif with_drops and rng.random() < 0.2:
                del fences[fid]
                steps.append(Step("drop", t, fence_id=fid))
                continue
            else:
                fences[fid] = moved(fences[fid], rng) if rng.random() < 0.7 else random_geometry(rng)
            steps.append(Step("change", t, fence_id=fid, geometry=fences[fid],
                              timeout_s=rng.choice([1e6, 40.0])))
            continue
        rows = []
        for o in objects:
            u = rng.random()
            if u < 0.3:
                continue  # silent this round
            lon, lat = where[o]
            if u < 0.34:
                lon, lat = PACIFIC[0] + rng.uniform(-1, 1), PACIFIC[1] + rng.uniform(-1, 1)
            elif u < 0.4 or lon < 0:
                lon, lat = rng.uniform(LON0, LON1), rng.uniform(LAT0, LAT1)
            else:
                lon = min(max(lon + rng.uniform(-0.003, 0.003), LON0), LON1)
                lat = min(max(lat + rng.uniform(-0.002, 0.002), LAT0), LAT1)
            where[o] = (lon, lat)
            rows.append((o, lon, lat, t))
        if rows:
            steps.append(Step("positions", t, tuple(rows)))
    return steps


def run(steps: list[Step], mode: str, seed: int = 0, hot: dict[str, int] | None = None) -> Sim:
    """The script through the cores: `sync` delivers everything after each step; `race`
    interleaves every queue at random (a change is published once its fence is settled).
    `hot`: fences with N masters, over three workers."""
    sim = Sim(split_worldmap(), ["w0", "w1", "w2"], hot) if hot else Sim(split_worldmap())
    rng = random.Random(seed)

    def publish(s: Step) -> None:
        if s.kind == "positions":
            sim.publish_positions(list(s.rows))
        elif s.kind == "change":
            sim.publish_change(s.fence_id, s.geometry, s.ts, s.timeout_s)
        else:
            sim.publish_drop(s.fence_id, s.ts)

    if mode == "sync":
        for s in steps:
            publish(s)
            sim.quiesce()
        return sim
    i = 0
    while True:
        acts = sim.actions()
        if i < len(steps) and (steps[i].kind == "positions" or sim.settled(steps[i].fence_id)):
            acts.append((publish, steps[i]))
        if not acts:
            assert i == len(steps), "the scheduler is stuck"
            return sim
        fn, *args = rng.choice(acts)
        fn(*args)
        if fn is publish:
            i += 1


# -------------------------------------------------------------------------- the reference


def reference(sim: Sim) -> list[EventTuple]:
    """The rule applied to the positions, from what each region applied in its order. A
    fence deleted and created again is two fences here (its lives), as on the worker."""
    def life(fid: str, version: int) -> tuple[str, int]:
        return fid, sum(1 for f, v in sim.created if f == fid and v <= version)

    items: dict[str, list[tuple[float, int, int, tuple[Any, ...]]]] = {}
    drops: list[tuple[tuple[str, int], float]] = []
    for ri, r in enumerate(sim.regions):
        force: dict[tuple[str, int], shapely.Geometry] = {}  # fences as this region has them
        latest: dict[str, tuple[float, float, float]] = {}  # present objects: lon, lat, ts
        seen: dict[str, float] = {}
        for seq, entry in enumerate(sim.log[r]):
            order = ri * 1_000_000 + seq
            if entry[0] == "pos":
                b, notice, routed = entry[1].batch, entry[1].notice, entry[2]
                for i, oid in enumerate(b.ids):
                    lon, lat, ts = float(b.lon[i]), float(b.lat[i]), float(b.ts[i])
                    if ts < seen.get(oid, -np.inf):
                        continue
                    seen[oid] = ts
                    if notice[i]:
                        latest.pop(oid, None)
                        continue
                    inside = {f for f, g in force.items() if shapely.contains_xy(g, lon, lat)}
                    told = {w for w in sim.workers if (w, oid, ts) in routed}
                    items.setdefault(oid, []).append((ts, order, i, ("pos", ts, inside, told, lon, lat)))
                    latest[oid] = (lon, lat, ts)
            elif entry[0] == "change":
                _, fence, ts, binds, applied = entry
                if not applied:
                    continue
                if binds:
                    force[life(fence.fence_id, fence.version)] = fence.geometry
                else:
                    force.pop(life(fence.fence_id, fence.version), None)
                created = (fence.fence_id, fence.version) in sim.created
                for oid, (lon, lat, t) in latest.items():
                    items.setdefault(oid, []).append(
                        (t, order, -1, ("recheck", fence, ts, binds, created, lon, lat, t)))
            else:
                _, fid, v, ts = entry
                force.pop(life(fid, v), None)
                drops.append((life(fid, v), ts))
    for fid, ts in set(drops):
        for oid in items:
            items[oid].append((ts, -1, -1, ("drop", fid, ts)))  # sync: after positions before it

    out: list[EventTuple] = []
    for oid, its in items.items():
        state: set[tuple[str, int]] = set()
        for _, _, _, item in sorted(its, key=lambda x: (x[0], x[1] >= 0, x[1], x[2])):
            if item[0] == "pos":
                _, ts, inside, told, lon, lat = item
                # A worker this region does not send the position to (none of its fences'
                # ranges here hold it, the object's previous position here did not go there,
                # and the object did not just come in from another region) decides nothing.
                after = {f for f in state if sim.ring.owner(f[0], oid) not in told}
                inside = inside | after
                out += [("enter", f[0], oid, ts, "entered") for f in inside - state]
                out += [("leave", f[0], oid, ts, "exited") for f in state - inside]
                state = set(inside)
            elif item[0] == "recheck":
                _, fence, ts, binds, created, lon, lat, t = item
                fid, when = life(fence.fence_id, fence.version), t
                inside = binds and bool(shapely.contains_xy(fence.geometry, lon, lat))
                if inside and fid not in state and t >= ts - fence.timeout_s:  # not if silent too long
                    out.append(("enter", fid[0], oid, when, "entered" if created else "fence_changed"))
                    state.add(fid)
                elif not inside and fid in state:
                    out.append(("leave", fid[0], oid, when, "fence_changed"))
                    state.discard(fid)
            elif item[1] in state:
                last = max(x[0] for x in its if x[3][0] == "pos" and x[0] <= item[2]) if any(
                    x[3][0] == "pos" and x[0] <= item[2] for x in its) else item[2]
                out.append(("leave", item[1][0], oid, max(item[2], last), "fence_deleted"))
                state.discard(item[1])
    return out


def tuples(events: list[Event]) -> list[EventTuple]:
    """The decisions: each event with the time of the position it was decided from."""
    return [(e.event, e.fence_id, e.object_id, e.position_ts, e.reason) for e in events]


def dated(events: list[Event]) -> list[EventTuple]:
    """As published: dated no earlier than the fence's change time."""
    return [(e.event, e.fence_id, e.object_id, e.ts, e.reason) for e in events]


def differences(got: list[EventTuple], want: list[EventTuple]) -> list[str]:
    g, w = Counter(got), Counter(want)
    return ([f"unexpected {e}" for e in sorted((g - w).elements(), key=str)]
            + [f"missing {e}" for e in sorted((w - g).elements(), key=str)])


def alternates(events: list[EventTuple]) -> list[str]:
    """Per (object, fence), as emitted: ENTER and LEAVE alternate, starting with ENTER, and
    never back in time (within one life of the fence: a delete ends it)."""
    last: dict[tuple[str, str], EventTuple] = {}
    bad = []
    for e in events:
        k = (e[2], e[1])
        if k in last and e[3] < last[k][3]:
            bad.append(f"back in time: {e} after {last[k]}")
        if last.get(k, ("leave",))[0] == e[0]:
            bad.append(f"{e[0]} twice in a row: {e}")
        last[k] = e
        if e[4] == "fence_deleted":
            del last[k]
    return bad



# -------------------------------------------------------------------------- the defect


def test_a_new_fence_does_not_enter_an_object_from_where_it_was_long_ago() -> None:
    """The issue's scenario: X was in R's area (no fence there yet), went to the South
    Pacific; R created afterwards gets no ENTER, and X is in no fence."""
    p = box(9.500, 47.100, 9.505, 47.104)
    r = box(9.522, 47.114, 9.527, 47.118)  # about 2 km away; 5 km in the integration test
    sim = Sim(split_worldmap(), ["w0"])
    sim.publish_change("P", p, 1000.0, 3600.0)
    sim.quiesce()
    sim.publish_positions([("X", 9.5025, 47.102, 1001.0)])
    sim.quiesce()
    sim.publish_positions([("X", 9.5245, 47.116, 1003.0)])  # into R's area
    sim.quiesce()
    sim.publish_positions([("X", *PACIFIC, 1005.0)])
    sim.quiesce()
    sim.publish_change("R", r, 1006.0, 3600.0)
    sim.quiesce()
    sim.publish_positions([("X", PACIFIC[0] + 0.01, PACIFIC[1], 1008.0)])
    sim.quiesce()
    assert tuples(sim.events) == [("enter", "P", "X", 1001.0, "entered"),
                                  ("leave", "P", "X", 1003.0, "exited")]
    assert sim.fence["w0"].fences_of("X") == [] and sim.fence["w0"].occupants("R") == []


def test_a_new_fence_enters_the_objects_already_inside_it() -> None:
    """Reason entered, dated at the fence's creation (decided from the object's latest
    position, before it); an object silent longer than the fence's timeout before its
    creation is not entered."""
    sim = Sim(split_worldmap(), ["w0"])
    sim.publish_positions([("parked", 9.5125, 47.1105, 900.0), ("old", 9.5126, 47.1106, 700.0)])
    sim.quiesce()
    sim.publish_change("R", box(9.510, 47.108, 9.515, 47.113), 1000.0, 120.0)
    sim.quiesce()
    assert dated(sim.events) == [("enter", "R", "parked", 1000.0, "entered")]
    assert sim.events[0].position_ts == 900.0
    sim.publish_positions([("old", 9.5127, 47.1107, 1010.0)])  # heard of again: enters
    sim.quiesce()
    assert tuples(sim.events)[1:] == [("enter", "R", "old", 1010.0, "entered")]


def test_a_moved_fence_leaves_and_enters_from_the_latest_positions() -> None:
    """A move decides from where each object is now: q, inside the old place and gone to
    the Pacific, LEAVEs; s, last seen (by the worker) inside the new place but gone
    since, is not entered; t, parked in the new place, is."""
    sim = Sim(split_worldmap(), ["w0"])
    sim.publish_change("F", box(9.500, 47.100, 9.505, 47.104), 1000.0, 3600.0)
    sim.publish_change("G", box(9.515, 47.110, 9.520, 47.114), 1000.0, 3600.0)
    sim.quiesce()
    sim.publish_positions([("q", 9.502, 47.102, 1001.0), ("s", 9.517, 47.112, 1001.0),
                           ("t", 9.512, 47.112, 1001.0)])
    sim.quiesce()
    sim.publish_positions([("s", 9.525, 47.118, 1002.0)])  # leaves G: the worker's last view of s
    sim.quiesce()
    sim.publish_positions([("s", *PACIFIC, 1003.0)])  # not told to the worker (no fence there)
    sim.quiesce()
    before = len(sim.events)
    # moved over s's old place and t
    sim.publish_change("F", box(9.511, 47.110, 9.526, 47.119), 1004.0, 3600.0)
    sim.quiesce()
    assert sorted(dated(sim.events[before:])) == [("enter", "F", "t", 1004.0, "fence_changed"),
                                                  ("leave", "F", "q", 1004.0, "fence_changed")]
    assert sim.fence["w0"].fences_of("s") == []


def test_a_change_overtaken_by_its_regions_is_judged_as_each_region_had_it() -> None:
    """Region b still routes with the old version after the worker took the new one from
    region a: those positions are judged against the old geometry, then b's re-check
    decides against the new one."""
    wm = split_worldmap()
    sim = Sim(wm, ["w0"])
    big = box(LON0, LAT0, LON1, LAT1)
    sim.publish_change("F", big, 1000.0, 3600.0)
    sim.quiesce()
    spots = {r: [] for r in wm.regions}
    for lon in np.linspace(LON0 + 0.001, LON1 - 0.001, 25):
        for lat in np.linspace(LAT0 + 0.001, LAT1 - 0.001, 25):
            x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
            region = wm.regions[int(wm.region_index(np.array([hk.encode(x, y)], np.uint64))[0])]
            spots[region].append((lon, lat))
    (alon, alat), (blon, blat) = spots["a"][0], spots["b"][-1]
    sim.publish_positions([("in_a", alon, alat, 1001.0), ("in_b", blon, blat, 1001.0)])
    sim.quiesce()
    sim.publish_change("F", box(alon - 0.001, alat - 0.001, alon + 0.001, alat + 0.001), 1002.0, 3600.0)
    while sim.ctl_q["a"]:
        sim.geo_control("a")  # a applies the change first ...
    sim.worker_input("a", "w0")  # ... and the worker takes it from a
    sim.publish_positions([("in_b", blon + 1e-5, blat, 1003.0)])
    sim.geo_positions("b")  # b routes with the old binding: still inside the old F
    sim.worker_input("b", "w0")
    assert tuples(sim.events)[2:] == []
    sim.quiesce()  # b's change and re-check: in_b is outside the new F
    assert tuples(sim.events)[2:] == [("leave", "F", "in_b", 1003.0, "fence_changed")]


# -------------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_changes_in_step_with_the_positions_match_the_rule(seed: int) -> None:
    sim = run(script(seed, with_drops=True), "sync")
    got = tuples(sim.events)
    assert differences(got, reference(sim)) == []
    assert alternates(dated(sim.events)) == []
    assert len({e.event_id for e in sim.events}) == len(sim.events)
    assert visit_problems(sim.events) == []


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_changes_racing_the_positions_match_the_rule(seed: int, schedule: int) -> None:
    """Positions in flight while a fence changes, the regions applying it at different
    moments and their streams reaching the worker in any order: each position applied once,
    in time order, judged as its region had the fence; the events are the rule's."""
    sim = run(script(seed, with_drops=False), "race", schedule)
    assert differences(tuples(sim.events), reference(sim)) == []
    assert alternates(dated(sim.events)) == []
    assert len({e.event_id for e in sim.events}) == len(sim.events)
    assert visit_problems(sim.events) == []


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_deletes_racing_the_positions_keep_the_other_fences_exact(seed: int, schedule: int) -> None:
    """With deletes in the race too: the fences never deleted get exactly the rule's events
    (a fence's events depend on it alone), a deleted fence's alternate and end in a LEAVE."""
    sim = run(script(seed, with_drops=True), "race", schedule)
    got = tuples(sim.events)
    kept = [e for e in got if e[1] not in sim.deleted]
    want = [e for e in reference(sim) if e[1] not in sim.deleted]
    assert differences(kept, want) == []
    assert alternates([e for e in dated(sim.events) if e[1] in sim.deleted]) == []
    for w, x in sim.fence.items():
        for fid in sim.deleted:
            if fid not in sim.bound:
                assert fid not in x.fences(), w
    assert len({e.event_id for e in sim.events}) == len(sim.events)
    assert visit_problems(sim.events) == []


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_hot_fences_racing_the_positions_match_the_rule(seed: int, schedule: int) -> None:
    """Hot fences (N masters, each judging the objects it owns): every master gets each
    region's definition and its own objects' re-check rows, deletes reach every master, and
    the events are the rule's, as with one worker per fence."""
    sim = run(script(seed, with_drops=True), "race", schedule, hot={"f0": 2, "f1": 3, "f2": 2})
    got = tuples(sim.events)
    kept = [e for e in got if e[1] not in sim.deleted]
    assert differences(kept, [e for e in reference(sim) if e[1] not in sim.deleted]) == []
    assert alternates(dated(sim.events)) == []
    assert len({e.event_id for e in sim.events}) == len(sim.events)
    assert visit_problems(sim.events) == []
    for w, x in sim.fence.items():  # each master holds only the objects it owns
        for fid in x.fences():
            assert all(sim.ring.owner(fid, o["object_id"]) == w for o in x.occupants(fid))


def test_a_hot_fence_is_defined_on_each_master_and_judged_by_the_owner() -> None:
    sim = Sim(split_worldmap(), ["w0", "w1", "w2"], {"H": 3})
    objects = [(f"o{i}", 9.505 + 0.0005 * i, 47.105, 1000.0) for i in range(30)]
    sim.publish_positions(objects)
    sim.quiesce()
    sim.publish_change("H", box(9.50, 47.10, 9.53, 47.12), 1001.0, 1e6)
    sim.quiesce()
    assert all(x.fence("H") is not None for x in sim.fence.values())
    held = {w: {o["object_id"] for o in x.occupants("H")} for w, x in sim.fence.items()}
    assert set().union(*held.values()) == {o for o, *_ in objects}
    assert sum(len(h) for h in held.values()) == len(objects)  # each object on one master
    assert all(len(h) >= 3 for h in held.values())
    sim.publish_positions([(o, 9.6, 47.2, 1002.0) for o, *_ in objects])  # all leave
    sim.quiesce()
    assert sorted(e.object_id for e in sim.events if e.event == "leave") == sorted(o for o, *_ in objects)
    assert all(not x.occupants("H") for x in sim.fence.values())
