"""fence/spec.py: GeoJSON Features in, validated FenceSpecs and per-region Hilbert bindings out.

The bindings are checked against ground truth computed independently: points sampled with
shapely, their Hilbert index from the kernel at INDEX_BITS, and the worldmap's own lookup.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import shapely
from shapely.geometry import MultiPolygon, Polygon, box, mapping

import hilbert_c as hk
from exchanges import fence_def
from exchanges.fence_binding import INDEX_BITS
from exchanges.fence_def import (
    MAX_EXTENT_DEG,
    MAX_VERTICES,
    InvalidFence,
    check_fence_id,
    check_geometry,
)
from exchanges.fence_options.timeout import DEFAULT_TIMEOUT_S
from exchanges.worldmap import Worldmap
from fence import spec
from fence.spec import MAX_BITS, MAX_RANGES, MIN_BITS, bindings, choose_bits, from_feature

YARD = box(9.500, 47.100, 9.510, 47.110)


def feature(geometry: Any, props: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    geo = dict(mapping(geometry)) if isinstance(geometry, Polygon | MultiPolygon) else geometry
    return {"type": "Feature", "geometry": geo, "properties": props, **top}


def ring(n: int, lon: float = 9.5, lat: float = 47.1, r: float = 0.01) -> list[list[float]]:
    """A closed GeoJSON ring of exactly n positions (n - 1 distinct vertices on a circle)."""
    ang = np.linspace(0.0, 2 * np.pi, n - 1, endpoint=False)
    pts = np.c_[lon + r * np.cos(ang), lat + r * np.sin(ang)].tolist()
    return [*pts, pts[0]]


# --------------------------------------------------------------------------- from_feature


def test_polygon_feature_with_all_properties() -> None:
    f = feature(YARD, {"fence_id": "yard-1", "name": "Yard", "timeout_s": 60})
    s = from_feature(f, owner="alice")
    assert s.fence_id == "yard-1"
    assert s.name == "Yard"
    assert s.timeout_s == 60.0 and isinstance(s.timeout_s, float)
    assert s.owner == "alice"
    assert isinstance(s.geometry, Polygon)
    assert s.geometry.equals(YARD)
    assert s.bbox() == pytest.approx((9.500, 47.100, 9.510, 47.110))
    assert shapely.geometry.shape(s.geojson()).equals(YARD)


def test_multipolygon_feature() -> None:
    mp = MultiPolygon([box(9.50, 47.10, 9.51, 47.11), box(9.53, 47.12, 9.54, 47.13)])
    s = from_feature(feature(mp, {"id": "two-parts"}))
    assert isinstance(s.geometry, MultiPolygon)
    assert len(s.geometry.geoms) == 2
    assert s.geometry.equals(mp)
    assert s.bbox() == pytest.approx((9.50, 47.10, 9.54, 47.13))


def test_defaults_for_name_timeout_and_owner() -> None:
    s = from_feature(feature(YARD, {"id": "f"}))
    assert (s.name, s.timeout_s, s.owner) == ("", DEFAULT_TIMEOUT_S, "")


def test_properties_may_be_missing_or_null() -> None:
    assert from_feature(feature(YARD, None, id="f1")).fence_id == "f1"
    f = feature(YARD, id="f2")
    del f["properties"]
    assert from_feature(f).fence_id == "f2"


@pytest.mark.parametrize(("top", "props", "override", "expected"), [
    ({"id": "top"}, {}, None, "top"),
    ({}, {"id": "prop-id"}, None, "prop-id"),
    ({}, {"fence_id": "prop-fence-id"}, None, "prop-fence-id"),
    ({"id": "top"}, {"fence_id": "prop-fence-id", "id": "prop-id"}, None, "prop-fence-id"),
    ({"id": "top"}, {"id": "prop-id"}, None, "top"),
    ({"id": "top"}, {"fence_id": "prop-fence-id", "id": "prop-id"}, "override", "override"),
    ({}, {}, "override", "override"),
])
def test_fence_id_sources_and_precedence(top: dict[str, Any], props: dict[str, Any], override: str | None,
                                         expected: str) -> None:
    assert from_feature(feature(YARD, props, **top), fence_id=override).fence_id == expected


def test_missing_fence_id_is_refused() -> None:
    with pytest.raises(InvalidFence, match="fence id None"):
        from_feature(feature(YARD, {"name": "no id"}))


def test_invalid_fence_id_in_feature_is_refused() -> None:
    with pytest.raises(InvalidFence, match="fence id 'a b'"):
        from_feature(feature(YARD, {"id": "a b"}))


@pytest.mark.parametrize("timeout", [60, 0.5, 604800, 604800.0, 1e-3])
def test_timeouts_accepted(timeout: float) -> None:
    s = from_feature(feature(YARD, {"id": "f", "timeout_s": timeout}))
    assert s.timeout_s == float(timeout)
    assert type(s.timeout_s) is float


@pytest.mark.parametrize("timeout", [True, False, math.nan, math.inf, -math.inf, -1, 0, 0.0, 604800.001,
                                     10**9, "60", None, [60]])
def test_timeouts_refused(timeout: Any) -> None:
    with pytest.raises(InvalidFence, match="timeout_s"):
        from_feature(feature(YARD, {"id": "f", "timeout_s": timeout}))


def test_name_validation() -> None:
    assert from_feature(feature(YARD, {"id": "f", "name": "x" * 200})).name == "x" * 200
    for bad in ("x" * 201, 5, None, ["Yard"]):
        with pytest.raises(InvalidFence, match=r"name: (a string expected|201 characters; at most 200)"):
            from_feature(feature(YARD, {"id": "f", "name": bad}))


@pytest.mark.parametrize("geometry", [None, "POLYGON ((0 0, 1 0, 1 1, 0 0))", [[0, 0], [1, 1]]])
def test_feature_without_a_geometry_object(geometry: Any) -> None:
    with pytest.raises(InvalidFence, match="no geometry"):
        from_feature(feature(geometry, {"id": "f"}))


def test_feature_with_geometry_key_absent() -> None:
    with pytest.raises(InvalidFence, match="no geometry"):
        from_feature({"type": "Feature", "properties": {"id": "f"}})


@pytest.mark.parametrize("obj", [
    dict(mapping(YARD)),  # a bare geometry
    {"type": "FeatureCollection", "features": [feature(YARD, {"id": "f"})]},
    {"geometry": dict(mapping(YARD)), "properties": {"id": "f"}},  # no type
    [feature(YARD, {"id": "f"})],
    None,
    "Feature",
])
def test_not_a_feature_is_refused(obj: Any) -> None:
    with pytest.raises(InvalidFence, match="expected a GeoJSON Feature"):
        from_feature(obj)


def test_properties_must_be_an_object() -> None:
    with pytest.raises(InvalidFence, match="properties must be an object"):
        from_feature(feature(YARD, ["id", "f"]))  # type: ignore[arg-type]


def test_bad_geometry_in_feature_is_refused_with_the_geometry_reason() -> None:
    bow_tie = {"type": "Polygon", "coordinates": [[[9.5, 47.1], [9.51, 47.11], [9.51, 47.1], [9.5, 47.11],
                                                   [9.5, 47.1]]]}
    with pytest.raises(InvalidFence, match="self-intersection"):
        from_feature(feature(bow_tie, {"id": "f"}))


def test_invalid_fence_is_a_value_error() -> None:
    assert issubclass(InvalidFence, ValueError)


# --------------------------------------------------------------------------- check_fence_id


@pytest.mark.parametrize("fid", ["a", "Z", "0", "yard-1", "A_b-C_9", "9lives", "x" * 64])
def test_fence_ids_accepted(fid: str) -> None:
    assert check_fence_id(fid) == fid


@pytest.mark.parametrize("fid", ["", "-a", "_a", "x" * 65, "a b", "a.b", "a/b", "é", "f1\n", " f1", "a*",
                                 None, 5, b"f1", ["f1"]])
def test_fence_ids_refused(fid: Any) -> None:
    with pytest.raises(InvalidFence, match="1-64 characters"):
        check_fence_id(fid)


# --------------------------------------------------------------------------- check_geometry


def test_check_geometry_accepts_geojson_and_shapely() -> None:
    assert check_geometry(dict(mapping(YARD))).equals(YARD)
    assert check_geometry(YARD).equals(YARD)
    mp = MultiPolygon([YARD, box(9.6, 47.2, 9.61, 47.21)])
    assert check_geometry(dict(mapping(mp))).equals(mp)


def test_polygon_with_a_hole_is_accepted() -> None:
    donut = Polygon(hk.circle(9.5, 47.1, 700).exterior.coords, [hk.circle(9.5, 47.1, 250).exterior.coords])
    g = check_geometry(dict(mapping(donut)))
    assert isinstance(g, Polygon) and len(g.interiors) == 1


def test_self_intersecting_bow_tie_is_refused_with_the_place() -> None:
    bow_tie = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}
    with pytest.raises(InvalidFence) as info:
        check_geometry(bow_tie)
    msg = str(info.value)
    assert "self-intersection" in msg
    assert "lon=0.5" in msg and "lat=0.5" in msg


def test_shapely_bow_tie_is_refused_too() -> None:
    with pytest.raises(InvalidFence, match="self-intersection"):
        check_geometry(Polygon([(0, 0), (1, 1), (1, 0), (0, 1)]))


def test_vertex_limit_is_inclusive() -> None:
    g = check_geometry({"type": "Polygon", "coordinates": [ring(MAX_VERTICES)]})
    assert shapely.get_num_coordinates(g) == MAX_VERTICES


def test_too_many_vertices_refused_from_geojson() -> None:
    coords = ring(MAX_VERTICES + 1)
    assert len(coords) == 10_001
    with pytest.raises(InvalidFence, match=f"has 10001 vertices; at most {MAX_VERTICES}"):
        check_geometry({"type": "Polygon", "coordinates": [coords]})


def test_too_many_vertices_refused_from_shapely() -> None:
    poly = Polygon(ring(MAX_VERTICES + 1))
    with pytest.raises(InvalidFence, match="10001 vertices"):
        check_geometry(poly)


def test_vertex_count_includes_holes_and_every_part() -> None:
    outer = ring(6_000, r=0.02)
    hole = ring(4_001, r=0.005)
    with pytest.raises(InvalidFence, match="10001 vertices"):
        check_geometry({"type": "Polygon", "coordinates": [outer, hole]})
    parts = [[ring(5_000, lon=9.5)], [ring(5_001, lon=9.6)]]
    with pytest.raises(InvalidFence, match="10001 vertices"):
        check_geometry({"type": "MultiPolygon", "coordinates": parts})


@pytest.mark.parametrize("coords", [
    [[179.5, 0], [180.5, 0], [180.5, 1], [179.5, 0]],
    [[-180.5, 0], [-179.5, 0], [-179.5, 1], [-180.5, 0]],
    [[0, 89.5], [1, 89.5], [1, 90.5], [0, 89.5]],
    [[0, -90.5], [1, -89.5], [0, -89.5], [0, -90.5]],
    [[0, 0], [float("nan"), 0], [1, 1], [0, 0]],
])
def test_coordinates_out_of_range_are_refused(coords: list[list[float]]) -> None:
    with pytest.raises(InvalidFence, match=r"lon/lat|lon in \[-180, 180\]"):
        check_geometry({"type": "Polygon", "coordinates": [coords]})


@pytest.mark.parametrize("where", [(0, 0), (1, 1), (2, 0)])
def test_an_integer_beyond_float_range_is_out_of_range_not_an_overflow(where: tuple[int, int]) -> None:
    coords: list[list[Any]] = [[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]
    coords[where[0]][where[1]] = -(10**400) if where[0] == 2 else 10**400
    with pytest.raises(InvalidFence, match=r"lon in \[-180, 180\]"):
        check_geometry({"type": "Polygon", "coordinates": [coords]})
    with pytest.raises(InvalidFence, match=r"lon in \[-180, 180\]"):
        check_geometry({"type": "MultiPolygon", "coordinates": [[coords]]})


@pytest.mark.parametrize("value", ["9.5", True, False, None, {"lon": 9.5}])
def test_coordinates_must_be_json_numbers_not_what_numpy_would_convert(value: Any) -> None:
    coords: list[list[Any]] = [[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]
    coords[1][0] = value
    with pytest.raises(InvalidFence, match="coordinates must be numbers, not "):
        check_geometry({"type": "Polygon", "coordinates": [coords]})


def test_an_integer_beyond_float_range_nested_too_deep_is_refused_too() -> None:
    with pytest.raises(InvalidFence, match=r"not a GeoJSON Polygon|not an array"):
        check_geometry({"type": "Polygon", "coordinates": [[[[10**400, 1]], [[1, 1]], [[1, 2]]]]})


@pytest.mark.parametrize("timeout", [10**400, -(10**400), 2**64])
def test_huge_integer_timeouts_are_refused_with_a_short_message(timeout: int) -> None:
    with pytest.raises(InvalidFence, match="timeout_s ") as info:
        from_feature(feature(YARD, {"id": "f", "timeout_s": timeout}))
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("props", [[], 0, False, "", "x", [1]])
def test_properties_that_are_not_an_object_are_refused_even_when_falsy(props: Any) -> None:
    with pytest.raises(InvalidFence, match="properties must be an object"):
        from_feature(feature(YARD, props, id="f"))


@pytest.mark.parametrize(("top", "props"), [
    ({"id": ""}, {"id": "prop-id"}),
    ({"id": 0}, {"id": "prop-id"}),
    ({"id": False}, {}),
    ({"id": 5}, {}),
    ({"id": "top"}, {"fence_id": ""}),
])
def test_an_empty_or_numeric_id_is_refused_not_skipped(top: dict[str, Any], props: dict[str, Any]) -> None:
    with pytest.raises(InvalidFence, match="fence id "):
        from_feature(feature(YARD, props, **top))


@pytest.mark.parametrize("name", ["\x00", "a\x00b", "\ud800", "ok\udfff"])
def test_names_postgresql_cannot_store_are_refused(name: str) -> None:
    with pytest.raises(InvalidFence, match=r"name: a (control character|lone surrogate)") as info:
        from_feature(feature(YARD, {"id": "f", "name": name}))
    assert str(info.value).isprintable()
    assert from_feature(feature(YARD, {"id": "f", "name": "Zone \u00e9t\u00e9 \U0001f4a5"})).name


def test_shown_keeps_messages_short_and_printable() -> None:
    assert fence_def.shown("a\x00b") == "'a\\x00b'"
    assert fence_def.shown(10**400) == "an integer of about 401 digits"  # from its bits: exact or one more
    assert fence_def.shown(10**5000).startswith("an integer of")  # no repr beyond 4,300 digits
    long = fence_def.shown("x" * 1000)
    assert len(long) == 80 and long.endswith("\u2026")
    assert fence_def.shown("A" * 65) == repr("A" * 65)  # an id one too long is shown whole


def test_extent_limit() -> None:
    assert check_geometry(box(0, 0, MAX_EXTENT_DEG, 1)).bounds == (0, 0, 10, 1)
    with pytest.raises(InvalidFence, match=r"spans 10\.5 degrees; at most 10\.0"):
        check_geometry(box(0, 0, 10.5, 1))
    with pytest.raises(InvalidFence, match=r"spans 11\.0 degrees"):
        check_geometry(box(0, 0, 1, 11))  # tall
    # two small parts far apart: the extent is the whole MultiPolygon's
    with pytest.raises(InvalidFence, match="spans"):
        check_geometry(MultiPolygon([box(0, 0, 0.1, 0.1), box(20, 0, 20.1, 0.1)]))


@pytest.mark.parametrize(("geometry", "reason"), [
    ({"type": "Polygon", "coordinates": []}, "no rings"),
    ({"type": "Polygon", "coordinates": [[]]}, "ring 0 of polygon 0"),
    ({"type": "MultiPolygon", "coordinates": []}, "non-empty 'coordinates'"),
    ({"type": "Polygon"}, "no rings"),
    (Polygon(), "empty"),
    ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [2, 2], [0, 0]]]}, "zero area"),
    ({"type": "Polygon", "coordinates": [[[0, 0], [0, 0], [0, 0], [0, 0]]]}, "1 distinct point"),
    ({"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [0, 0]]]}, "2 distinct points"),
])
def test_empty_and_zero_area_geometries_are_refused(geometry: Any, reason: str) -> None:
    with pytest.raises(InvalidFence, match=reason):
        check_geometry(geometry)


@pytest.mark.parametrize(("geometry", "reason"), [
    ({"type": "Point", "coordinates": [9.5, 47.1]}, "got type 'Point'"),
    ({"type": "LineString", "coordinates": [[9.5, 47.1], [9.6, 47.2]]}, "got type 'LineString'"),
    (shapely.Point(9.5, 47.1), "got Point"),
    ("POLYGON ((0 0, 1 0, 1 1, 0 0))", "got str"),
    ({"type": "Polygon", "coordinates": [[["a", "b"], ["c", "d"], ["e", "f"], ["a", "b"]]]},
     "coordinates must be numbers, not 'a'"),
    ({"type": "Polygon", "coordinates": [[[0, 0, 0, 0], 5, [1, 1], [0, 0]]]}, "not an array of positions"),
])
def test_what_is_not_a_polygon_is_refused(geometry: Any, reason: str) -> None:
    with pytest.raises(InvalidFence, match=reason):
        check_geometry(geometry)


# --------------------------------------------------------------------------- choose_bits


def test_choose_bits_is_monotonic_in_size_and_clamped() -> None:
    sizes = np.geomspace(1e-7, 10.0, 60)
    bits = [choose_bits(box(9.0, 47.0, 9.0 + s, 47.0 + s / 2)) for s in sizes]
    assert all(MIN_BITS <= b <= MAX_BITS for b in bits)
    assert all(b1 >= b2 for b1, b2 in itertools.pairwise(bits)), bits
    assert bits[0] == MAX_BITS
    assert len(set(bits)) > 8  # it really varies over this range


def test_choose_bits_aims_at_cells_across() -> None:
    for s in (0.002, 0.004, 0.01, 0.05, 0.3, 2.0):
        b = choose_bits(box(9.0, 47.0, 9.0 + s, 47.0 + s / 4))
        assert MIN_BITS <= b <= MAX_BITS
        across = s / 360.0 * 2**b  # cells across the larger side (lon here)
        assert spec.CELLS_ACROSS <= across < 2 * spec.CELLS_ACROSS


def test_choose_bits_uses_the_larger_side_as_a_share_of_the_grid() -> None:
    square = choose_bits(box(9.0, 47.0, 9.01, 47.01))
    wide = choose_bits(box(9.0, 47.0, 9.5, 47.01))
    tall = choose_bits(box(9.0, 47.0, 9.01, 47.5))
    assert wide < square and tall < square
    # lat spans 180 degrees, lon 360: a degree of latitude is twice the share of one of longitude
    assert choose_bits(box(0, 0, 0.001, 0.02)) == choose_bits(box(0, 0, 0.04, 0.001))
    assert choose_bits(box(0, 0, 0.001, 0.02)) == choose_bits(box(0, 0, 0.02, 0.001)) - 1


def test_choose_bits_clamps_at_both_ends() -> None:
    assert choose_bits(box(9.0, 47.0, 9.0 + 1e-9, 47.0 + 1e-9)) == MAX_BITS
    assert choose_bits(box(-180, -90, 180, 90)) == MIN_BITS
    assert choose_bits(box(0, 0, 90, 45)) == MIN_BITS


# --------------------------------------------------------------------------- bindings

TWO = Worldmap.over_area(["a", "b"])
ONE = Worldmap.single("a")


def _cut_lonlat() -> tuple[float, float]:
    """Where the default two-region map changes owner (a point of the curve at the cut)."""
    x, y = hk.decode(int(TWO.starts[1]), INDEX_BITS)
    return hk.grid_to_lonlat(x, y, INDEX_BITS)


CUT_LON, CUT_LAT = _cut_lonlat()
FENCES: dict[str, Polygon | MultiPolygon] = {
    "box-on-the-cut": box(CUT_LON - 0.01, CUT_LAT - 0.01, CUT_LON + 0.01, CUT_LAT + 0.01),
    "circle-500m": hk.circle(9.52, 47.12, 500),
    "donut": Polygon(hk.circle(9.55, 47.15, 900).exterior.coords,
                     [hk.circle(9.55, 47.15, 300).exterior.coords]),
    "two-parts": MultiPolygon([box(9.42, 47.02, 9.43, 47.03), box(9.66, 47.26, 9.68, 47.27)]),
    "district": Polygon([(9.45, 47.05), (9.62, 47.04), (9.66, 47.22), (9.52, 47.28), (9.41, 47.18)]),
    "far-away": hk.circle(8.54, 47.37, 2000),
}
MAPS = {"two-regions": TWO, "single": ONE}


def hilbert(lon: F64, lat: F64) -> npt.NDArray[np.uint64]:
    x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    return hk.encode_many(x, y, INDEX_BITS)


F64 = npt.NDArray[np.float64]


def sample(g: Polygon | MultiPolygon, n: int, seed: int) -> tuple[F64, F64]:
    """Uniform points over the geometry's bbox (a little beyond it), plus points just inside
    its boundary (where a covering's mistakes would show)."""
    rng = np.random.default_rng(seed)
    x0, y0, x1, y1 = g.bounds
    dx, dy = (x1 - x0) * 0.05, (y1 - y0) * 0.05
    lon = rng.uniform(x0 - dx, x1 + dx, n)
    lat = rng.uniform(y0 - dy, y1 + dy, n)
    edge = g.buffer(-1e-6).boundary
    d = rng.uniform(0, edge.length, n // 4)
    near = shapely.line_interpolate_point(edge, d)
    return np.r_[lon, shapely.get_x(near)], np.r_[lat, shapely.get_y(near)]


@pytest.fixture(scope="module", params=sorted(FENCES))
def fence_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_bindings_cover_every_inside_point(fence_name: str, map_name: str) -> None:
    g, wm = FENCES[fence_name], MAPS[map_name]
    b = bindings(g, wm)
    assert b.bits == choose_bits(g)
    lon, lat = sample(g, 40_000, seed=len(fence_name))
    inside = shapely.contains_xy(g, lon, lat)
    assert inside.sum() > 1_000
    h = hilbert(lon[inside], lat[inside])
    covered = np.zeros(h.size, bool)
    for ranges, _ in b.per_region.values():
        covered |= hk.ranges_contain(ranges, h)
    assert covered.all(), f"{int((~covered).sum())} inside points are in no range"


@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_each_region_only_binds_what_it_owns(fence_name: str, map_name: str) -> None:
    g, wm = FENCES[fence_name], MAPS[map_name]
    b = bindings(g, wm)
    assert set(b.per_region) <= set(wm.regions)
    for region, (ranges, interior) in b.per_region.items():
        r = wm.regions.index(region)
        assert ranges.dtype == np.uint64 and ranges.ndim == 2 and ranges.shape[1] == 2
        assert interior.dtype == np.bool_ and interior.shape == (len(ranges),)
        assert len(ranges) > 0
        assert (ranges[:, 0] <= ranges[:, 1]).all()
        assert (ranges[1:, 0] > ranges[:-1, 1]).all(), "sorted and disjoint"
        assert (wm.region_index(ranges[:, 0]) == r).all()
        assert (wm.region_index(ranges[:, 1]) == r).all()
        # no interval of another region starts inside a range
        first = np.searchsorted(wm.starts, ranges[:, 0], "right")
        assert (first == np.searchsorted(wm.starts, ranges[:, 1], "right")).all()
    # sampled points in a region's ranges are points the worldmap gives to that region
    lon, lat = sample(g, 20_000, seed=7)
    h = hilbert(lon, lat)
    owner = wm.region_index(h)
    for region, (ranges, _) in b.per_region.items():
        hit = hk.ranges_contain(ranges, h)
        assert (owner[hit] == wm.regions.index(region)).all()


def test_the_box_on_the_cut_is_bound_in_both_regions_and_single_map_has_one() -> None:
    g = FENCES["box-on-the-cut"]
    assert sorted(bindings(g, TWO).per_region) == ["a", "b"]
    assert sorted(bindings(g, ONE).per_region) == ["a"]
    # dividing between regions only cuts ranges: the same indices are covered
    two, one = bindings(g, TWO), bindings(g, ONE)
    cells_two = sum(int((r[:, 1] - r[:, 0]).sum()) + len(r) for r, _ in two.per_region.values())
    cells_one = sum(int((r[:, 1] - r[:, 0]).sum()) + len(r) for r, _ in one.per_region.values())
    assert cells_two == cells_one
    assert two.ranges in (one.ranges, one.ranges + 1)


@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_range_budget(fence_name: str, map_name: str) -> None:
    b = bindings(FENCES[fence_name], MAPS[map_name])
    assert b.ranges == sum(len(r) for r, _ in b.per_region.values())
    assert 0 < b.ranges <= MAX_RANGES


@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_interior_ranges_hold_only_inside_points(fence_name: str, map_name: str) -> None:
    g, wm = FENCES[fence_name], MAPS[map_name]
    b = bindings(g, wm)
    lon, lat = sample(g, 40_000, seed=11)
    h = hilbert(lon, lat)
    in_interior = np.zeros(h.size, bool)
    for ranges, interior in b.per_region.values():
        in_interior |= hk.ranges_contain(ranges[interior], h)
    assert in_interior.sum() > 100, "the test needs points in interior ranges"
    assert shapely.intersects_xy(g, lon[in_interior], lat[in_interior]).all()


def comb(bits: int, cols: int, rows: int, offset: int) -> Polygon:
    """A comb of one-cell teeth (at `bits`) a little inside the cell edges, centred near
    the cut of the two-region map: its fine covering has more than MAX_RANGES ranges."""
    gx, gy = hk.decode(int(TWO.starts[1]), INDEX_BITS)
    sh = INDEX_BITS - bits
    cx, cy = (gx >> sh) + offset - cols // 2, (gy >> sh) + offset - rows // 2
    cw, ch = 360.0 / float(1 << bits), 180.0 / float(1 << bits)
    inset = 0.1

    def lon(c: float) -> float:
        return (cx + c) * cw - 180

    def lat(r: float) -> float:
        return (cy + r) * ch - 90

    parts = [box(lon(0) + inset * cw, lat(0) + inset * ch, lon(cols) - inset * cw, lat(1) - inset * ch)]
    parts += [box(lon(k) + inset * cw, lat(0.5), lon(k + 1) - inset * cw, lat(rows) - inset * ch)
              for k in range(0, cols, 2)]
    out = shapely.union_all(parts)
    assert isinstance(out, Polygon)
    return out


COMB = comb(19, 127, 127, 3)


def test_a_fence_with_a_fine_covering_over_budget_is_coarsened() -> None:
    g = check_geometry(COMB)
    assert choose_bits(g) == 19
    assert len(hk.cover(g, 19)) > MAX_RANGES
    b = bindings(g, ONE)
    assert b.ranges == MAX_RANGES
    lon, lat = sample(g, 20_000, seed=3)
    inside = shapely.contains_xy(g, lon, lat)
    assert hk.ranges_contain(b.per_region["a"][0], hilbert(lon[inside], lat[inside])).all()


def test_each_region_stays_within_the_budget_for_a_coarsened_fence() -> None:
    b = bindings(COMB, TWO)
    assert sorted(b.per_region) == ["a", "b"]
    assert all(len(r) <= MAX_RANGES for r, _ in b.per_region.values())


def test_total_ranges_stay_within_the_budget_when_a_region_boundary_cuts_a_range() -> None:
    b = bindings(COMB, TWO)
    assert b.ranges <= MAX_RANGES
