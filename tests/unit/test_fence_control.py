"""exchanges/control.py: control messages through the real wire codec (exchanges.batch pack/unpack)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from shapely.geometry import MultiPolygon, box, mapping

from exchanges import control
from exchanges.batch import PositionBatch, pack, unpack
from exchanges.contract import InvalidMessage
from exchanges.control import DEFINE, DROP, Define, Drop
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_options import filters
from exchanges.worker_batch import WorkerBatch
from fence.spec import from_feature
from fence.x_fence.core import XFence

YARD = box(9.500, 47.100, 9.510, 47.110)
TS = 1_700_000_000.25


def fence(version: int = 3, geometry: Any = YARD) -> FenceDef:
    s = from_feature({"type": "Feature", "geometry": dict(mapping(geometry)),
                      "properties": {"id": "yard-1", "name": "Yard", "timeout_s": 90}})
    return s.definition(version)


RANGES = np.array([[10, 19], [40, 40], [2**52 - 5, 2**52 - 1]], dtype=np.uint64)
INTERIOR = np.array([False, True, False])
DELETE = object()  # a field to take out of a message


def round_trip(body: bytes) -> Define | Drop:
    return control.parse(unpack(body))


def edited(msg: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`msg` with the fields of `change` set (DELETE deletes them), in place."""
    for k, v in change.items():
        if v is DELETE:
            del msg[k]
        else:
            msg[k] = v
    return msg


def define_msg(**change: Any) -> dict[str, Any]:
    """A decoded define-for-region message with some fields changed (DELETE deletes)."""
    return edited(unpack(control.define_for_region(fence(), TS, 21, RANGES, INTERIOR)), change)


def fence_msg(**change: Any) -> dict[str, Any]:
    """A decoded define-for-worker message whose fence object has some fields changed."""
    msg = unpack(control.define_for_worker(Define(fence(), TS)))
    edited(msg["fence"], change)
    return msg


def refusal(msg: dict[str, Any]) -> str:
    with pytest.raises(InvalidMessage) as info:
        control.parse(msg)
    assert info.value.reason == str(info.value)
    return info.value.reason


# --------------------------------------------------------------------------- round trips


def test_define_for_region_round_trip() -> None:
    f = fence()
    d = round_trip(control.define_for_region(f, TS, 21, RANGES, INTERIOR))
    assert isinstance(d, Define)
    assert d.fence.fence_id == "yard-1"
    assert d.fence.version == 3
    assert d.fence.name == "Yard"
    assert d.fence.timeout_s == 90.0
    assert d.fence.geometry.equals(YARD)
    assert d.ts == TS
    assert d.bits == 21
    assert d.ranges is not None and d.interior is not None
    assert d.ranges.dtype == np.uint64 and d.ranges.shape == (3, 2)
    np.testing.assert_array_equal(d.ranges, RANGES)
    assert d.interior.dtype == np.bool_
    np.testing.assert_array_equal(d.interior, INTERIOR)


def test_define_binding_carries_id_version_and_ranges() -> None:
    d = round_trip(control.define_for_region(fence(7), TS, 21, RANGES, INTERIOR))
    assert isinstance(d, Define)
    b = d.binding()
    assert isinstance(b, FenceBinding)
    assert (b.fence_id, b.version) == ("yard-1", 7)
    np.testing.assert_array_equal(b.ranges, RANGES)
    np.testing.assert_array_equal(b.interior, INTERIOR)


def test_define_for_region_with_no_ranges_means_unbind() -> None:
    body = control.define_for_region(fence(), TS, 21, np.empty((0, 2), np.uint64), np.empty(0, bool))
    d = round_trip(body)
    assert isinstance(d, Define)
    assert d.ranges is not None and d.ranges.shape == (0, 2)
    assert d.interior is not None and d.interior.shape == (0,)
    assert d.binding() is None


