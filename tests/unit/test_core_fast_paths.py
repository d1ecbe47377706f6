"""The cores' fast paths against their general ones, and the behaviour they added:
x-fence's one-observation path and union of same-ts observations, the C point-in-polygon
against shapely, x-geo's handover notices in time order, and the array helpers."""

from __future__ import annotations

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import MultiPolygon, Polygon, box

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.hash_ring import HashRing
from exchanges.object_codes import carry, distinct
from exchanges.worker_batch import WorkerBatch
from exchanges.x_geo.core import XGeo, dense_numbers
from exchanges.x_geo.range_index import group_order
from fence.x_fence.core import XFence
from fence.x_fence.shapes import polygon_edges
from hilbert_c import kernel


class OneWorker(HashRing):
    def __init__(self) -> None:
        super().__init__(["w0"])


FENCES = {
    "west": box(9.500, 47.100, 9.510, 47.110),
    "east": box(9.510, 47.100, 9.520, 47.110),
    "ring": Polygon(hk.circle(9.515, 47.105, 700).exterior, [hk.circle(9.515, 47.105, 250).exterior]),
}


def positions(points: list[tuple[str, float, float, float]]) -> PositionBatch:
    lon = np.array([p[1] for p in points], float)
    lat = np.array([p[2] for p in points], float)
    x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    return PositionBatch([p[0] for p in points], lon, lat, np.array([p[3] for p in points], float),
                         hk.encode_many(x, y, INDEX_BITS))


def pipeline(single_path: bool = True) -> tuple[XGeo, XFence]:
    geo, fence = XGeo("a", ["w0"], OneWorker()), XFence("w0")
    fence.single_observation_path = single_path
    for fid, g in FENCES.items():
        cov = hk.cover(g, 21).to_bits(INDEX_BITS)
        geo.add_binding(FenceBinding(fid, 1, cov.ranges, cov.interior))
        fence.define(FenceDef(fence_id=fid, version=1, geometry=g, timeout_s=60.0), 0.0)
    return geo, fence


def change(geo: XGeo, fence: XFence, fid: str, version: int, geom: shapely.Geometry, ts: float,
           timeout: float = 60.0) -> list:  # type: ignore[type-arg]
    """A fence change as the pipeline makes it: x-geo binds and gives its re-check rows,
    which follow the definition to the worker."""
    cov = hk.cover(geom, 21).to_bits(INDEX_BITS)
    rechecks = geo.change(fid, version, FenceBinding(fid, version, cov.ranges, cov.interior))
    events = fence.define(FenceDef(fence_id=fid, version=version, geometry=geom, timeout_s=timeout), ts)
    return events + (fence.route(rechecks[fence.worker]) if rechecks is not None else [])


def feed(geo: XGeo, fence: XFence, points: list[tuple[str, float, float, float]]) -> list[tuple]:  # type: ignore[type-arg]
    out = []
    for wb in geo.route(positions(points)).values():
        out += [(e.event, e.fence_id, e.object_id, e.ts, e.reason, e.event_id) for e in fence.route(wb)]
    return out


def state(fence: XFence) -> dict[str, list[tuple[str, float]]]:
    return {f: sorted((o["object_id"], o["since"]) for o in fence.occupants(f)) for f in fence.fences()}


walk = st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.floats(9.490, 9.530),
                          st.floats(47.095, 47.115), st.integers(0, 3)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(walk, st.lists(st.integers(1, 8), min_size=1, max_size=20))
def test_one_observation_path_equals_the_general_one(steps, cuts) -> None:  # type: ignore[no-untyped-def]
    """Same events (ids included), same state, whatever the batching; ts repeat and go
    back in time (stale positions, same-ts observations)."""
    points = [(o, lon, lat, float(i - back)) for i, (o, lon, lat, back) in enumerate(steps)]
    fast, general = pipeline(True), pipeline(False)
    i, c = 0, 0
    while i < len(points):
        part = points[i:i + cuts[c % len(cuts)]]
        assert feed(*fast, part) == feed(*general, part)
        i, c = i + len(part), c + 1
    assert state(fast[1]) == state(general[1])
    assert fast[1].stats() == general[1].stats()


