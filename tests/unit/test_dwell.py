"""Dwell on a fence (issue 20, part 2; fence/x_fence/core.py, "Dwell"): a stay is reported by
ENTER `dwelled` only once it has lasted the fence's `dwell_s`, a shorter one gives no event,
whichever way it ends (exit, timer, fence deleted), and the waiting stays go through fence
changes, handovers, snapshots and the journal. The bulk comparison with the reference is in
test_core_pipeline.py (`test_dwell_gives_the_reference_events`)."""

from __future__ import annotations

import dataclasses

import pytest
from shapely.geometry import box

from exchanges.control import _fence, fence_json
from exchanges.fence_def import FenceDef, InvalidFence
from exchanges.fence_events import visit_id
from exchanges.fence_options.dwell import check_dwell
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from fence.reference import visit_problems
from fence.spec import from_feature
from fence.x_fence import codec
from fence.x_fence.core import XFence
from tests.unit.test_fence_changes import Sim, dated, split_worldmap
from tests.unit.test_fence_sidecar_core import at, kinds
from tests.unit.test_state_codec import roundtrip

IN, OUT = (0.5, 0.5), (2.0, 2.0)
F = box(0, 0, 1, 1)


def worker(dwell_s: float = 5.0, timeout_s: float = 60.0) -> XFence:
    x = XFence("w0")
    x.define(FenceDef(fence_id="F", version=1, geometry=F, timeout_s=timeout_s, dwell_s=dwell_s), 0.0)
    return x


def walk(x: XFence, steps: list[tuple[tuple[float, float], float]], oid: str = "o") -> list:  # type: ignore[type-arg]
    out = []
    for where, ts in steps:
        out += x.route(at(oid, where, ts, ["F"] if where == IN else []))
    return out


def test_a_short_stay_gives_no_event() -> None:
    x = worker()
    assert walk(x, [(IN, 100.0), (IN, 103.0), (OUT, 104.0)]) == []
    assert x.fences_of("o") == [] and x.occupants("F") == [] and x._unconfirmed.size == 0


def test_a_stay_is_reported_once_it_lasted_the_dwell_time() -> None:
    x = worker()
    assert walk(x, [(IN, 100.0), (IN, 103.0)]) == []
    assert x.occupants("F") == [{"object_id": "o", "since": 100.0, "last_seen": 103.0, "confirmed": False}]
    assert x.counts() == {} and x.fences_of("o") == []
    got = walk(x, [(IN, 105.0), (IN, 109.0), (OUT, 112.0)])
    assert kinds(got) == [("enter", "F", "o", "dwelled", 105.0), ("leave", "F", "o", "exited", 112.0)]
    assert got[0].inside_s == 5.0 and got[1].inside_s == 12.0
    assert got[0].visit_id == got[1].visit_id == visit_id("F", "o", 100.0)
    assert visit_problems(got) == []
    assert got[0].to_json()["inside_s"] == 5.0


def test_within_one_batch_as_position_by_position() -> None:
    """Several positions of an object in one batch (the runs path): the same events."""
    steps = [(IN, 100.0), (IN, 103.0), (OUT, 104.0), (IN, 110.0), (IN, 114.0), (IN, 116.0), (OUT, 120.0),
             (IN, 121.0)]
    one_by_one = kinds(walk(worker(), steps))
    x = worker()
    batch = WorkerBatch.concat([at("o", w, t, ["F"] if w == IN else []) for w, t in steps])
    assert kinds(x.route(batch)) == one_by_one == [("enter", "F", "o", "dwelled", 116.0),
                                                   ("leave", "F", "o", "exited", 120.0)]
    assert x.occupants("F")[0]["confirmed"] is False  # the last stay (since 121) waits


