"""fence/service.py's pure helpers: bbox and If-Match parsing, object ids, and a stored fence as
the API's GeoJSON Feature. Every refusal is an ApiError 422 whose message names the bad value."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from shapely.geometry import MultiPolygon, box, shape

from exchanges.fence_def import FenceDef
from fence import service
from fence.follow import circle
from fence.service import ApiError, _object_id, _version, feature, parse_bbox
from fence.spec import Follow
from fence.store import FenceRecord

YARD = box(9.500, 47.100, 9.510, 47.110)
CREATED = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)


def api_error(call: Any, *args: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.status == 422
    assert str(info.value) == info.value.message
    return info.value


def test_api_error_carries_status_and_message() -> None:
    e = ApiError(409, "version 3 moved on")
    assert (e.status, e.message, str(e)) == (409, "version 3 moved on", "version 3 moved on")
    assert isinstance(e, Exception)


# --------------------------------------------------------------------------- bbox


def test_no_bbox() -> None:
    assert parse_bbox(None) is None
    assert parse_bbox("") is None


@pytest.mark.parametrize(("raw", "expected"), [
    ("9.5,47.1,9.6,47.2", (9.5, 47.1, 9.6, 47.2)),
    ("-180,-90,180,90", (-180.0, -90.0, 180.0, 90.0)),
    (" 1 , 2 ,3, 4 ", (1.0, 2.0, 3.0, 4.0)),
    ("0,0,0,0", (0.0, 0.0, 0.0, 0.0)),  # a point is a (degenerate) box
    ("-1e1,-5,1E1,5", (-10.0, -5.0, 10.0, 5.0)),
])
def test_good_bbox(raw: str, expected: tuple[float, float, float, float]) -> None:
    got = parse_bbox(raw)
    assert got == expected
    assert got is not None and all(type(v) is float for v in got)


@pytest.mark.parametrize("raw", ["1,2,3", "1,2,3,4,5", "1,2,3,4,", "1", ",,,", "1;2;3;4", "1 2 3 4"])
def test_bbox_of_the_wrong_count(raw: str) -> None:
    e = api_error(parse_bbox, raw)
    assert e.message == f"bbox {raw!r}: four numbers min_lon,min_lat,max_lon,max_lat expected"


@pytest.mark.parametrize("raw", ["a,b,c,d", "1,2,3,x", "0x1,0,1,1", "1,2,,4", "[1,2,3,4]"])
def test_bbox_of_non_numbers(raw: str) -> None:
    assert "four numbers min_lon,min_lat,max_lon,max_lat expected" in api_error(parse_bbox, raw).message


@pytest.mark.parametrize("raw", [
    "nan,0,1,1", "0,NaN,1,1", "0,0,inf,1", "-inf,0,1,1", "0,0,1,Infinity",  # not finite
    "2,0,1,1", "0,2,1,1",  # min above max
    "-181,0,0,1", "0,-91,1,1", "0,0,181,1", "0,0,1,91", "-180.0001,0,0,1", "0,0,1,90.0001",  # out of range
])
def test_bbox_out_of_bounds(raw: str) -> None:
    e = api_error(parse_bbox, raw)
    assert e.message == f"bbox {raw!r}: min <= max, lon in [-180, 180], lat in [-90, 90]"


# --------------------------------------------------------------------------- expected version


@pytest.mark.parametrize(("raw", "expected"), [
    ("3", 3), ('"3"', 3), ('W/"3"', 3), (' "3" ', 3), ("W/3", 3), ('"120"', 120), (7, 7), ("0012", 12),
])
def test_good_versions(raw: Any, expected: int) -> None:
    assert _version(raw) == expected


def test_no_version() -> None:
    assert _version(None) is None


@pytest.mark.parametrize("raw", [
    "0", '"0"', 'W/"0"', 0, "-1", -1, "", '""', "W/", "abc", "3.0", 3.0, "1e3", "*", '"3", "4"', "W/ \"3\"",
    'w/"3"', True, False, "+3", "3 4", [3], {"version": 3},
])
def test_bad_versions(raw: Any) -> None:
    e = api_error(_version, raw)
    assert e.message == f"expected version {raw!r}: a positive integer (the fence's version / ETag)"


@pytest.mark.parametrize("raw", [
    pytest.param("\u00b3", id="superscript-three"),
    pytest.param("9" * 5000, id="5000-digits"),
])
def test_versions_int_cannot_read_are_422(raw: str) -> None:
    api_error(_version, raw)


# --------------------------------------------------------------------------- object ids


@pytest.mark.parametrize("raw", ["a", "7", "truck-7", "Truck_7-a", "A" * 64, "0-_"])
def test_good_object_ids(raw: str) -> None:
    assert _object_id(raw) == raw


@pytest.mark.parametrize("raw", [
    "", "-a", "_a", "A" * 65, "a b", "a.b", "a/b", "ä", "a\n", " a", "a ", None, 7, ["a"], b"a",
])
def test_bad_object_ids(raw: Any) -> None:
    e = api_error(_object_id, raw)
    assert e.message == (f"object id {raw!r}: 1-64 characters from A-Z a-z 0-9 _ -, starting with a "
                         "letter or digit")


# --------------------------------------------------------------------------- feature


def record(geometry: Any = YARD, follow: Follow | None = None, follow_ts: float | None = None,
           regions: tuple[str, ...] = ("eu-central",)) -> FenceRecord:
    return FenceRecord(FenceDef(fence_id="fleet:yard-1", version=4, geometry=geometry, timeout_s=90.0,
                                name="Yard"), "alice", CREATED,
                       CREATED + timedelta(minutes=5, microseconds=250), regions, follow, follow_ts)


def test_feature_of_a_plain_fence() -> None:
    f = feature(record())
    assert set(f) == {"type", "id", "geometry", "properties"}
    assert f["type"] == "Feature" and f["id"] == "yard-1"
    assert f["geometry"]["type"] == "Polygon"
    assert shape(f["geometry"]).equals(YARD)
    assert f["properties"] == {
        "version": 4, "name": "Yard", "timeout_s": 90.0, "owner": "alice",
        "created_at": "2024-03-01T12:00:00+00:00", "updated_at": "2024-03-01T12:05:00.000250+00:00",
        "regions": ["eu-central"], "follow": None, "tenant": "fleet",
    }
    assert "id" not in f["properties"] and "geometry" not in f["properties"]
    again = json.loads(json.dumps(f))  # plain JSON
    assert again["properties"] == f["properties"] and again["id"] == "yard-1"


def test_feature_of_a_following_fence() -> None:
    c = circle(9.52, 47.14, 250.0)
    f = feature(record(c, Follow("fleet:truck-7", 250.0), 1_700_000_000.5, ()))
    # the names as the tenant gives them, its tenant beside them
    assert f["id"] == "yard-1" and f["properties"]["tenant"] == "fleet"
    assert f["properties"]["follow"] == {"object_id": "truck-7", "radius_m": 250.0, "ts": 1_700_000_000.5}
    assert f["properties"]["regions"] == []
    assert shape(f["geometry"]).equals(c)


def test_feature_of_a_following_fence_not_placed_yet() -> None:
    f = feature(record(follow=Follow("truck-7", 250.0)))
    assert f["properties"]["follow"] == {"object_id": "truck-7", "radius_m": 250.0, "ts": None}


def test_feature_of_a_multipolygon() -> None:
    g = MultiPolygon([YARD, box(9.6, 47.2, 9.61, 47.21)])
    f = feature(record(g, regions=("eu-central", "eu-west")))
    assert f["geometry"]["type"] == "MultiPolygon" and shape(f["geometry"]).equals(g)
    assert f["properties"]["regions"] == ["eu-central", "eu-west"]


def test_feature_does_not_share_its_properties() -> None:
    r = record()
    f = feature(r)
    f["properties"]["ranges"] = 12  # what _put adds to its answer
    assert "ranges" not in feature(r)["properties"]


def test_limits() -> None:
    assert (service.MAX_LIST, service.MAX_EVENTS, service.MAX_RADIUS_M) == (1000, 10_000, 50_000.0)
