"""The x-fence core's snapshot and journal records: a core rebuilt from them is the same core
(same state, and the same events for whatever comes next), whatever the operations were."""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgpack
import numpy as np
import pytest
from shapely.geometry import box

from exchanges.batch import PositionBatch
from exchanges.fence_def import FenceDef
from exchanges.fence_events import Event
from exchanges.worker_batch import WorkerBatch
from fence.x_fence import codec
from fence.x_fence.core import XFence

GEOMS = {"A": box(9.500, 47.100, 9.510, 47.110), "B": box(9.520, 47.100, 9.530, 47.110),
         "C": box(9.505, 47.105, 9.525, 47.108)}  # overlaps A and B
SPOTS = [(9.505, 47.105), (9.525, 47.105), (9.507, 47.106), (9.515, 47.105), (9.54, 47.2), (9.521, 47.107)]


def at(oid: str, where: tuple[float, float], ts: float, cands: Sequence[str] = (), *, notice: bool = False,
       gate: float = 0.0) -> WorkerBatch:
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64))
    return WorkerBatch("w0", pos, np.array([0, len(cands)], np.int64), list(cands),
                       np.arange(len(cands), dtype=np.int32), np.zeros(len(cands), bool),
                       np.array([True]) if notice else None, np.array([gate]) if gate else None)


def key(events: Sequence[Event]) -> list[tuple[str, str, str, float, str, str]]:
    return [(e.event, e.fence_id, e.object_id, e.ts, e.reason, e.event_id) for e in events]


def roundtrip(data: dict) -> dict:  # type: ignore[type-arg]
    """Through msgpack, as the journal stores it."""
    out: dict = msgpack.unpackb(msgpack.packb(data, use_bin_type=True), raw=False)  # type: ignore[type-arg]
    return out