@pytest.mark.parametrize("reported", [False, True])
def test_the_timer_and_a_delete_are_silent_for_a_stay_not_reported(reported: bool) -> None:
    steps = [(IN, 100.0), (IN, 106.0)] if reported else [(IN, 100.0), (IN, 102.0)]
    x = worker()
    assert len(walk(x, steps)) == int(reported)
    timer = x.expire(200.0)
    assert [(e.event, e.reason) for e in timer] == ([("leave", "timeout")] if reported else [])
    y = worker()
    walk(y, steps)
    assert [(e.event, e.reason) for e in y.drop("F", 2, 150.0)] == ([("leave", "fence_deleted")]
                                                                      if reported else [])
    assert x._unconfirmed.size == y._unconfirmed.size == 0


def test_a_replaced_fence_keeps_the_waiting_stay_and_its_new_dwell_time_counts() -> None:
    x = worker(dwell_s=30.0)
    walk(x, [(IN, 100.0), (IN, 110.0)])
    x.define(FenceDef(fence_id="F", version=2, geometry=F, timeout_s=60.0, dwell_s=0.0),
             111.0)  # no dwell any more: next position reports it
    got = walk(x, [(IN, 112.0)])
    assert kinds(got) == [("enter", "F", "o", "dwelled", 112.0)] and got[0].inside_s == 12.0


def test_a_new_fence_with_a_dwell_time_waits_for_the_objects_already_inside() -> None:
    """The re-check of a created fence (reason entered at once without dwell) waits too; the
    object's next positions inside report it."""
    sim = Sim(split_worldmap(), ["w0"])
    sim.publish_positions([("parked", 9.5125, 47.1105, 900.0)])
    sim.quiesce()
    sim.publish_change("R", box(9.510, 47.108, 9.515, 47.113), 1000.0, 600.0, dwell_s=20.0)
    sim.quiesce()
    assert sim.events == [] and sim.fence["w0"].occupants("R")[0]["confirmed"] is False
    for ts in (1010.0, 1019.0, 1020.0, 1030.0):
        sim.publish_positions([("parked", 9.5125, 47.1105, ts)])
        sim.quiesce()
    assert dated(sim.events) == [("enter", "R", "parked", 1020.0, "dwelled")]


def test_the_waiting_stay_moves_with_a_handover_and_survives_the_journal() -> None:
    a, b = worker(), XFence("w1")
    walk(a, [(IN, 100.0), (IN, 102.0)])
    to_b = HashRing(["w1"])
    b.take(roundtrip(a.export(to_b)), to_b)
    assert b.occupants("F")[0]["confirmed"] is False
    c = XFence.restore(roundtrip(b.snapshot()))
    assert codec.differences(b.state(), c.state()) == []
    for w in (b, c):
        got = w.route(dataclasses.replace(at("o", IN, 106.0, ["F"]), worker="w1"))
        assert kinds(got) == [("enter", "F", "o", "dwelled", 106.0)] and got[0].inside_s == 6.0


def test_dwell_s_is_checked_and_carried() -> None:
    assert check_dwell(0) == 0.0 and check_dwell(86_400) == 86_400.0
    for bad in (-1, 86_401, True, "5", float("nan"), None):
        with pytest.raises(InvalidFence, match="dwell_s"):
            check_dwell(bad)
    f = FenceDef(fence_id="F", version=3, geometry=F, timeout_s=60.0, dwell_s=45.0)
    assert fence_json(f)["dwell_s"] == 45.0 and _fence(fence_json(f)).dwell_s == 45.0
    assert "dwell_s" not in fence_json(dataclasses.replace(f, dwell_s=0.0))
    with pytest.raises(InvalidFence, match="dwell_s"):
        _fence({**fence_json(f), "dwell_s": -3})
    square = {"type": "Polygon", "coordinates": [[[0, 0], [1, 0], [1, 1], [0, 0]]]}
    feature = {"type": "Feature", "geometry": square, "properties": {"id": "F", "dwell_s": 90}}
    assert from_feature(feature).dwell_s == 90.0
    stored = codec.unpack_fence(codec.pack_fence(codec.StoredFence(f, 1.0, True, None, frozenset())))
    assert stored.fence.dwell_s == 45.0
