"""fence/spec.py with the fence options (exchanges/fence_options/): each is checked where a
fence comes in (a GeoJSON Feature's properties), and carried into the definition."""

from __future__ import annotations

import math

import pytest
from shapely.geometry import box, mapping

from exchanges.fence_def import InvalidFence
from exchanges.fence_options.band import hysteresis_zones
from fence.spec import from_feature


def test_a_hysteresis_band_is_metres_and_must_leave_an_inside() -> None:
    """properties.hysteresis_m: metres in [0, 1000]; the fence shrunk by it must not be empty;
    the bindings cover the fence grown by it (positions in the band outside decide a LEAVE)."""
    square = box(9.50, 47.10, 9.51, 47.11)  # ~760 x 1,110 m
    feature = {"type": "Feature", "geometry": mapping(square), "properties": {"id": "sq", "hysteresis_m": 40}}
    s = from_feature(feature)
    assert s.hysteresis_m == 40.0 and s.definition(2).hysteresis_m == 40.0
    inner, outer = hysteresis_zones(square, 40.0)
    assert inner.within(square) and square.within(outer) and s.cover_geometry().equals(outer)
    # 40 m in metres of the local projection: 40 / (111,195 cos 47.105) degrees of longitude
    dx = 40.0 / (111_194.93 * math.cos(math.radians(47.105)))
    assert inner.bounds[0] == pytest.approx(9.50 + dx, rel=1e-9)
    assert outer.bounds[2] == pytest.approx(9.51 + dx, rel=1e-9)
    for bad, said in ((-5, "hysteresis_m -5"), (1001, "hysteresis_m 1001"), (True, "hysteresis_m True"),
                      ("10", "hysteresis_m '10'"), (400, "nowhere 400 m wide")):
        with pytest.raises(InvalidFence, match=said):
            from_feature({**feature, "properties": {"id": "sq", "hysteresis_m": bad}})
    plain = from_feature({**feature, "properties": {"id": "sq"}})
    assert plain.hysteresis_m == 0.0 and plain.cover_geometry() is plain.geometry


def test_a_fence_filter_is_checked_where_it_comes_in() -> None:
    square = box(9.50, 47.10, 9.51, 47.11)
    feature = {"type": "Feature", "geometry": mapping(square),
               "properties": {"id": "sq", "where": [["type", "==", "truck"], ["speed", "between", 0, 90]]}}
    s = from_feature(feature)
    assert s.where == (("type", "==", ("truck",)), ("speed", "between", (0.0, 90.0)))
    assert s.definition(1).where == s.where
    for bad, said in (([["speed", "<"]], "where clause"), ("type", "a list of at most"),
                      ([["speed", "<", "fast"]], "< value 'fast'")):
        with pytest.raises(InvalidFence, match=said):
            from_feature({**feature, "properties": {"id": "sq", "where": bad}})
    assert from_feature({**feature, "properties": {"id": "sq", "where": None}}).where == ()
