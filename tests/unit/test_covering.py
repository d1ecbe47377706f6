"""Polygon covering against shapely: no false negatives, interior means inside, coarsening."""

from __future__ import annotations

import math

import numpy as np
import pytest
import shapely
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from shapely.geometry import MultiPolygon, Polygon, box, mapping

import hilbert_c as hk
from hilbert_c.covering import ranges_to_blocks


def unit_to_lonlat(u: np.ndarray, v: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuous grid coordinates back to degrees (the inverse of the kernel's mapping)."""
    return u / ((1 << bits) / 360.0) - 180.0, v / ((1 << bits) / 180.0) - 90.0


def star(cx: float, cy: float, radii: list[float], phase: float) -> Polygon:
    """A star-shaped (so simple) polygon around (cx, cy), radii in degrees."""
    ang = phase + np.linspace(0, 2 * math.pi, len(radii), endpoint=False)
    r = np.asarray(radii)
    return Polygon(np.column_stack([cx + r * np.cos(ang), cy + r * np.sin(ang) * 0.7]))


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Polygon | MultiPolygon, int]:
    """A polygon (maybe with a hole, maybe a multipolygon, maybe grid-aligned) and a bit count
    such that the polygon spans between ~2 and ~400 cells."""
    bits = draw(st.integers(4, 26))
    cell = 360.0 / (1 << bits)
    span = draw(st.floats(2.0, 400.0)) * cell  # radius in degrees
    assume(span < 40.0)
    cx = draw(st.floats(-170.0 + span, 170.0 - span))
    cy = draw(st.floats(-80.0 + span, 80.0 - span))
    kind = draw(st.sampled_from(["star", "holed", "multi", "aligned", "aligned_holed"]))
    n = draw(st.integers(3, 24))
    radii = draw(st.lists(st.floats(0.35, 1.0), min_size=n, max_size=n))
    phase = draw(st.floats(0, 2 * math.pi))
    if kind.startswith("aligned"):
        # vertices exactly on cell corners: edges run along grid lines (the degenerate case)
        x0, y0 = hk.lonlat_to_grid(cx, cy, bits)
        w = max(1, int(span / cell))
        h = max(1, int(span / cell * draw(st.floats(0.3, 1.5))))
        x1, y1 = min(x0 + w, (1 << bits)), min(y0 + h, (1 << bits))
        (lo0, lo1), (la0, la1) = unit_to_lonlat(
            np.array([x0, x1], float), np.array([y0, y1], float), bits)
        outer = box(lo0, la0, lo1, la1)
        if kind == "aligned_holed" and w >= 4 and h >= 4:
            (hl0, hl1), (ha0, ha1) = unit_to_lonlat(
                np.array([x0 + 1, x1 - 1], float), np.array([y0 + 1, y1 - 1], float), bits)
            outer = Polygon(outer.exterior, [box(hl0, ha0, hl1, ha1).exterior])
        return outer, bits
    poly = star(cx, cy, [r * span for r in radii], phase)
    if kind == "holed":
        hole = star(cx, cy, [0.3 * span * min(radii)] * 7, phase)
        poly = Polygon(poly.exterior, [hole.exterior])
    elif kind == "multi":
        other = star(cx + 2.2 * span, cy, [0.5 * span] * max(3, n // 2), phase)
        assume(abs(cx + 3 * span) < 180)
        poly = MultiPolygon([poly, other])
    assume(poly.is_valid and poly.area > 0)
    return poly, bits


def points_in(geom: Polygon | MultiPolygon, n: int, rng: np.random.Generator) -> np.ndarray:
    x0, y0, x1, y1 = geom.bounds
    pts = np.column_stack([rng.uniform(x0, x1, n), rng.uniform(y0, y1, n)])
    return pts[shapely.contains_xy(geom, pts[:, 0], pts[:, 1])]


def boundary_points(geom: Polygon | MultiPolygon, n: int, rng: np.random.Generator) -> np.ndarray:
    lines = geom.boundary
    d = rng.uniform(0, lines.length, n)
    pts = shapely.get_coordinates(shapely.line_interpolate_point(lines, d))
    verts = shapely.get_coordinates(lines)
    return np.concatenate([pts, verts])


def index_of(pts: np.ndarray, bits: int) -> np.ndarray:
    xs, ys = hk.lonlat_to_grid(pts[:, 0], pts[:, 1], bits)
    return hk.encode_many(xs, ys, bits)


def check_shape(cov: hk.Covering) -> None:
    r = cov.ranges
    assert r.dtype == np.uint64 and r.ndim == 2 and r.shape[1] == 2
    assert cov.interior.dtype == np.bool_ and cov.interior.shape == (len(r),)
    assert (r[:, 0] <= r[:, 1]).all()
    assert (r[1:, 0] > r[:-1, 1]).all()  # sorted and disjoint
    adjacent = r[1:, 0] == r[:-1, 1] + np.uint64(1)
    assert not (adjacent & (cov.interior[1:] == cov.interior[:-1])).any()  # merged


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(scenes(), st.randoms(use_true_random=False))
def test_no_false_negatives_and_interior_is_inside(scene, rnd) -> None:  # type: ignore[no-untyped-def]
    geom, bits = scene
    rng = np.random.default_rng(rnd.randrange(2**32))
    cov = hk.cover(geom, bits)
    check_shape(cov)
    assert len(cov) > 0

    # 1. every inside point, every boundary point and every vertex is covered
    pts = np.concatenate([points_in(geom, 3000, rng), boundary_points(geom, 500, rng)])
    assert cov.contains(index_of(pts, bits)).all()

    # 2. interior ranges: random cells, their corners and random points are inside
    inner = cov.ranges[cov.interior]
    if len(inner):
        pick = inner[rng.integers(0, len(inner), 300)]
        span = (pick[:, 1] - pick[:, 0]).astype(np.float64)
        hs = pick[:, 0] + (rng.random(300) * (span + 1)).astype(np.uint64).clip(0, span.astype(np.uint64))
        cx, cy = hk.decode_many(hs, bits)
        for du, dv in [(0, 0), (1, 0), (0, 1), (1, 1), (rng.random(), rng.random())]:
            lon, lat = unit_to_lonlat(cx + du, cy + dv, bits)
            assert shapely.contains_xy(geom, lon, lat).all()

    # 3. no block of the covering is far from the geometry: each touches it
    xs, ys, ks = ranges_to_blocks(cov.ranges, bits)
    side = np.left_shift(1, ks).astype(np.float64)
    lo0, la0 = unit_to_lonlat(xs - 1e-3, ys - 1e-3, bits)
    lo1, la1 = unit_to_lonlat(xs + side + 1e-3, ys + side + 1e-3, bits)
    assert shapely.intersects(shapely.box(lo0, la0, lo1, la1), geom).all()


@pytest.mark.parametrize("bits", [3, 5, 6])
@pytest.mark.parametrize(
    "geom",
    [
        star(10.3, 20.1, [40, 25, 38, 30, 45, 22, 35], 0.3),
        Polygon([(-100, -40), (60, -40), (60, 50), (-100, 50)],
                [[(-50, -10), (20, -10), (20, 30), (-50, 30)]]),
        MultiPolygon([star(-120, 10, [30] * 5, 0.1), star(100, -30, [20, 35, 25, 30], 1.0)]),
        Polygon([(-180, -90), (180, -90), (180, 90), (-180, 90)]),  # the whole world
        box(-90, 0, 0, 45),  # exactly on cell lines at every level
    ],
    ids=["star", "holed-box", "multi", "world", "grid-aligned"],
)
def test_every_cell_exactly_at_small_orders(geom: Polygon | MultiPolygon, bits: int) -> None:
    """Classify every cell of the grid with shapely and compare."""
    cov = hk.cover(geom, bits)
    check_shape(cov)
    side = 1 << bits
    xs, ys = np.meshgrid(np.arange(side), np.arange(side))
    xs, ys = xs.ravel(), ys.ravel()
    lo0, la0 = unit_to_lonlat(xs.astype(float), ys.astype(float), bits)
    lo1, la1 = unit_to_lonlat(xs + 1.0, ys + 1.0, bits)
    cells = shapely.box(lo0, la0, lo1, la1)
    touches = shapely.intersects(cells, geom)
    inside = shapely.within(cells, geom) & ~shapely.intersects(cells, geom.boundary)
    hs = hk.encode_many(xs, ys, bits)
    row = hk.ranges_lookup(cov.ranges, hs)
    covered = row >= 0
    flagged = np.zeros_like(covered)
    flagged[covered] = cov.interior[row[covered]]
    assert (covered == touches).all()  # covered exactly when the closed cell meets the geometry
    assert (flagged == inside).all()  # interior exactly when the closed cell is strictly inside


def test_hole_and_gap_are_not_covered() -> None:
    outer = hk.circle(9.5, 47.1, 3000)
    hole = hk.circle(9.5, 47.1, 1000)
    holed = Polygon(outer.exterior, [hole.exterior])
    cov = hk.cover(holed, 20)
    assert not cov.contains(index_of(np.array([[9.5, 47.1]]), 20))[0]
    two = MultiPolygon([hk.circle(9.40, 47.1, 2000), hk.circle(9.60, 47.1, 2000)])
    cov2 = hk.cover(two, 20)
    assert not cov2.contains(index_of(np.array([[9.50, 47.1]]), 20))[0]
    assert cov2.contains(index_of(np.array([[9.40, 47.1], [9.60, 47.1]]), 20)).all()


def test_geojson_dict_and_feature_equal_shapely() -> None:
    geom = Polygon(hk.circle(9.52, 47.14, 800).exterior, [hk.circle(9.52, 47.14, 200).exterior])
    a = hk.cover(geom, 22)
    b = hk.cover(mapping(geom), 22)
    c = hk.cover({"type": "Feature", "properties": {}, "geometry": mapping(geom)}, 22)
    for other in (b, c):
        assert np.array_equal(a.ranges, other.ranges)
        assert np.array_equal(a.interior, other.interior)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(scenes(), st.integers(1, 40))
def test_max_ranges_keeps_every_cell(scene, k: int) -> None:  # type: ignore[no-untyped-def]
    geom, bits = scene
    fine = hk.cover(geom, bits)
    coarse = hk.cover(geom, bits, max_ranges=k)
    assert len(coarse) <= k
    check_shape(coarse.merged())
    # every fine range lies inside one coarse range
    row = hk.ranges_lookup(coarse.ranges, fine.ranges[:, 0])
    assert (row >= 0).all()
    assert (fine.ranges[:, 1] <= coarse.ranges[row, 1]).all()
    # a coarse interior range is still wholly inside (it only joined interior pieces)
    for i in np.flatnonzero(coarse.interior):
        s, e = coarse.ranges[i]
        parts = fine.ranges[(fine.ranges[:, 0] >= s) & (fine.ranges[:, 1] <= e)]
        assert int((parts[:, 1] - parts[:, 0]).sum()) + len(parts) == int(e - s) + 1
        assert fine.interior[(fine.ranges[:, 0] >= s) & (fine.ranges[:, 1] <= e)].all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(scenes(), st.integers(1, 60), st.integers(1, 60), st.integers(0, 4))
def test_coarsening_a_covering_is_covering_with_that_budget(scene, k1: int, k2: int,  # type: ignore[no-untyped-def]
                                                             finer: int) -> None:
    """What the nightly rebuild relies on to cut a stored covering without its geometry: a
    covering coarsened to k (from any bigger budget, at any finer resolution) is the
    kernel's covering with max_ranges=k."""
    geom, bits = scene
    big, k = max(k1, k2), min(k1, k2)
    fine_bits = min(26, bits + finer)
    got = hk.coarsen(hk.cover(geom, bits, max_ranges=big).to_bits(fine_bits), k)
    want = hk.cover(geom, bits, max_ranges=k).to_bits(fine_bits)
    assert np.array_equal(got.ranges, want.ranges)
    assert np.array_equal(got.interior, want.interior)
    with pytest.raises(ValueError, match="k must be"):
        hk.coarsen(want, 0)


def test_merged_has_no_adjacent_ranges() -> None:
    cov = hk.cover(hk.circle(9.5, 47.0, 5000), 20)
    m = cov.merged()
    assert len(m) < len(cov) and m.cells == cov.cells
    assert (m.ranges[1:, 0] > m.ranges[:-1, 1] + np.uint64(1)).all()


def test_budget_refuses_then_coarsens() -> None:
    big = box(-60, -40, 60, 40)
    with pytest.raises(hk.InvalidGeometry, match="max_ranges"):
        hk.cover(big, 31, max_nodes=200_000)
    cov = hk.cover(big, 31, max_ranges=1000, max_nodes=200_000)
    assert len(cov) <= 1000 and cov.level < 31
    pts = points_in(big, 2000, np.random.default_rng(1))
    assert cov.contains(index_of(pts, 31)).all()


def test_area_ratio_of_a_circle() -> None:
    c = hk.circle(9.5, 47.0, 5000)
    cov = hk.cover(c, 20)
    ratio = cov.area_m2() / hk.geometry_area_m2(c)
    assert 1.0 < ratio <= 1.02
    assert hk.geometry_area_m2(c) == pytest.approx(math.pi * 5000**2, rel=2e-3)


@pytest.mark.parametrize(
    ("geometry", "message"),
    [
        (Polygon([(0, 0), (2, 2), (2, 0), (0, 2)]), "self-intersection at lon=1.0000000, lat=1.0000000"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [0, 0], [1, 1]]]},
         "ring 0 of polygon 0 \\(exterior\\) has 2 distinct points"),
        (Polygon([(0, 0), (1, 1), (2, 2), (0, 0)]), "all vertices lie on one line"),
        (Polygon(), "empty"),
        (shapely.LineString([(0, 0), (1, 1)]), "got LineString"),
        ({"type": "Point", "coordinates": [0, 0]}, "got type 'Point'"),
        ({"type": "Polygon", "coordinates": []}, "polygon 0 has no rings"),
        ({"type": "MultiPolygon", "coordinates": []}, "non-empty 'coordinates'"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, "x"], [1, 1]]]}, "not an array of positions"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [200, 0], [1, 1], [0, 0]]]},
         "vertex 1 \\(200.0, 0.0\\) is not a lon/lat"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [float("nan"), 0], [1, 1], [0, 0]]]},
         "vertex 1 \\(nan, 0.0\\)"),
        ({"type": "Feature", "geometry": None}, "no geometry"),
        (Polygon([(0, 0), (4, 0), (4, 4), (0, 4)], [[(5, 5), (6, 5), (6, 6)]]), "hole lies outside shell"),
    ],
)
def test_invalid_geometry_says_what_is_wrong(geometry, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(hk.InvalidGeometry, match=message):
        hk.cover(geometry, 20)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="bits must be"):
        hk.cover(box(0, 0, 1, 1), 40)
    with pytest.raises(ValueError, match="max_ranges must be >= 1"):
        hk.cover(box(0, 0, 1, 1), 10, max_ranges=0)


@settings(max_examples=300)
@given(st.integers(1, 31).flatmap(
    lambda b: st.tuples(st.just(b), st.lists(st.integers(0, 4**b - 1), min_size=0, max_size=12))))
def test_split_ranges_tiles_each_range_with_maximal_aligned_blocks(case) -> None:  # type: ignore[no-untyped-def]
    bits, cuts = case
    pts = sorted(set(cuts))
    ranges = np.array([(pts[i], pts[i + 1] - 1) for i in range(0, len(pts) - 1, 2)
                       if pts[i + 1] - 1 >= pts[i]], dtype=np.uint64).reshape(-1, 2)
    starts, ks, owner = hk.covering.split_ranges(ranges, bits)
    for row, (s, e) in enumerate(ranges.tolist()):
        mine = owner == row
        blk = list(zip(starts[mine].tolist(), ks[mine].tolist(), strict=True))
        pos = s
        for b_start, k in blk:  # contiguous, aligned, inside the range
            assert b_start == pos and b_start % 4**k == 0
            pos += 4**k
        assert pos == e + 1
        for b_start, k in blk:  # greedy maximal: the next size up would not fit or align
            assert b_start % 4 ** (k + 1) != 0 or b_start + 4 ** (k + 1) - 1 > e or k == bits
