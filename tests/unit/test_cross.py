"""CROSS on a fence (issue 20, part 2): the rule (exchanges/fence_options/cross.py `crosses`), x-geo's
segment candidates with the previous position (exchanges/x_geo/core.py, "CROSS"), the wire,
and x-fence's events. The bulk comparison with the reference is in test_core_pipeline.py
(`test_cross_gives_the_reference_events`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.control import _fence, fence_json
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef, InvalidFence
from exchanges.fence_options.cross import check_cross, crosses
from exchanges.worker_batch import WorkerBatch
from exchanges.x_geo.core import XGeo
from fence.archive import event_row
from fence.x_fence.core import XFence
from tests.unit.test_core_fast_paths import OneWorker

F = box(9.500, 47.100, 9.501, 47.101)  # about 75 x 110 m
WEST, EAST, INSIDE, NORTH = (9.4995, 47.1005), (9.5015, 47.1005), (9.5005, 47.1005), (9.5008, 47.1015)


def test_the_rule() -> None:
    g = np.array([F] * 5, dtype=object)
    x0, y0 = np.array([WEST[0], WEST[0], INSIDE[0], WEST[0], 9.4995]), np.array([WEST[1], WEST[1], INSIDE[1],
                                                                                   WEST[1], 47.0995])
    x1, y1 = np.array([EAST[0], NORTH[0], EAST[0], 9.4999, 9.5000]), np.array([EAST[1], NORTH[1], EAST[1],
                                                                               47.1009, 47.1000])
    # through; through a corner's inside; from inside; beside it; to the corner (touches only)
    assert crosses(g, x0, y0, x1, y1).tolist() == [True, True, False, False, False]


def binding(fence: FenceDef, bits: int = 24) -> FenceBinding:
    """Fine (24 bits, cells of about 2 m): the test's positions 35 m off are outside its ranges."""
    cov = hk.cover(fence.geometry, bits).to_bits(INDEX_BITS)
    return FenceBinding(fence.fence_id, fence.version, cov.ranges, cov.interior, fence.cross_box())


def positions(rows: list[tuple[str, tuple[float, float], float]]) -> PositionBatch:
    lon, lat = np.array([r[1][0] for r in rows]), np.array([r[1][1] for r in rows])
    x, y = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    return PositionBatch([r[0] for r in rows], lon, lat, np.array([r[2] for r in rows]),
                         hk.encode_many(x, y, INDEX_BITS))


def test_x_geo_sends_segments_meeting_the_box_with_the_position_before() -> None:
    geo = XGeo("a", ["w0"], OneWorker())
    geo.add_binding(binding(FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0, cross=True)))
    assert geo.route(positions([("o", WEST, 10.0), ("far", (9.6, 47.2), 10.0)])) == {}  # nothing before
    out = geo.route(positions([("o", EAST, 20.0), ("far", (9.61, 47.2), 20.0)]))["w0"]
    assert out.positions.ids == ["o"] and out.candidates(0) == [("F", False)]
    assert out.prev is not None and out.prev.tolist() == [[WEST[0], WEST[1], 10.0]]
    # within one batch: the row before; a segment longer than the limit is not tested
    two = geo.route(positions([("o", WEST, 30.0), ("o", EAST, 31.0), ("o", (10.2, 47.1005), 32.0)]))["w0"]
    assert two.prev is not None and two.prev[1].tolist() == [WEST[0], WEST[1], 30.0]
    assert [two.candidates(i) for i in range(len(two.positions))] == [[("F", False)], [("F", False)], []]
    # a fence without cross, or no more cross: no segments
    geo.add_binding(binding(FenceDef(fence_id="F", version=2, geometry=F, timeout_s=60.0)))
    assert geo.route(positions([("o", WEST, 40.0)])) == {} and geo.binding("F").cross is None  # type: ignore[union-attr]


def test_a_candidate_by_its_ranges_gets_the_position_before_too() -> None:
    """Coarse ranges (cells of about 150 m) hold the positions beside the fence: they are
    candidates already, and the worker still needs the position before for CROSS."""
    geo = XGeo("a", ["w0"], OneWorker())
    geo.add_binding(binding(FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0, cross=True),
                            bits=17))
    geo.route(positions([("o", WEST, 10.0)]))
    out = geo.route(positions([("o", EAST, 20.0)]))["w0"]
    assert out.candidates(0) == [("F", False)] and out.prev is not None
    assert out.prev.tolist() == [[WEST[0], WEST[1], 10.0]]


def test_wire_carries_the_previous_positions() -> None:
    geo = XGeo("a", ["w0"], OneWorker())
    geo.add_binding(binding(FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0, cross=True)))
    geo.route(positions([("o", WEST, 10.0)]))
    wb = geo.route(positions([("o", EAST, 20.0)]))["w0"]
    back = WorkerBatch.from_wire(wb.to_wire())
    assert back.prev is not None and np.array_equal(back.prev, wb.prev)  # type: ignore[arg-type]
    plain = WorkerBatch.from_wire({**wb.to_wire(), "prev": None})
    both = WorkerBatch.concat([plain, wb])
    assert both.prev is not None and np.isnan(both.prev[0]).all()
    assert both.prev[1].tolist() == wb.prev[0].tolist()  # type: ignore[index]
    assert both.take([1]).prev.tolist() == wb.prev.tolist()  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="do not fit"):
        WorkerBatch.from_wire({**wb.to_wire(), "prev": b"\0" * 16})


def test_x_fence_reports_a_crossing_once_and_nothing_else() -> None:
    geo, x = XGeo("a", ["w0"], OneWorker()), XFence("w0")
    fence = FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0, cross=True)
    geo.add_binding(binding(fence))
    x.define(fence, 0.0)
    events = []
    for where, ts in ((WEST, 10.0), (EAST, 20.0), (INSIDE, 30.0), (WEST, 40.0)):
        for wb in geo.route(positions([("o", where, ts)])).values():
            events += x.route(wb)
            if ts == 20.0:
                assert x.route(wb) == []  # redelivered: nothing again
    assert [(e.event, e.reason, e.ts) for e in events] == [
        ("cross", "crossed", 20.0), ("enter", "entered", 30.0), ("leave", "exited", 40.0)]
    j = events[0].to_json()
    assert j["event"] == "cross" and "visit_id" not in j and "inside_s" not in j
    assert event_row(__import__("orjson").dumps(j))[3:5] == ("cross", "crossed")
    plain = XFence("w0")
    plain.define(dataclasses.replace(fence, cross=False), 0.0)
    wb = geo.route(positions([("o", EAST, 50.0)]))["w0"]
    assert [e.event for e in x.route(wb)] == ["cross"] and plain.route(wb) == []


def test_cross_is_checked_and_carried() -> None:
    assert check_cross(True) is True and check_cross(False) is False
    for bad in (1, "true", None, 0.0):
        with pytest.raises(InvalidFence, match="cross"):
            check_cross(bad)
    f = FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0, cross=True)
    assert fence_json(f)["cross"] is True and _fence(fence_json(f)).cross
    assert "cross" not in fence_json(dataclasses.replace(f, cross=False))
    assert f.cross_box() == F.bounds and dataclasses.replace(f, cross=False).cross_box() is None
