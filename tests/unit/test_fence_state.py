"""The x-fence core against a ground truth computed directly with shapely."""

from __future__ import annotations

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.hash_ring import HashRing
from exchanges.x_geo.core import XGeo
from fence.x_fence.core import XFence


class OneWorker(HashRing):
    def __init__(self) -> None:
        super().__init__(["w0"])


FENCES = {
    "west": box(9.500, 47.100, 9.510, 47.110),
    "east": box(9.510, 47.100, 9.520, 47.110),   # shares an edge with west
    "ring": shapely.Polygon(hk.circle(9.515, 47.105, 700).exterior,
                            [hk.circle(9.515, 47.105, 250).exterior]),
}


class Pipeline:
    """x-geo core + x-fence core in one process (what bench's core-only mode runs)."""

    def __init__(self, fences: dict[str, shapely.Geometry] = FENCES, timeout: float = 60.0) -> None:
        self.geo = XGeo("a", ["w0"], OneWorker())
        self.fence = XFence("w0")
        self.timeout = timeout
        self.version: dict[str, int] = {}
        for fid, g in fences.items():
            self.define(fid, g, ts=0.0)

    def define(self, fid: str, geom: shapely.Geometry, ts: float) -> list:  # type: ignore[type-arg]
        """As the pipeline changes a fence: x-geo binds it and re-checks the objects it has
        in the old or new ranges, behind the definition."""
        v = self.version[fid] = self.version.get(fid, 0) + 1
        cov = hk.cover(geom, 21).to_bits(INDEX_BITS)
        rechecks = self.geo.change(fid, v, FenceBinding(fid, v, cov.ranges, cov.interior))
        events = self.fence.define(FenceDef(fence_id=fid, version=v, geometry=geom, timeout_s=self.timeout),
                                   ts)
        return events + (self.fence.route(rechecks[self.fence.worker]) if rechecks is not None else [])

    def feed(self, points: list[tuple[str, float, float, float]]) -> list[tuple[str, str, str, float, str]]:
        ids = [p[0] for p in points]
        lon = np.array([p[1] for p in points], float)
        lat = np.array([p[2] for p in points], float)
        x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
        b = PositionBatch(ids, lon, lat, np.array([p[3] for p in points], float),
                          hk.encode_many(x, y, INDEX_BITS))
        out = []
        for wb in self.geo.route(b).values():
            out += self.fence.route(wb)
        return [(e.event, e.fence_id, e.object_id, e.ts, e.reason) for e in out]


def truth(points: list[tuple[str, float, float, float]], fences=FENCES):  # type: ignore[no-untyped-def]
    """ENTER/LEAVE from shapely alone: per object, the set of fences containing each position."""
    inside: dict[str, set[str]] = {}
    events = []
    for oid, lon, lat, ts in sorted(points, key=lambda p: (p[3], p[0])):
        now = {f for f, g in fences.items() if shapely.contains_xy(g, lon, lat)}
        before = inside.get(oid, set())
        events += [("enter", f, oid, ts, "entered") for f in sorted(now - before)]
        events += [("leave", f, oid, ts, "exited") for f in sorted(before - now)]
        inside[oid] = now
    return events


def canon(events):  # type: ignore[no-untyped-def]
    return sorted(events, key=lambda e: (e[3], e[2], e[1], e[0]))


def test_trajectory_across_two_adjacent_fences() -> None:
    p = Pipeline()
    path = [("car", 9.495, 47.105, 1.0), ("car", 9.505, 47.105, 2.0), ("car", 9.515, 47.1001, 3.0),
            ("car", 9.525, 47.105, 4.0), ("car", 9.515, 47.105, 5.0)]
    got = []
    for pt in path:
        got += p.feed([pt])
    assert canon(got) == canon(truth(path))
    assert ("enter", "west", "car", 2.0, "entered") in got
    assert ("leave", "west", "car", 3.0, "exited") in got and ("enter", "east", "car", 3.0, "entered") in got
    assert p.fence.fences_of("car") == ["east"]  # (9.515, 47.105) is in the ring's hole


walk = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(9.490, 9.530),
                          st.floats(47.095, 47.115)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(walk, st.lists(st.integers(1, 8), min_size=1, max_size=40))
