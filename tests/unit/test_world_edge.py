"""Float noise at the edges of the world: real polygons carry it (Natural Earth's Russia has a
vertex at lon 180.00000000000006). A coordinate within COORD_SLACK_DEG (1e-9 degrees) outside
[-180, 180] x [-90, 90] is clamped onto the edge wherever coordinates come in (the kernel,
positions, the fence API); anything further out is refused as before."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from shapely.geometry import Polygon

import hilbert_c as hk
from exchanges.fence_def import InvalidFence, check_geometry
from ingress.positions import decode_batch

NOISY = 180.00000000000006  # Natural Earth's Russia
CHUKOTKA = [[179.5, 65.0], [NOISY, 65.0], [NOISY, 66.0], [179.5, 66.0], [179.5, 65.0]]


def polygon(ring: list[list[float]]) -> dict[str, Any]:
    return {"type": "Polygon", "coordinates": [ring]}


EDGES = [(NOISY, 10.0, (180.0, 10.0)), (-NOISY, 10.0, (-180.0, 10.0)), (5.0, 90 + 1e-10, (5.0, 90.0)),
         (5.0, -90 - 9e-10, (5.0, -90.0))]
FAR = [(180 + 2e-9, 0.0), (-180.001, 0.0), (0.0, 90.00001), (math.nan, 0.0), (math.inf, 0.0)]


@pytest.mark.parametrize(("lon", "lat", "edge"), EDGES)
def test_the_kernel_takes_noise_at_the_edge_as_the_edge(lon: float, lat: float,
                                                        edge: tuple[float, float]) -> None:
    assert hk.lonlat_to_grid(lon, lat, 26) == hk.lonlat_to_grid(*edge, 26)
    xs, ys = hk.lonlat_to_grid(np.array([lon, 1.0]), np.array([lat, 1.0]), 20)
    assert (int(xs[0]), int(ys[0])) == hk.lonlat_to_grid(*edge, 20)


@pytest.mark.parametrize(("lon", "lat"), FAR)
def test_the_kernel_still_refuses_what_is_further_out(lon: float, lat: float) -> None:
    with pytest.raises(ValueError, match="invalid coordinate"):
        hk.lonlat_to_grid(lon, lat)


def test_clamp_changes_only_the_noise() -> None:
    lon = np.array([NOISY, -NOISY, 180.5, 12.25, math.nan, 180.0])
    lat = np.array([90.0 + 1e-12, -45.0, 91.0, -90.0 - 1e-9, 0.0, 90.0])
    c_lon, c_lat = hk.clamp_lonlat(lon, lat)
    np.testing.assert_array_equal(c_lon, [180.0, -180.0, 180.5, 12.25, math.nan, 180.0])
    np.testing.assert_array_equal(c_lat, [90.0, -45.0, 91.0, -90.0, 0.0, 90.0])
    same = np.array([1.0, 2.0])
    assert hk.clamp_lonlat(same, same)[0] is same  # nothing to clamp: no copy


def test_a_polygon_with_such_a_vertex_is_covered_as_the_clamped_one() -> None:
    clean = [[min(x, 180.0), y] for x, y in CHUKOTKA]
    for given in (polygon(CHUKOTKA), Polygon(CHUKOTKA)):
        g = hk.as_geometry(given)
        assert g.bounds == (179.5, 65.0, 180.0, 66.0)
        got, want = hk.cover(given, 18), hk.cover(polygon(clean), 18)
        np.testing.assert_array_equal(got.ranges, want.ranges)
        np.testing.assert_array_equal(got.interior, want.interior)
    with pytest.raises(hk.InvalidGeometry, match="not a lon/lat coordinate"):
        hk.as_geometry(polygon([[179.5, 65.0], [180.01, 65.0], [180.01, 66.0], [179.5, 65.0]]))


def test_the_fence_api_accepts_it_and_stores_the_edge() -> None:
    g = check_geometry(polygon(CHUKOTKA))
    assert g.bounds[2] == 180.0
    with pytest.raises(InvalidFence):
        check_geometry(polygon([[179.5, 65.0], [180.5, 65.0], [180.5, 66.0], [179.5, 65.0]]))


def test_a_position_with_such_a_coordinate_is_taken_at_the_edge() -> None:
    body = json.dumps({"positions": [{"id": "a", "lon": NOISY, "lat": -90 - 1e-10, "ts": 1.7e9},
                                     {"id": "b", "lon": 180.001, "lat": 0.0, "ts": 1.7e9}]}).encode()
    d = decode_batch(body, "application/json")
    assert d.batch.ids == ["a"] and d.batch.lon.tolist() == [180.0] and d.batch.lat.tolist() == [-90.0]
    assert d.refused == [(1, "position 1: lon 180.001 is outside [-180, 180]")]