def test_define_ranges_in_other_dtypes_are_written_as_uint64() -> None:
    body = control.define_for_region(fence(), TS, 21, RANGES.astype(np.int64), INTERIOR.astype(np.uint8))
    d = round_trip(body)
    assert isinstance(d, Define) and d.ranges is not None and d.interior is not None
    np.testing.assert_array_equal(d.ranges, RANGES)
    np.testing.assert_array_equal(d.interior, INTERIOR)


def test_define_for_worker_round_trip_has_no_ranges() -> None:
    f = fence(4, MultiPolygon([YARD, box(9.6, 47.2, 9.61, 47.21)]))
    body = control.define_for_worker(Define(f, TS, 21, RANGES, INTERIOR))
    assert "ranges" not in unpack(body) and "bits" not in unpack(body)
    d = round_trip(body)
    assert isinstance(d, Define)
    assert (d.fence.fence_id, d.fence.version, d.fence.name, d.fence.timeout_s) == ("yard-1", 4, "Yard", 90.0)
    assert isinstance(d.fence.geometry, MultiPolygon) and d.fence.geometry.equals(f.geometry)
    assert d.ts == TS
    assert (d.bits, d.ranges, d.interior) == (0, None, None)
    assert d.binding() is None


def test_drop_round_trip() -> None:
    d = round_trip(control.drop_message(Drop("yard-1", 5, TS)))
    assert d == Drop("yard-1", 5, TS)


def test_integer_ts_parses_to_float() -> None:
    d = round_trip(control.drop_message(Drop("yard-1", 5, 1_700_000_000)))
    assert isinstance(d, Drop) and type(d.ts) is float and d.ts == 1_700_000_000.0


def test_fence_json_is_plain_json() -> None:
    j = control.fence_json(fence())
    assert j["id"] == "yard-1" and j["version"] == 3 and j["name"] == "Yard" and j["timeout_s"] == 90.0
    assert j["geometry"]["type"] == "Polygon"


def test_define_binding_is_none_without_ranges_or_interior() -> None:
    f = fence()
    assert Define(f, TS).binding() is None
    assert Define(f, TS, 21, RANGES, None).binding() is None
    assert Define(f, TS, 21, None, INTERIOR).binding() is None
    assert Define(f, TS, 21, np.empty((0, 2), np.uint64), np.empty(0, bool)).binding() is None
    assert Define(f, TS, 21, RANGES, INTERIOR).binding() is not None


# --------------------------------------------------------------------------- refusals


def test_unknown_kind() -> None:
    reason = refusal(unpack(pack("frobnicate", fence_id="yard-1")))
    assert reason == "unknown control message kind 'frobnicate'"
    # inspect is a control kind of the sidecars, not a fence change
    assert "unknown control message kind 'inspect'" in refusal(unpack(pack(control.INSPECT)))


def test_no_kind_at_all() -> None:
    assert "KeyError" in refusal({"v": 1})


@pytest.mark.parametrize("missing", ["fence", "ts"])
def test_define_missing_top_level_field(missing: str) -> None:
    reason = refusal(define_msg(**{missing: DELETE}))
    assert reason.startswith("bad define message: KeyError")
    assert repr(missing) in reason


def test_define_with_ranges_but_no_interior_or_bits() -> None:
    assert "'interior'" in refusal(define_msg(interior=DELETE))
    assert "'bits'" in refusal(define_msg(bits=DELETE))


@pytest.mark.parametrize("missing", ["id", "version", "geometry", "timeout_s"])
def test_define_fence_missing_field(missing: str) -> None:
    reason = refusal(fence_msg(**{missing: DELETE}))
    assert reason.startswith("bad define message:")
    assert repr(missing) in reason


def test_define_fence_name_is_optional() -> None:
    d = control.parse(fence_msg(name=DELETE))
    assert isinstance(d, Define) and d.fence.name == ""


@pytest.mark.parametrize("missing", ["fence_id", "version", "ts"])
def test_drop_missing_field(missing: str) -> None:
    msg = unpack(control.drop_message(Drop("yard-1", 5, TS)))
    del msg[missing]
    reason = refusal(msg)
    assert reason.startswith("bad drop message: KeyError") and repr(missing) in reason