def test_any_batching_gives_the_shapely_ground_truth(steps, cuts) -> None:  # type: ignore[no-untyped-def]
    points = [(o, lon, lat, float(i)) for i, (o, lon, lat) in enumerate(steps)]
    p = Pipeline()
    got, i, c = [], 0, 0
    while i < len(points):
        n = cuts[c % len(cuts)]
        got += p.feed(points[i:i + n])
        i, c = i + n, c + 1
    assert canon(got) == canon(truth(points))
    # the live map's counts (x-fence inspect "counts") agree with the occupants and the truth
    inside: dict[str, set[str]] = {}
    for o, lon, lat, _ in points:
        for f in FENCES:
            inside.setdefault(f, set()).discard(o)
        for f, g in FENCES.items():
            if shapely.contains_xy(g, lon, lat):
                inside[f].add(o)
    want = {f: len(objs) for f, objs in inside.items() if objs}
    assert p.fence.counts() == want
    assert want == {f: len(p.fence.occupants(f)) for f in p.fence.fences() if p.fence.occupants(f)}


def test_timeout_leave_and_reentry() -> None:
    p = Pipeline(timeout=30.0)
    p.feed([("o", 9.505, 47.105, 100.0)])
    assert p.fence.expire(now=129.0) == []
    ev = p.fence.expire(now=131.0)
    assert [(e.event, e.fence_id, e.reason, e.ts) for e in ev] == [("leave", "west", "timeout", 130.0)]
    assert p.fence.occupants("west") == []
    assert p.feed([("o", 9.505, 47.105, 140.0)]) == [("enter", "west", "o", 140.0, "entered")]


def test_fence_moved_under_a_still_object() -> None:
    p = Pipeline()
    # x-geo re-checks the objects whose latest position is in the old or new ranges
    p.feed([("o", 9.505, 47.105, 10.0), ("q", 9.519, 47.109, 10.0)])
    ev = p.define("west", box(9.515, 47.105, 9.525, 47.115), ts=20.0)  # moved onto q
    assert sorted((e.event, e.object_id, e.reason) for e in ev) == [
        ("enter", "q", "fence_changed"), ("leave", "o", "fence_changed")]
    # routing follows the move: o moving inside the old place gets nothing from west
    assert [e for e in p.feed([("o", 9.506, 47.106, 30.0)]) if e[1] == "west"] == []
    assert [o["object_id"] for o in p.fence.occupants("west")] == ["q"]


def test_fence_deleted_and_version_order() -> None:
    p = Pipeline()
    p.feed([("o", 9.505, 47.105, 10.0)])
    ev = p.fence.drop("west", version=2, ts=11.0)
    assert [(e.event, e.object_id, e.reason) for e in ev] == [("leave", "o", "fence_deleted")]
    assert p.fence.drop("west", version=2, ts=12.0) == []  # idempotent
    assert p.fence.define(FenceDef(fence_id="west", version=1, geometry=FENCES["west"], timeout_s=60.0),
                          13.0) == []  # stale
    assert "west" not in p.fence.fences()


def test_stale_and_redelivered_positions_change_nothing() -> None:
    p = Pipeline()
    batch = [("o", 9.505, 47.105, 10.0), ("o", 9.515, 47.1001, 11.0)]
    first = p.feed(batch)
    assert canon(first) == canon(truth(batch)) and len(first) == 4
    assert p.feed(batch) == []  # redelivery: nothing new
    assert p.feed([("o", 9.495, 47.105, 5.0)]) == []  # older than known: dropped
    assert p.fence.stats()["stale_positions"] >= 1


def test_event_ids_are_stable_and_distinct() -> None:
    path = [("o", 9.495, 47.105, 1.0), ("o", 9.505, 47.105, 2.0), ("o", 9.495, 47.105, 3.0),
            ("o", 9.505, 47.105, 4.0)]
    runs = []
    for _ in range(2):
        p = Pipeline()
        ids = []
        for pt in path:
            for wb in p.geo.route(PositionBatch([pt[0]], np.array([pt[1]]), np.array([pt[2]]),
                                                np.array([pt[3]]), hk.encode_many(
                    *hk.lonlat_to_grid(np.array([pt[1]]), np.array([pt[2]]), 26), 26))).values():
                ids += [e.event_id for e in p.fence.route(wb)]
        runs.append(ids)
    assert runs[0] == runs[1] and len(set(runs[0])) == len(runs[0]) == 3


def test_candidates_of_unknown_fences_are_counted_not_fatal() -> None:
    p = Pipeline()
    p.fence.drop("east", 5, 0.0)  # x-geo still has it bound
    assert p.feed([("o", 9.515, 47.1001, 1.0)]) == [("enter", "ring", "o", 1.0, "entered")]
    assert p.fence.stats()["unknown_fence_candidates"] == 1


def test_bad_fence_definition() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        XFence("w").define(FenceDef(fence_id="f", version=1, geometry=FENCES["west"], timeout_s=0.0), 0.0)
