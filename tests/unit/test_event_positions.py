"""An event carries the position it was decided from (fence/x_fence/event_positions.py): where
and when the object was and the position's extra fields (up to MAX_FIELDS_BYTES), through the
real core pipeline (x-ingress, x-geo, x-fence cores); a presence event never does."""

from __future__ import annotations

from typing import Any

import numpy as np
from shapely.geometry import Point

from bench import workload as wl
from exchanges.batch import PositionBatch
from exchanges.fence_events import MAX_FIELDS_BYTES, Event, presence_json
from tests.wire_contract import errors

LON, LAT = 9.52, 47.14


Row = tuple[str, float, float, float, dict[str, Any] | None]  # object, lon, lat, ts, extra fields


def _feed(pipe: wl.CorePipeline, rows: list[Row]) -> list[Event]:
    ids = [r[0] for r in rows]
    lon, lat, ts = (np.array([r[k] for r in rows]) for k in (1, 2, 3))
    batch = PositionBatch(ids, lon, lat, ts, np.zeros(len(rows), np.uint64), [r[4] for r in rows])
    return pipe.feed(batch)


def test_enter_and_leave_carry_their_position_and_its_fields() -> None:
    fence = wl.Fence("fleet:depot", LON, LAT, 200.0, Point(LON, LAT).buffer(0.002))
    pipe = wl.CorePipeline()
    pipe.define([fence])
    t0 = wl.T0
    big = {"blob": "x" * (MAX_FIELDS_BYTES + 10)}
    events = _feed(pipe, [("fleet:van-1", LON + 0.01, LAT, t0, {"speed": 3}),
                          ("fleet:van-2", LON + 0.01, LAT, t0, None)])
    events += _feed(pipe, [("fleet:van-1", LON, LAT, t0 + 10, {"speed": 12, "driver": {"name": "Ana"}}),
                           ("fleet:van-2", LON + 0.0005, LAT, t0 + 10, big)])
    events += _feed(pipe, [("fleet:van-1", LON + 0.01, LAT + 0.001, t0 + 20, {"speed": 40})])
    got = {(e.object_id, e.event): e for e in events}
    enter, leave = got[("fleet:van-1", "enter")], got[("fleet:van-1", "leave")]
    assert enter.position == {"lon": LON, "lat": LAT, "ts": t0 + 10,
                              "fields": {"speed": 12, "driver": {"name": "Ana"}}}
    assert leave.position == {"lon": LON + 0.01, "lat": LAT + 0.001, "ts": t0 + 20, "fields": {"speed": 40}}
    truncated = got[("fleet:van-2", "enter")].position
    assert truncated == {"lon": LON + 0.0005, "lat": LAT, "ts": t0 + 10, "fields_truncated": True}
    for e in events:
        body = e.to_json()
        assert errors("event.schema.json", body) == [], body
        assert body["position"]["ts"] == e.position_ts
    # a presence event (an object of another tenant the fence counts from): a count, no place
    shared = Event("enter", "fleet:depot", "other:van-9", t0, "entered", "a" * 32, t0, "b" * 24, None,
                   enter.position)
    assert "position" in shared.to_json() and "position" not in presence_json(shared)
    assert errors("event.schema.json", presence_json(shared)) == []
    assert errors("event.schema.json", {**presence_json(shared), "position": enter.position})


def test_a_timers_leave_carries_no_position() -> None:
    fence = wl.Fence("fleet:yard", LON, LAT, 200.0, Point(LON, LAT).buffer(0.002))
    pipe = wl.CorePipeline()
    pipe.define([fence], timeout_s=60.0)
    events = _feed(pipe, [("fleet:van-3", LON, LAT, wl.T0, {"load": "ice"})])
    assert [(e.event, e.position is not None) for e in events] == [("enter", True)]
    timeouts = [e for w in pipe.fence.values() for e in w.expire(wl.T0 + 120.0)]
    assert [(e.event, e.reason, e.position) for e in timeouts] == [("leave", "timeout", None)]
    assert "position" not in timeouts[0].to_json()


def test_fields_that_json_cannot_hold_as_it_comes() -> None:
    """A msgpack gateway batch's binary field goes as base64; what is not JSON at all is left
    out (fields_truncated); the body always encodes."""
    import orjson

    from exchanges.fence_events import position_json
    assert position_json(9.5, 47.1, 1.7e9, {"raw": b"\x00\xff", "n": 1})["fields"] == {"raw": "AP8=", "n": 1}
    odd = position_json(9.5, 47.1, 1.7e9, {"x": {1, 2}})
    assert odd == {"lon": 9.5, "lat": 47.1, "ts": 1.7e9, "fields_truncated": True}
    for p in (odd, position_json(9.5, 47.1, 1.7e9, {"raw": b"z"})):
        orjson.dumps(p)