class Ops:
    """Random operations on a core: positions (batches, notices, gates), definitions,
    deletions, expiry; each returns the events."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.ts = 100.0
        self.versions = {"A": 1, "B": 1, "C": 1}
        self.objects = [f"o{i}" for i in range(8)]

    def next(self) -> tuple[str, object]:
        r = self.rng.random()
        self.ts += self.rng.choice([0.0, 1.0, 2.5])
        if r < 0.06:
            fid = self.rng.choice("ABC")
            self.versions[fid] += 1
            g = GEOMS[fid].buffer(self.rng.choice([0.0, 0.002, -0.002]))
            return "define", FenceDef(fence_id=fid, version=self.versions[fid], geometry=g,
                                      timeout_s=self.rng.choice([30.0, 300.0]),
                                      dwell_s=self.rng.choice([0.0, 0.0, 2.0, 5.0]))
        if r < 0.09:
            fid = self.rng.choice("ABC")
            self.versions[fid] += 1
            return "drop", (fid, self.versions[fid])
        if r < 0.15:
            return "expire", self.ts + self.rng.choice([0.0, 40.0, 400.0])
        rows = []
        for _ in range(self.rng.randint(1, 6)):
            oid = self.rng.choice(self.objects)
            where = self.rng.choice(SPOTS)
            ts = self.ts - self.rng.choice([0.0, 0.0, 0.5, 3.0])  # some stale, some equal
            cands = [f for f in "ABC" if self.rng.random() < 0.7]
            kind = self.rng.random()
            if kind < 0.1:
                rows.append(at(oid, where, ts, notice=True))
            elif kind < 0.2:
                rows.append(at(oid, where, ts, cands, gate=ts - self.rng.choice([0.0, 1.0])))
            else:
                rows.append(at(oid, where, ts, cands))
        return "route", WorkerBatch.concat(rows)


def run(x: XFence, op: tuple[str, object]) -> list[Event]:
    kind, arg = op
    if kind == "define":
        assert isinstance(arg, FenceDef)
        return x.define(arg, 0.0 + arg.version)
    if kind == "drop":
        fid, version = arg  # type: ignore[misc]
        return x.drop(fid, version, 50.0 + version)
    if kind == "expire":
        assert isinstance(arg, float)
        return x.expire(arg)
    assert isinstance(arg, WorkerBatch)
    return x.route(arg, received_at=1000.0)


def fresh(dwell: bool = False) -> XFence:
    """The three fences; with `dwell`, B has a dwell time of 3 s."""
    x = XFence("w0")
    for fid, g in GEOMS.items():
        x.define(FenceDef(fence_id=fid, version=1, geometry=g, timeout_s=300.0,
                          dwell_s=3.0 if dwell and fid == "B" else 0.0), 0.0)
    return x


@pytest.mark.parametrize("seed", range(12))
def test_journal_records_rebuild_the_same_core_after_every_operation(seed: int) -> None:
    x = fresh(dwell=True)
    mirror = XFence.restore(roundtrip(x.snapshot()))
    assert codec.differences(x.state(), mirror.state()) == []
    n = len(x._objects)
    ops = Ops(seed)
    waited = 0
    for step in range(150):
        op = ops.next()
        run(x, op)
        waited += bool(x._unconfirmed.size)
        record = x.changes(n)
        if record is not None:
            record = roundtrip(record)
            mirror.apply(record)
            assert codec.differences(x.state(), mirror.state()) == [], (seed, step, op[0])
            mirror.apply(record)  # a record replayed twice: the same state
            assert codec.differences(x.state(), mirror.state()) == [], (seed, step, "twice")
        n = len(x._objects)
        assert x.changes(n) is None  # nothing left over
    assert waited, "some stays waited for a dwell time (unconfirmed) on the way"


@pytest.mark.parametrize("seed", range(12))
def test_a_restored_core_emits_the_same_events_as_the_original(seed: int) -> None:
    x = fresh(dwell=True)
    ops = Ops(seed)
    for _ in range(80):
        run(x, ops.next())
    y = XFence.restore(roundtrip(x.snapshot()))
    assert codec.differences(x.state(), y.state()) == []
    assert x.stats() == y.stats()
    for _ in range(80):
        op = ops.next()
        assert key(run(x, op)) == key(run(y, op))
    assert codec.differences(x.state(), y.state()) == []


def test_the_snapshot_covers_what_changes_would_report() -> None:
    x = fresh()
    x.route(at("o1", SPOTS[0], 100.0, ["A", "C"]))
    assert x.changes(0) is not None
    x.route(at("o1", SPOTS[1], 110.0, ["B"], gate=110.0))  # held: waits for a notice
    x.snapshot()
    assert x.changes(len(x._objects)) is None


def test_held_positions_survive_and_are_released_after_a_restore() -> None:
    x = fresh()
    x.route(at("o1", SPOTS[0], 100.0, ["A"]))
    assert x.route(at("o1", SPOTS[1], 110.0, ["B"], gate=110.0)) == []
    y = XFence.restore(roundtrip(x.snapshot()))
    assert y.stats()["held_now"] == 1
    got = key(y.route(at("o1", SPOTS[1], 110.0, notice=True)))
    assert [(e[0], e[1]) for e in got] == [("leave", "A"), ("enter", "B")]


def test_a_record_from_the_future_is_refused() -> None:
    x = fresh()
    x.route(at("o1", SPOTS[0], 100.0, ["A"]))
    record = x.changes(0)
    assert record is not None
    with pytest.raises(ValueError, match="starts at object 5"):
        fresh().apply({**record, "n0": 5})


def test_a_snapshot_of_another_format_or_damaged_is_refused() -> None:
    data = fresh().snapshot()
    with pytest.raises(ValueError, match="format"):
        XFence.restore({**data, "format": 99})
    x = fresh()
    x.route(WorkerBatch.concat([at("o1", SPOTS[0], 100.0, ["A"]), at("o2", SPOTS[2], 100.0, ["A", "C"])]))
    data = x.snapshot()
    keys = np.frombuffer(data["keys"], "<u8")
    with pytest.raises(ValueError, match="sorted"):
        XFence.restore({**data, "keys": keys[::-1].tobytes()})
    with pytest.raises(ValueError, match="rows"):
        XFence.restore({**data, "last_ts": b""})


def test_a_change_in_transition_survives_the_snapshot_and_the_journal() -> None:
    """The change time, whether the version created the fence, and while not every region
    has forwarded a change, the replaced geometry and the regions still to come."""
    x = XFence("w0")
    x.define(FenceDef(fence_id="f", version=1, geometry=box(9.50, 47.10, 9.51, 47.11), timeout_s=60.0), 100.0)
    n = len(x._objects)
    x.snapshot()
    x.define(FenceDef(fence_id="f", version=2, geometry=box(9.52, 47.10, 9.53, 47.11), timeout_s=60.0),
             200.0, ("a", "b", "c"), "a")
    record = x.changes(n)
    assert record is not None
    copy = XFence.restore(x.snapshot())
    assert codec.differences(x.state(), copy.state()) == []
    code = x._fence_code["f"]
    assert copy._pending[code] == {"b", "c"} and copy._prev[code].version == 1
    assert copy._changed_at[code] == 200.0
    assert not copy._created[code]
    replayed = XFence("w0")
    replayed.define(FenceDef(fence_id="f", version=1, geometry=box(9.50, 47.10, 9.51, 47.11),
                             timeout_s=60.0), 100.0)
    replayed.apply(msgpack.unpackb(msgpack.packb(record)))
    assert codec.differences(x.state(), replayed.state()) == []
    # the other regions forward it: recorded one by one, and the transition ends
    x.define(FenceDef(fence_id="f", version=2, geometry=box(9.52, 47.10, 9.53, 47.11), timeout_s=60.0),
             200.0, ("a", "b", "c"), "b")
    one = x.changes(len(x._objects))
    assert one is not None
    replayed.apply(msgpack.unpackb(msgpack.packb(one)))
    assert replayed._pending[code] == {"c"}
    x.define(FenceDef(fence_id="f", version=2, geometry=box(9.52, 47.10, 9.53, 47.11), timeout_s=60.0),
             200.0, ("a", "b", "c"), "c")
    assert code not in x._prev and code not in x._pending
    end = x.changes(len(x._objects))
    assert end is not None
    replayed.apply(msgpack.unpackb(msgpack.packb(end)))
    assert codec.differences(x.state(), replayed.state()) == [] and code not in replayed._prev