@pytest.mark.parametrize("version", [0, -1, True, False, "3", 2.0, None])
def test_bad_versions(version: Any) -> None:
    assert f"version {version!r} is not a positive integer" in refusal(fence_msg(version=version))
    msg = unpack(control.drop_message(Drop("yard-1", 5, TS)))
    msg["version"] = version
    assert f"version {version!r} is not a positive integer" in refusal(msg)


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf, True, "1700000000", None])
def test_bad_ts(ts: Any) -> None:
    assert "is not a finite number" in refusal(define_msg(ts=ts))
    msg = unpack(control.drop_message(Drop("yard-1", 5, TS)))
    msg["ts"] = ts
    reason = refusal(msg)
    assert reason.startswith("bad drop message") and "is not a finite number" in reason


def test_nan_ts_survives_the_codec_and_is_refused() -> None:
    body = control.drop_message(Drop("yard-1", 5, math.nan))
    assert "ts nan is not a finite number" in refusal(unpack(body))


def test_ranges_and_interior_of_different_lengths() -> None:
    body = control.define_for_region(fence(), TS, 21, RANGES, INTERIOR[:2])
    assert "3 ranges but 2 interior flags" in refusal(unpack(body))


def test_range_ending_before_its_start() -> None:
    bad = RANGES.copy()
    bad[1] = [50, 49]
    body = control.define_for_region(fence(), TS, 21, bad, INTERIOR)
    assert "a range ends before it starts" in refusal(unpack(body))


def test_ranges_bytes_not_whole_pairs() -> None:
    msg = define_msg(ranges=np.arange(3, dtype="<u8").tobytes(), interior=b"\x00")
    assert refusal(msg).startswith("bad define message: ValueError")
    msg = define_msg(ranges=b"\x00" * 12)
    assert refusal(msg).startswith("bad define message: ValueError")


def test_ranges_not_bytes() -> None:
    assert refusal(define_msg(ranges=[[1, 2]])).startswith("bad define message: TypeError")


def test_invalid_geometry_in_message() -> None:
    bow_tie = {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}
    reason = refusal(fence_msg(geometry=bow_tie))
    assert reason.startswith("bad define message: ") and "self-intersection" in reason
    assert "Point" in refusal(fence_msg(geometry={"type": "Point", "coordinates": [0, 0]}))
    assert "spans" in refusal(fence_msg(geometry=dict(mapping(box(0, 0, 20, 1)))))


@pytest.mark.parametrize(("field", "value", "words"), [
    ("id", "a b", "fence id 'a b'"),
    ("id", 17, "fence id 17"),
    ("timeout_s", 0, "timeout_s 0"),
    ("timeout_s", math.nan, "timeout_s nan"),
])
def test_invalid_fence_fields(field: str, value: Any, words: str) -> None:
    reason = refusal(fence_msg(**{field: value}))
    assert reason.startswith("bad define message: ") and words in reason


def test_drop_with_invalid_fence_id() -> None:
    msg = unpack(control.drop_message(Drop("yard-1", 5, TS)))
    msg["fence_id"] = "-bad"
    assert "fence id '-bad'" in refusal(msg)


def test_fence_not_an_object() -> None:
    assert refusal(define_msg(fence="yard-1")).startswith("bad define message: TypeError")


def test_kinds_are_distinct_constants() -> None:
    assert len({DEFINE, DROP, control.INSPECT}) == 3


def test_a_hysteresis_band_goes_on_the_wire_and_into_the_journal() -> None:
    """hysteresis_m travels in a definition (x-geo forwards it, x-fence judges with it) and in
    x-fence's journal form of a fence; a fence without one carries no field at all."""
    from fence.x_fence import codec

    banded = FenceDef(fence_id="yard-1", version=3, geometry=YARD, timeout_s=90.0, name="Yard",
                      hysteresis_m=25.0)
    d = round_trip(control.define_for_region(banded, TS, 21, RANGES, INTERIOR))
    assert isinstance(d, Define) and d.fence.hysteresis_m == 25.0
    assert "hysteresis_m" not in control.fence_json(fence())
    stored = codec.StoredFence(banded, TS, True, None, frozenset())
    assert codec.unpack_fence(unpack(pack("j", **codec.pack_fence(stored)))).fence.hysteresis_m == 25.0
    msg = fence_msg()
    msg["fence"] = {**msg["fence"], "hysteresis_m": 600.0}  # the yard is ~750 m wide: nothing inside
    assert "nowhere 600 m wide" in refusal(msg)
    msg["fence"] = {**msg["fence"], "hysteresis_m": -1}
    assert "hysteresis_m -1" in refusal(msg)