@pytest.mark.parametrize("single_path", [True, False])
def test_a_stayer_keeps_its_since(single_path: bool) -> None:
    geo, fence = pipeline(single_path)
    feed(geo, fence, [("o", 9.505, 47.105, 10.0)])
    feed(geo, fence, [("o", 9.506, 47.106, 11.0)])
    assert state(fence)["west"] == [("o", 10.0)]
    feed(geo, fence, [("o", 9.515, 47.1001, 12.0)])  # into east and ring
    assert state(fence)["east"] == [("o", 12.0)] and state(fence)["west"] == []


def bare(wb: WorkerBatch) -> WorkerBatch:
    """The same positions with no candidates (a region whose binding does not hold them)."""
    n = len(wb.positions)
    return WorkerBatch(wb.worker, wb.positions, np.zeros(n + 1, np.int64), [], np.empty(0, np.int32),
                       np.empty(0, bool))


@pytest.mark.parametrize("order", ["bare first", "bare last", "one batch"])
def test_observations_at_one_ts_are_united(order: str) -> None:
    """One update seen twice (a fence bound in two regions during a change), once with no
    candidates, in either order or together: what the copies say is united."""
    geo, fence = pipeline()
    feed(geo, fence, [("o", 9.505, 47.105, 1.0)])  # in west
    wb = geo.route(positions([("o", 9.5051, 47.1051, 2.0)]))["w0"]  # still in west
    parts = [bare(wb), wb] if order != "bare last" else [wb, bare(wb)]
    events = fence.route(WorkerBatch.concat(parts)) if order == "one batch" else \
        [e for p in parts for e in fence.route(p)]
    if order == "bare first":  # the bare copy alone says "in nothing": the exit is told, then undone
        assert [(e.event, e.fence_id) for e in events] == [("leave", "west"), ("enter", "west")]
    else:
        assert events == []
    assert fence.fences_of("o") == ["west"]


def test_handover_notices_are_taken_in_time_order() -> None:
    """o is in west, goes to another region (t=3) and comes back outside west (t=4), all in
    one ingress batch: the region it went to sends its first position there to every worker,
    so the worker hears of the exit at t=3; the notice, in line with the positions, only
    opens that position's gate."""
    geo, fence = pipeline()
    other = XGeo("b", ["w0"], OneWorker())
    feed(geo, fence, [("o", 9.505, 47.105, 1.0)])
    here = positions([("o", 9.505, 47.1051, 2.0), ("o", 9.495, 47.105, 4.0)])
    gone = positions([("o", 9.60, 47.20, 3.0)])
    out = geo.route(here, left=gone, gate=np.array([0.0, 4.0]))
    there = other.route(gone, gate=np.array([3.0]))  # no fences there: still sent, it came in
    events = [(e.event, e.fence_id, e.ts) for e in fence.route(WorkerBatch.concat([out["w0"], there["w0"]]))]
    assert events == [("leave", "west", 3.0)]
    assert geo.objects() == {}


def test_handover_notices_without_crossing_back_equal_objects_left() -> None:
    geo1, _ = pipeline()
    geo2, _ = pipeline()
    first = positions([("o", 9.505, 47.105, 1.0), ("p", 9.515, 47.105, 1.0)])
    geo1.route(first), geo2.route(first)
    here, gone = positions([("p", 9.516, 47.105, 2.0)]), positions([("o", 9.60, 47.20, 2.0)])
    a = geo1.route(here, left=gone)["w0"]
    b = WorkerBatch.concat([geo2.route(here)["w0"],
                            geo2.objects_left(gone.ids, gone.ts, gone.lon, gone.lat, gone.h)["w0"]])
    assert a.positions.ids == b.positions.ids == ["p", "o"]
    assert [a.candidates(i) for i in range(2)] == [b.candidates(i) for i in range(2)]


def test_worker_batch_concat_renumbers_candidates() -> None:
    geo, _ = pipeline()
    a = geo.route(positions([("o", 9.505, 47.105, 1.0)]))["w0"]
    b = geo.route(positions([("p", 9.515, 47.1001, 1.0)]))["w0"]
    ab = WorkerBatch.concat([a, bare(a), b])
    assert ab.positions.ids == ["o", "o", "p"]
    assert [sorted(f for f, _ in ab.candidates(i)) for i in range(3)] == [["west"], [], ["east", "ring"]]
    assert WorkerBatch.concat([a]) is a
    with pytest.raises(ValueError):
        WorkerBatch.concat([])


