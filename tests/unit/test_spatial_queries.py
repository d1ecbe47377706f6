"""Spatial queries over last known positions (exchanges/x_geo/queries.py, XGeo.query): objects
walk across two regions through real x-ingress and x-geo cores; every region answers from its
memory, the answers are merged, and the result is a brute-force scan of the objects' latest
positions (shapely for polygons, haversine for distances), page by page."""

from __future__ import annotations

import math

import numpy as np
import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st
from shapely.geometry import Point, box

from exchanges.batch import PositionBatch
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap
from exchanges.x_geo import queries
from exchanges.x_geo.core import XGeo
from ingress.core import XIngress

AREA = (9.50, 47.10, 9.56, 47.16)


Latest = dict[str, tuple[float, float, float]]


def world(seed: int, n: int = 300, steps: int = 6) -> tuple[dict[str, XGeo], Latest]:
    """Objects walking (and some leaving the area for good), routed through the cores; their
    latest positions."""
    rng = np.random.default_rng(seed)
    wm = Worldmap.over_area(["a", "b"], AREA)
    ring = HashRing(["w0"])
    geo = {r: XGeo(r, ["w0"], ring) for r in wm.regions}
    ingress = XIngress(wm)
    x0, y0, x1, y1 = AREA
    lon, lat = rng.uniform(x0, x1, n), rng.uniform(y0, y1, n)
    latest: Latest = {}
    for t in range(steps):
        lon = np.clip(lon + rng.normal(0, 0.004, n), x0, x1)
        lat = np.clip(lat + rng.normal(0, 0.004, n), y0, y1)
        movers = np.flatnonzero(rng.random(n) < 0.7)
        ids = [f"o{i:03d}" for i in movers.tolist()]
        batch = PositionBatch(ids, lon[movers], lat[movers], np.full(movers.size, 100.0 + t),
                              np.zeros(movers.size, np.uint64))
        for region, rb in ingress.route(batch).regions.items():
            geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced)
        for i in movers.tolist():
            latest[f"o{i:03d}"] = (float(lon[i]), float(lat[i]), 100.0 + t)
    return geo, latest


def ask(geo: dict[str, XGeo], msg: dict[str, object]) -> dict[str, object]:
    q = queries.parse(msg)
    return queries.merge(q, [g.query(q) for g in geo.values()])


def all_pages(geo: dict[str, XGeo], msg: dict[str, object]) -> list[str]:
    got: list[str] = []
    after = ""
    while True:
        page = ask(geo, {**msg, "after": after})
        got += [r["id"] for r in page["objects"]]  # type: ignore[attr-defined]
        if "next_after" not in page:
            return got
        after = str(page["next_after"])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(1, 50))
def test_bbox_and_polygon_queries_are_a_scan_of_the_latest_positions(seed: int, u: float, v: float,
                                                                     limit: int) -> None:
    geo, latest = world(seed)
    x0, y0, x1, y1 = AREA
    cx, cy = x0 + u * (x1 - x0), y0 + v * (y1 - y0)
    bb = [cx - 0.01, cy - 0.008, cx + 0.012, cy + 0.01]
    want = sorted(o for o, (x, y, _) in latest.items() if bb[0] <= x <= bb[2] and bb[1] <= y <= bb[3])
    assert all_pages(geo, {"query": "bbox", "bbox": bb, "limit": limit}) == want
    poly = Point(cx, cy).buffer(0.012).difference(box(cx, cy - 0.003, cx + 0.02, cy + 0.003))  # a notch
    want = sorted(o for o, (x, y, _) in latest.items() if shapely.contains_xy(poly, x, y))
    shape = shapely.geometry.mapping(poly)
    assert all_pages(geo, {"query": "within", "shape": shape, "limit": limit}) == want
    rows = ask(geo, {"query": "bbox", "bbox": bb, "limit": 10_000})["objects"]
    assert all(latest[r["id"]] == (r["lon"], r["lat"], r["ts"]) for r in rows)  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(10.0, 3000.0),
       st.integers(1, 40))