def test_a_fence_filter_goes_on_the_wire_and_into_the_journal() -> None:
    from exchanges.fence_options import filters
    from fence.x_fence import codec

    where = filters.parse([["type", "in", ["truck", "van"]], ["speed", ">", 20]])
    f = FenceDef(fence_id="yard-1", version=3, geometry=YARD, timeout_s=90.0, name="Yard", where=where)
    d = round_trip(control.define_for_region(f, TS, 21, RANGES, INTERIOR))
    assert isinstance(d, Define) and d.fence.where == where
    assert "where" not in control.fence_json(fence())
    stored = codec.StoredFence(f, TS, True, None, frozenset())
    assert codec.unpack_fence(unpack(pack("j", **codec.pack_fence(stored)))).fence.where == where
    msg = fence_msg()
    msg["fence"] = {**msg["fence"], "where": [["speed", "~", 3]]}
    assert "where op" in refusal(msg)


def _routed(oid: str, where: tuple[float, float], ts: float, version: int,
            extra: dict[str, object] | None = None) -> WorkerBatch:
    """One position x-geo routed with `version` of fence F (its candidate)."""
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64), [extra] if extra else [])
    return WorkerBatch("w0", pos, np.array([0, 1], np.int64), ["F"], np.zeros(1, np.int32), np.zeros(1, bool),
                       versions=np.array([version], np.int64))


def test_a_position_routed_with_the_replaced_version_is_judged_by_its_band_and_filter() -> None:
    """A region that had not applied a change yet routes with the old version: its band, its
    filter and its geometry decide, not the new version's (fence/x_fence/core.py `_inside`)."""
    square = box(9.50, 47.10, 9.51, 47.11)
    m = 1.0 / 111_195.0 / np.cos(np.radians(47.105))  # degrees of longitude per metre
    just_out = (9.50 - 10 * m, 47.105)  # 10 m outside the west side: within a 30 m band
    deep_in = (9.505, 47.105)
    x = XFence("w0")
    x.define(FenceDef(fence_id="F", version=1, geometry=square, timeout_s=600.0, hysteresis_m=30.0), 0.0)
    assert [e.event for e in x.route(_routed("o", deep_in, 10.0, 1))] == ["enter"]
    x.define(FenceDef(fence_id="F", version=2, geometry=square, timeout_s=600.0), 20.0, regions=["a", "b"],
             region="a")  # b still on v1
    assert x.route(_routed("o", just_out, 30.0, 1)) == []  # v1's band: still inside
    left = x.route(_routed("o", just_out, 31.0, 2))  # v2 has no band
    assert [(e.event, e.ts) for e in left] == [("leave", 31.0)]
    # a filter: v1 takes trucks only, v2 everyone
    y = XFence("w0")
    y.define(FenceDef(fence_id="F", version=1, geometry=square, timeout_s=600.0,
                      where=filters.parse([["type", "==", "truck"]])), 0.0)
    y.define(FenceDef(fence_id="F", version=2, geometry=square, timeout_s=600.0), 20.0, regions=["a", "b"],
             region="a")
    assert y.route(_routed("car", deep_in, 30.0, 1, {"type": "car"})) == []  # v1 refuses a car
    assert [e.event for e in y.route(_routed("car", deep_in, 31.0, 2, {"type": "car"}))] == ["enter"]
    # once every region forwarded the change, the replaced version is gone (judged as the current)
    y.define(FenceDef(fence_id="F", version=2, geometry=square, timeout_s=600.0), 20.0, region="b")
    assert 0 not in y._prev