# -- the C point-in-polygon ------------------------------------------------------------------

SHAPES = [
    hk.circle(9.5, 47.1, 500, 32),
    box(9.5, 47.1, 9.51, 47.11),
    FENCES["ring"],
    MultiPolygon([box(0, 0, 1, 1), box(2, 0, 3, 1)]),
    Polygon([(0, 0), (2, 0), (2, 2), (1, 1), (0, 2)]),  # a notch: a vertex at the ray's height
    Polygon([(0, 0), (4, 0), (4, 1), (3, 1), (3, 2), (1, 2), (1, 1), (0, 1)]),  # horizontal edges
]


def hard_points(geom: Polygon | MultiPolygon, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random points around the shape, its vertices, points on and a hair off its edges,
    and points level with its vertices."""
    ax, ay, bx, by = polygon_edges(geom)  # type: ignore[misc]
    x0, y0, x1, y1 = geom.bounds
    w, h = x1 - x0, y1 - y0
    t = rng.uniform(0, 1, (ax.size, 20))
    on_x = (ax[:, None] + t * (bx - ax)[:, None]).ravel()
    on_y = (ay[:, None] + t * (by - ay)[:, None]).ravel()
    xs = [rng.uniform(x0 - w / 10, x1 + w / 10, 3000), ax, (ax + bx) / 2, on_x,
          on_x + rng.normal(0, 1e-12, on_x.size), rng.uniform(x0, x1, ay.size)]
    ys = [rng.uniform(y0 - h / 10, y1 + h / 10, 3000), ay, (ay + by) / 2, on_y,
          on_y + rng.normal(0, 1e-12, on_y.size), ay]
    return np.concatenate(xs), np.concatenate(ys)


@pytest.mark.parametrize("geom", SHAPES, ids=lambda g: g.geom_type)
def test_point_in_polygon_answers_only_what_shapely_answers(geom: Polygon | MultiPolygon) -> None:
    x, y = hard_points(geom, np.random.default_rng(1))
    edges = polygon_edges(geom)
    assert edges is not None
    n = x.size
    got = kernel.points_in_polygons(edges, np.zeros(n, np.int64), np.full(n, edges[0].size, np.int64), x, y)
    want = shapely.contains_xy(geom, x, y)
    sure = got != kernel.PIP_UNSURE
    assert np.array_equal(got[sure] == kernel.PIP_IN, want[sure])
    assert not (got[:3000] == kernel.PIP_UNSURE).any()  # random points are decided in C
    assert (got == kernel.PIP_UNSURE).sum() < n / 2


def test_point_in_polygon_defers_what_it_cannot_see() -> None:
    edges = polygon_edges(box(0, 0, 1, 1))
    assert edges is not None
    got = kernel.points_in_polygons(edges, np.array([-1, 0, 0]), np.array([-1, 4, 4]),
                                    np.array([0.5, np.nan, 0.5]), np.array([0.5, 0.5, 0.5]))
    assert got.tolist() == [kernel.PIP_UNSURE, kernel.PIP_UNSURE, kernel.PIP_IN]
    assert polygon_edges(Polygon([(0, 0), (2, 2), (2, 0), (0, 2)])) is None  # bow-tie: shapely decides
    with pytest.raises(ValueError, match="beyond"):
        kernel.points_in_polygons(edges, np.array([0]), np.array([9]), np.array([0.5]), np.array([0.5]))


def test_fence_edges_survive_redefinitions_and_drops() -> None:
    """Moving fences re-define often: dead edges are compacted away, answers stay exact."""
    fence = XFence("w0")
    rng = np.random.default_rng(3)
    for v in range(1, 60):
        for i in range(5):
            c = hk.circle(9.5 + rng.uniform(-0.01, 0.01), 47.1 + rng.uniform(-0.01, 0.01), 400, 32)
            fence.define(FenceDef(fence_id=f"m{i}", version=v, geometry=c, timeout_s=60.0), float(v))
        if v % 7 == 0:
            fence.drop("m4", v, float(v))
    edges = fence._edges
    assert edges.used <= 2 * 5 * 32 + 64  # compacted, not 59 * 5 * 32
    codes = np.array([fence._fence_code[f] for f in fence.fences()])
    x, y = rng.uniform(9.48, 9.52, 2000), rng.uniform(47.08, 47.12, 2000)
    for code in codes:
        got = fence._contains(np.full(x.size, code), x, y)
        assert np.array_equal(got, shapely.contains_xy(fence._geoms[code], x, y))


# -- array helpers -------------------------------------------------------------------------

@given(st.lists(st.integers(0, 70_000), max_size=300))
def test_group_order_is_a_stable_sort(values: list[int]) -> None:
    v = np.array(values, np.int64)
    for bound in (max(values, default=0) + 1, 1 << 17, 1 << 40):
        if bound > max(values, default=0):
            assert np.array_equal(group_order(v, bound), np.argsort(v, kind="stable"))


@given(st.lists(st.integers(0, 50), max_size=100), st.integers(51, 5000))
def test_dense_numbers_equal_unique_inverse(values: list[int], bound: int) -> None:
    v = np.array(values, np.int32)
    uniq, inv = np.unique(v, return_inverse=True)
    got_u, got_i = dense_numbers(v, bound)
    assert np.array_equal(got_u, uniq) and np.array_equal(got_i, inv.reshape(-1))


@given(st.lists(st.integers(0, 9), max_size=40))
def test_carry_with_and_without_repeated_objects(codes: list[int]) -> None:
    c = np.array(codes, np.int64)
    values = np.arange(c.size, dtype=np.int64) + 100
    memory = np.arange(10, dtype=np.int64)
    expect, mem = [], memory.copy()
    for code, val in zip(c.tolist(), values.tolist(), strict=True):
        expect.append(int(mem[code]))
        mem[code] = val
    assert carry(c, values, memory).tolist() == expect and memory.tolist() == mem.tolist()
    assert distinct(c, 10) == (len(set(codes)) == len(codes))


def test_event_ids_are_those_of_event_id() -> None:
    """x-fence spells event_id()'s text itself (a tail per instant): same ids."""
    from exchanges.fence_events import Event, event_id

    geo, fence = pipeline()
    events: list[Event] = []
    for wb in geo.route(positions([("o", 9.505, 47.105, 1.5), ("p", 9.515, 47.1001, 2.25),
                                   ("o", 9.515, 47.1001, 1e9 + 0.1)])).values():
        events += fence.route(wb)
    events += change(geo, fence, "west", 2, box(9.51, 47.10, 9.52, 47.11), 3.0, timeout=2e9)
    events += fence.drop("ring", 2, 4.0)
    events += fence.expire(now=2e9)
    assert {e.reason for e in events} == {"entered", "exited", "fence_changed", "fence_deleted", "timeout"}
    version = {"west": 1, "east": 1, "ring": 1}
    for e in events:
        # west's change decided at v2 (fence_changed), and its timer ran after it
        v = 2 if e.fence_id == "west" and e.reason in ("fence_changed", "timeout") else version[e.fence_id]
        assert e.event_id == event_id(e.fence_id, v, e.object_id, e.event, e.reason, e.position_ts)
        assert e.ts >= e.position_ts
        assert e == Event(e.event, e.fence_id, e.object_id, e.ts, e.reason, e.event_id)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=60), st.lists(st.integers(0, 2**64 - 1), max_size=60),
       st.booleans())
def test_match_sorted_equals_searchsorted(keys: list[int], needles: list[int], sort: bool) -> None:
    k = np.unique(np.array(keys, np.uint64))
    q = np.array(sorted(needles) if sort else needles, np.uint64)
    if k.size and q.size:  # needles equal to keys too
        q[::2] = k[np.arange(q[::2].size) % k.size]
        if sort:
            q.sort()
    hit, at = kernel.match_sorted(k, q)
    j = np.searchsorted(k, q)
    found = j < k.size
    found[found] = k[j[found]] == q[found]
    assert hit.tolist() == np.flatnonzero(found).tolist() and at.tolist() == j[found].tolist()