def test_nearby_is_the_k_nearest_within_the_radius(seed: int, u: float, v: float, radius: float,
                                                    k: int) -> None:
    geo, latest = world(seed)
    x0, y0, x1, y1 = AREA
    px, py = x0 + u * (x1 - x0), y0 + v * (y1 - y0)
    d = {o: queries.distance_m(px, py, np.array([x]), np.array([y]))[0] for o, (x, y, _) in latest.items()}
    want = sorted((dist, o) for o, dist in d.items() if dist <= radius)[:k]
    got = ask(geo, {"query": "nearby", "point": [px, py], "radius_m": radius, "limit": k})["objects"]
    assert [(r["distance_m"], r["id"]) for r in got] == want  # type: ignore[attr-defined]


def test_haversine_matches_a_known_distance() -> None:
    # Vaduz to Zurich main station: about 78.5 km on the sphere
    d = queries.distance_m(9.5209, 47.1410, np.array([8.5402]), np.array([47.3782]))[0]
    assert math.isclose(d, 78_500, rel_tol=0.02)


def test_an_object_that_left_a_region_is_answered_by_the_region_it_is_in() -> None:
    wm = Worldmap.over_area(["a", "b"], AREA)
    ring = HashRing(["w0"])
    geo = {r: XGeo(r, ["w0"], ring) for r in wm.regions}
    ingress = XIngress(wm)
    for t, (x, y) in enumerate([(9.501, 47.101), (9.559, 47.159)]):  # across the regions
        batch = PositionBatch(["o"], np.array([x]), np.array([y]), np.array([1.0 + t]),
                              np.zeros(1, np.uint64))
        for region, rb in ingress.route(batch).regions.items():
            geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced)
    got = ask(geo, {"query": "bbox", "bbox": list(AREA), "limit": 10})["objects"]
    assert [(r["id"], r["lon"], r["ts"]) for r in got] == [("o", 9.559, 2.0)]  # type: ignore[attr-defined]
    assert sum(len(g.query(queries.parse({"query": "bbox", "bbox": list(AREA)}))) for g in geo.values()) == 1


@pytest.mark.parametrize(("msg", "says"), [
    ({"query": "knn"}, "query"),
    ({"query": "bbox", "bbox": [1, 2, 3]}, "bbox"),
    ({"query": "bbox", "bbox": [3, 2, 1, 4]}, "lon0 <= lon1"),
    ({"query": "bbox", "bbox": [0, 0, 1, 91]}, "lat"),
    ({"query": "bbox", "bbox": [0, 0, 1, 1], "limit": 0}, "limit"),
    ({"query": "bbox", "bbox": [0, 0, 1, 1], "limit": True}, "limit"),
    ({"query": "within", "shape": {"type": "Point", "coordinates": [0, 0]}}, "Polygon"),
    ({"query": "within", "shape": {"type": "Polygon",
                                  "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}}, "valid"),
    ({"query": "within", "shape": "not json"}, "shape"),
    ({"query": "nearby", "point": [0, 0], "radius_m": -1}, "radius_m"),
    ({"query": "nearby", "point": [200, 0], "radius_m": 5}, "lon"),
    ({"query": "nearby", "point": "here", "radius_m": 5}, "point"),
])
def test_a_bad_query_says_what_is_wrong(msg: dict[str, object], says: str) -> None:
    with pytest.raises(queries.InvalidQuery, match=says):
        queries.parse(msg)


def test_a_query_survives_the_wire() -> None:
    for msg in ({"query": "bbox", "bbox": [9.5, 47.1, 9.6, 47.2], "limit": 5, "after": "o1"},
                {"query": "within", "shape": shapely.geometry.mapping(box(9.5, 47.1, 9.6, 47.2))},
                {"query": "nearby", "point": [9.5, 47.1], "radius_m": 250.0, "limit": 3}):
        q = queries.parse(msg)
        again = queries.parse(q.to_wire())
        assert (again.kind, again.bbox, again.point, again.radius_m, again.limit, again.after) == \
            (q.kind, q.bbox, q.point, q.radius_m, q.limit, q.after)
        assert (again.shape is None) == (q.shape is None) and (q.shape is None or again.shape.equals(q.shape))
