"""What an x-fence worker receives, without a broker: `WorkerBatch.concat` / `take` / the
wire, handover notices and gates applied by the real x-fence core (`XFence.route`), and a
random scenario routed by real x-ingress / x-geo cores, its regions' streams interleaved."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import shapely
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_events import ENTER, ENTERED, EXITED, LEAVE, Event
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo.core import XGeo
from fence.x_fence.core import XFence
from ingress.core import XIngress

Cand = list[tuple[str, bool]]
Ev = tuple[str, str, str, str, float]  # (kind, fence, object, reason, ts)


def part(ids: Sequence[str], cands: Sequence[Cand], ts0: float = 1000.0, fences: Sequence[str] | None = None,
         notice: Sequence[bool] | None = None, gate: Sequence[float] | None = None, worker: str = "w0",
         extra: list[dict[str, object] | None] | None = None) -> WorkerBatch:
    """A WorkerBatch whose position i has candidates cands[i] (fence, interior)."""
    order = list(fences) if fences is not None else list(dict.fromkeys(f for c in cands for f, _ in c))
    n = len(ids)
    pos = PositionBatch(list(ids), np.linspace(9.5, 9.6, n), np.linspace(47.1, 47.2, n),
                        np.asarray([ts0 + k for k in range(n)], np.float64),
                        np.arange(n, dtype=np.uint64) * np.uint64(7), extra or [])
    return WorkerBatch(worker, pos, np.r_[0, np.cumsum([len(c) for c in cands], dtype=np.int64)], order,
                       np.array([order.index(f) for c in cands for f, _ in c], np.int32),
                       np.array([i for c in cands for _, i in c], bool),
                       None if notice is None else np.array(notice, bool),
                       None if gate is None else np.array(gate, np.float64))


def all_candidates(wb: WorkerBatch) -> list[Cand]:
    return [wb.candidates(i) for i in range(len(wb.positions))]


def check_concat(parts: Sequence[WorkerBatch]) -> WorkerBatch:
    out = WorkerBatch.concat(parts)
    assert out.worker == parts[0].worker and out.positions.ids == [i for p in parts for i in p.positions.ids]
    np.testing.assert_array_equal(out.positions.ts, np.concatenate([p.positions.ts for p in parts]))
    assert all_candidates(out) == [c for p in parts for c in all_candidates(p)]
    assert len(out.ptr) == len(out.positions) + 1 and int(out.ptr[-1]) == out.cand.size == out.interior.size
    assert out.ptr.dtype == np.int64 and out.cand.dtype == np.int32 and out.interior.dtype == np.bool_
    assert len(set(out.fences)) == len(out.fences) == len({f for p in parts for f in p.fences})
    assert out.notices().tolist() == [x for p in parts for x in p.notices().tolist()]
    assert out.gates().tolist() == [x for p in parts for x in p.gates().tolist()]
    back = WorkerBatch.from_wire(out.to_wire())
    assert all_candidates(back) == all_candidates(out)
    assert back.notices().tolist() == out.notices().tolist() and back.gates().tolist() == out.gates().tolist()
    return out


# --------------------------------------------------------------------------- WorkerBatch


def test_concat_merges_overlapping_fence_lists() -> None:
    a = part(["o1", "o2", "o3"], [[("A", True), ("B", False)], [], [("B", True)]])
    b = part(["o4", "o1"], [[("C", False), ("A", False)], [("B", True), ("C", True)]], ts0=2000.0)
    c = part(["o5"], [[("A", True)]], ts0=3000.0, fences=["C", "A"])
    out = check_concat([a, b, c])
    assert out.fences == ["A", "B", "C"]
    np.testing.assert_array_equal(out.cand, [0, 1, 1, 2, 0, 1, 2, 0])
    assert out.candidates(3) == [("C", False), ("A", False)] and out.candidates(5) == [("A", True)]
    assert out.notice is None and out.gate is None  # no part has them


def test_concat_parts_without_candidates_or_positions_and_unused_fences() -> None:
    nothing = WorkerBatch("w0", PositionBatch.empty(), np.zeros(1, np.int64), [], np.empty(0, np.int32),
                          np.empty(0, bool))
    out = check_concat([nothing, part(["o1", "o2"], [[], []]), part(["o3"], [[("A", True)]], 2000.0,
                        fences=["Z", "A"], extra=[{"speed": 1}]), nothing, part(["o4"], [[]], 3000.0)])
    np.testing.assert_array_equal(out.ptr, [0, 0, 0, 1, 1])
    assert out.fences == ["Z", "A"] and out.positions.extra == [None, None, {"speed": 1}, None]


def test_concat_fills_notices_and_gates_of_parts_without_them() -> None:
    a = part(["o1", "o2"], [[("A", False)], []], notice=[False, True])
    b = part(["o3"], [[("A", True)]], ts0=2000.0, gate=[1500.0])
    c = part(["o4"], [[("B", False)]], ts0=3000.0)
    out = check_concat([a, b, c])
    assert out.notice is not None and out.notice.tolist() == [False, True, False, False]
    assert out.gate is not None and out.gate.tolist() == [0.0, 0.0, 1500.0, 0.0]
    assert out.gate.dtype == np.float64 and out.notice.dtype == np.bool_
    assert WorkerBatch.concat([a]) is a
    with pytest.raises(ValueError, match="nothing"):
        WorkerBatch.concat([])
    with pytest.raises(ValueError, match="different workers"):
        WorkerBatch.concat([a, part(["o9"], [[]], worker="w1")])


def test_sent_rows_leave_out_notices_and_rechecks() -> None:
    """A row's age is a position's latency only for a device's report: a handover notice
    announces an object's last position again, a re-check replays it for a fence change."""
    a = part(["o1", "o2", "o3"], [[], [], []], notice=[False, True, False])
    assert a.sent_rows().tolist() == [True, False, True]
    b = dataclasses.replace(a, recheck=np.array([-1, -1, 0], np.int32))
    assert b.sent_rows().tolist() == [True, False, False]
    assert part(["o4"], [[]]).sent_rows().tolist() == [True]


def test_concat_many_random_parts() -> None:
    rng, parts = np.random.default_rng(5), []
    for p in range(8):
        n = int(rng.integers(0, 6))
        picks = [rng.choice(12, int(rng.integers(0, 4)), replace=False) for _ in range(n)]
        cands = [[(f"f{c}", bool(rng.integers(0, 2))) for c in pick] for pick in picks]
        parts.append(part([f"o{p}-{i}" for i in range(n)], cands, ts0=1000.0 * p,
                          notice=(rng.random(n) < 0.3).tolist() if p % 2 else None,
                          gate=rng.integers(0, 3, n).astype(float).tolist() if p % 3 else None))
    check_concat(parts)


def test_take_keeps_candidates_notices_and_gates() -> None:
    wb = part(["o1", "o2", "o3"], [[("A", True), ("B", False)], [], [("B", True)]],
              notice=[False, True, False], gate=[0.0, 5.0, 7.0])
    got = wb.take([2, 0, 1, 2])
    assert got.positions.ids == ["o3", "o1", "o2", "o3"] and got.fences == wb.fences
    assert all_candidates(got) == [[("B", True)], [("A", True), ("B", False)], [], [("B", True)]]
    assert got.notices().tolist() == [False, False, True, False]
    assert got.gates().tolist() == [7.0, 0.0, 5.0, 7.0]
    none = wb.take(np.empty(0, np.int64))
    assert len(none.positions) == 0 and none.ptr.tolist() == [0] and none.cand.size == 0
    assert part(["o1"], [[("A", True)]]).take([0]).notice is None


def wire() -> dict[str, Any]:
    return part(["o1", "o2"], [[("A", True), ("B", False)], [("B", True)]], notice=[False, True],
                gate=[3.0, 4.0]).to_wire()


def test_wire_round_trip_and_old_handover_parts() -> None:
    back = WorkerBatch.from_wire(wire())
    assert all_candidates(back) == [[("A", True), ("B", False)], [("B", True)]]
    assert back.notices().tolist() == [False, True] and back.gates().tolist() == [3.0, 4.0]
    plain = WorkerBatch.from_wire(part(["o1"], [[]], notice=[False], gate=[0.0]).to_wire())
    assert plain.notice is None and plain.gate is None  # nothing to say is not sent
    old = part(["o1", "o2"], [[], []]).to_wire() | {"handover": True}  # first pipeline version
    got = WorkerBatch.from_wire(old)
    assert got.notice is not None and got.notice.tolist() == [True, True] and got.gate is None


def _i8(*v: int) -> bytes:
    return np.array(v, "<i8").tobytes()


SPOILS: dict[str, tuple[str, Any]] = {
    "ptr-short": ("ptr", _i8(0, 2)), "ptr-start": ("ptr", _i8(1, 2, 3)), "ptr-order": ("ptr", _i8(0, 4, 3)),
    "ptr-end": ("ptr", _i8(0, 2, 4)), "cand-range": ("cand", np.array([0, 2, 1], "<i4").tobytes()),
    "cand-negative": ("cand", np.array([0, -1, 1], "<i4").tobytes()), "interior": ("interior", b"\x01\x00"),
    "notice-short": ("notice", b"\x01"), "notice-long": ("notice", b"\x01\x00\x01"),
    "gate-long": ("gate", np.array([1.0, 2.0, 3.0], "<f8").tobytes()),
    "gate-nan": ("gate", np.array([1.0, np.nan], "<f8").tobytes()),
    "gate-inf": ("gate", np.array([np.inf, 2.0], "<f8").tobytes()),
}


@pytest.mark.parametrize(("key", "value"), SPOILS.values(), ids=SPOILS)
def test_from_wire_refuses_columns_that_do_not_fit(key: str, value: Any) -> None:
    d = wire()
    WorkerBatch.from_wire(d)  # the unspoiled one is fine
    with pytest.raises(ValueError, match="do not fit together"):
        WorkerBatch.from_wire(d | {key: value})


# --------------------------------------------------------------------------- notices

A = box(9.500, 47.100, 9.510, 47.110)
B = box(9.520, 47.100, 9.530, 47.110)
C = box(9.540, 47.100, 9.550, 47.110)
IN_A, IN_A2 = (9.505, 47.105), (9.501, 47.109)
IN_B, IN_B2 = (9.525, 47.105), (9.521, 47.101)
IN_C = (9.545, 47.105)
OUTSIDE = (9.515, 47.105)  # between A and B


def core() -> XFence:
    x = XFence("w0")
    for fid, geom in (("A", A), ("B", B), ("C", C)):
        assert x.define(FenceDef(fence_id=fid, version=1, geometry=geom, timeout_s=300.0), 0.0) == []
    return x


def at(oid: str, where: tuple[float, float], ts: float, cands: Sequence[str] = (), *, interior: bool = False,
       notice: bool = False, gate: float = 0.0) -> WorkerBatch:
    """One position as a region's x-geo routes it (a notice: no candidates, flagged)."""
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64))
    return WorkerBatch("w0", pos, np.array([0, len(cands)], np.int64), list(cands),
                       np.arange(len(cands), dtype=np.int32), np.full(len(cands), interior),
                       np.array([True]) if notice else None, np.array([gate]) if gate else None)


def kinds(events: Sequence[Event]) -> list[Ev]:
    return [(e.event, e.fence_id, e.object_id, e.reason, e.ts) for e in events]


def ordered(rows: Sequence[WorkerBatch]) -> list[Ev]:
    """The events of the rows fed one by one in true time order (a notice before the position
    routed with it), gates dropped: what the fences would see with no region in between."""
    x = core()
    out: list[Event] = []
    for wb in sorted(rows, key=lambda r: (float(r.positions.ts[0]), not r.notices()[0])):
        out += x.route(dataclasses.replace(wb, gate=None))
    return kinds(out)


@pytest.fixture
def inside_a() -> XFence:
    x = core()
    assert kinds(x.route(at("o1", IN_A, 100.0, ["A"]))) == [(ENTER, "A", "o1", ENTERED, 100.0)]
    return x


def test_a_notice_opens_gates_and_says_nothing_of_fences(inside_a: XFence) -> None:
    """The region the object went to sends its first position there to every worker
    (exchanges.x_geo): that position decides, as that region has the fences; the notice,
    from the region left, only opens its gate."""
    assert inside_a.route(at("o1", IN_A2, 110.0, notice=True)) == []
    assert inside_a.route(at("o1", OUTSIDE, 120.0, notice=True)) == []
    assert inside_a.occupants("A") == [{"object_id": "o1", "since": 100.0, "last_seen": 100.0,
                                        "confirmed": True}]
    assert kinds(inside_a.route(at("o1", OUTSIDE, 120.0, gate=120.0))) == [(LEAVE, "A", "o1", EXITED, 120.0)]
    assert inside_a.fences_of("o1") == []


def test_the_position_into_b_leaves_a_and_enters_b_whether_the_notice_comes_first_or_not(
        inside_a: XFence) -> None:
    x = inside_a
    assert x.route(at("o1", IN_B, 110.0, notice=True)) == []
    assert x.fences_of("o1") == ["A"]
    assert sorted(kinds(x.route(at("o1", IN_B, 110.0, ["B"], interior=True)))) == [
        (ENTER, "B", "o1", ENTERED, 110.0), (LEAVE, "A", "o1", EXITED, 110.0)]
    assert x.fences_of("o1") == ["B"] and x.stats()["stale_positions"] == 0
    y = core()
    y.route(at("o1", IN_A, 100.0, ["A"]))
    first = kinds(y.route(at("o1", IN_B, 110.0, ["B"], interior=True)))
    assert sorted(first) == [(ENTER, "B", "o1", ENTERED, 110.0), (LEAVE, "A", "o1", EXITED, 110.0)]
    assert y.route(at("o1", IN_B, 110.0, notice=True)) == []  # same ts: only adds, and B holds
    assert y.fences_of("o1") == ["B"] and y.occupants("B")[0]["since"] == 110.0


@pytest.mark.parametrize("gate", [0.0, 110.0])
@pytest.mark.parametrize("notice_first", [True, False])
def test_notice_and_routed_position_in_one_batch(inside_a: XFence, notice_first: bool, gate: float) -> None:
    rows = [at("o1", IN_B, 110.0, notice=True), at("o1", IN_B, 110.0, ["B"], interior=True, gate=gate)]
    got = kinds(inside_a.route(WorkerBatch.concat(rows if notice_first else rows[::-1])))
    assert sorted(got) == [(ENTER, "B", "o1", ENTERED, 110.0), (LEAVE, "A", "o1", EXITED, 110.0)]
    assert inside_a.fences_of("o1") == ["B"] and inside_a.stats()["held_now"] == 0


def test_notices_of_several_objects() -> None:
    x = core()
    assert len(x.route(WorkerBatch.concat([at("o1", IN_A, 100.0, ["A"], interior=True),
                                           at("o2", IN_B, 100.0, ["B"], interior=True),
                                           at("o3", OUTSIDE, 100.0)]))) == 2
    rows = [at("o3", IN_A, 120.0, notice=True), at("o2", OUTSIDE, 120.0, notice=True),
            at("ghost", IN_B, 120.0, notice=True), at("o1", IN_A2, 120.0, notice=True)]
    assert x.route(WorkerBatch.concat(rows)) == []  # notices: no fence entered or left
    assert [x.fences_of(o) for o in ("o1", "o2", "o3", "ghost")] == [["A"], ["B"], [], []]


def test_a_notice_among_the_objects_positions_changes_nothing(inside_a: XFence) -> None:
    """Its positions decide, in time order; the notice between them is not an observation."""
    batch = [at("o1", OUTSIDE, 110.0, notice=True), at("o1", IN_B, 120.0, ["B"], interior=True)]
    assert kinds(inside_a.route(WorkerBatch.concat(batch))) == [
        (LEAVE, "A", "o1", EXITED, 120.0), (ENTER, "B", "o1", ENTERED, 120.0)]
    assert inside_a.occupants("B")[0]["since"] == 120.0


def test_a_stale_notice_changes_nothing_but_opens_gates(inside_a: XFence) -> None:
    x = inside_a
    assert x.route(at("o1", OUTSIDE, 90.0, notice=True)) == []  # older than ts 100
    assert x.fences_of("o1") == ["A"]
    gated = at("o1", OUTSIDE, 105.0, gate=90.0)
    assert kinds(x.route(gated)) == [(LEAVE, "A", "o1", EXITED, 105.0)]
    assert x.stats()["held_positions"] == 0
    y = core()  # without that notice the same position waits
    y.route(at("o1", IN_A, 100.0, ["A"]))
    assert y.route(gated) == [] and y.stats()["held_now"] == 1 and y.fences_of("o1") == ["A"]


# --------------------------------------------------------------------------- gates


def test_gated_positions_wait_for_the_notice_then_apply_in_order(inside_a: XFence) -> None:
    x = inside_a
    rows = [at("o1", IN_A, 100.0, ["A"]), at("o1", IN_B, 110.0, ["B"], gate=110.0),
            at("o1", IN_B2, 115.0, ["B"], gate=110.0), at("o2", IN_A, 115.0, ["A"]),
            at("o1", OUTSIDE, 120.0, gate=110.0), at("o1", IN_B, 110.0, notice=True)]
    assert x.route(rows[1]) == []
    assert x.stats()["held_positions"] == x.stats()["held_now"] == 1 and x.fences_of("o1") == ["A"]
    # the same object's later positions wait too, another object's do not
    assert kinds(x.route(WorkerBatch.concat(rows[2:4]))) == [(ENTER, "A", "o2", ENTERED, 115.0)]
    assert x.route(rows[4]) == [] and x.stats()["held_now"] == 3 and x.fences_of("o1") == ["A"]
    got = kinds(x.route(rows[5]))  # the notice: the held ones follow it in this call
    assert got == [(LEAVE, "A", "o1", EXITED, 110.0), (ENTER, "B", "o1", ENTERED, 110.0),
                   (LEAVE, "B", "o1", EXITED, 120.0)]
    assert sorted([(ENTER, "A", "o1", ENTERED, 100.0), (ENTER, "A", "o2", ENTERED, 115.0), *got]) == \
        sorted(ordered(rows))
    assert (x.stats()["held_now"], x.stats()["held_positions"], x.stats()["holds_expired"]) == (0, 3, 0)


def test_a_gate_not_after_the_last_notice_is_open(inside_a: XFence) -> None:
    x = inside_a
    assert x.route(at("o1", IN_B, 110.0, notice=True)) == []
    assert kinds(x.route(at("o1", IN_B, 110.0, ["B"], gate=110.0))) == [
        (LEAVE, "A", "o1", EXITED, 110.0), (ENTER, "B", "o1", ENTERED, 110.0)]
    assert x.route(at("o1", IN_B2, 115.0, ["B"], gate=105.0)) == []
    assert x.stats()["held_positions"] == 0
    assert x.route(at("o1", OUTSIDE, 116.0, gate=110.5)) == []  # a later entry: closed
    assert x.stats()["held_now"] == 1 and x.fences_of("o1") == ["B"]


def test_expire_applies_positions_held_hold_s(inside_a: XFence) -> None:
    x = inside_a
    assert XFence.HOLD_S >= 60.0  # waits out a backlog of a minute or more
    x.HOLD_S = 10.0  # this test's worker gives up sooner
    for wb, received_at in [(at("o1", IN_B, 110.0, ["B"], gate=110.0), 50.0),
                            (at("o1", IN_C, 120.0, notice=True, gate=110.0), 50.0),
                            (at("o1", IN_C, 120.0, ["C"], gate=120.0), 58.0),
                            (at("o1", OUTSIDE, 130.0, gate=125.0), 55.0)]:
        assert x.route(wb, received_at) == []
    assert x.expire(59.999) == [] and x.stats()["held_now"] == 4 and x.fences_of("o1") == ["A"]
    # the two held since 50 are due; the notice among them opens the gate of the one of 58
    assert kinds(x.expire(60.0)) == [(LEAVE, "A", "o1", EXITED, 110.0), (ENTER, "B", "o1", ENTERED, 110.0),
                                     (LEAVE, "B", "o1", EXITED, 120.0), (ENTER, "C", "o1", ENTERED, 120.0)]
    assert (x.stats()["held_now"], x.stats()["holds_expired"]) == (1, 2)
    assert kinds(x.expire(65.0)) == [(LEAVE, "C", "o1", EXITED, 130.0)]
    assert (x.stats()["held_now"], x.stats()["holds_expired"], x.stats()["held_positions"]) == (0, 3, 4)
    assert x.route(at("o1", IN_B, 110.0, notice=True)) == [] and x.fences_of("o1") == []  # too late


def test_a_chain_of_regions_gives_the_time_ordered_events_in_any_arrival_order() -> None:
    """o1 goes region C -> B -> A: A's positions wait for B's notice, itself gated on o1's
    entry into B, which waits for C's notice. Each region's messages stay in their order."""
    msgs = {"C": [at("o1", IN_C, 100.0, ["C"]), at("o1", IN_B, 110.0, notice=True)],
            "B": [at("o1", IN_B, 110.0, ["B"], gate=110.0), at("o1", IN_B2, 115.0, ["B"], gate=110.0),
                  at("o1", IN_A, 120.0, notice=True, gate=110.0)],
            "A": [at("o1", IN_A, 120.0, ["A"], gate=120.0), at("o2", IN_A, 105.0, ["A"]),
                  at("o1", IN_A2, 130.0, ["A"], gate=120.0)]}
    want = ordered([m for ms in msgs.values() for m in ms])
    assert sorted(want) == sorted([(ENTER, "C", "o1", ENTERED, 100.0), (ENTER, "A", "o2", ENTERED, 105.0),
                                   (LEAVE, "C", "o1", EXITED, 110.0), (ENTER, "B", "o1", ENTERED, 110.0),
                                   (LEAVE, "B", "o1", EXITED, 120.0), (ENTER, "A", "o1", ENTERED, 120.0)])
    wrong = []
    arrivals = sorted(set(itertools.permutations("CCBBBAAA")))
    for arrival in arrivals:
        x, queues, got = core(), {r: list(ms) for r, ms in msgs.items()}, []
        for region in arrival:
            got += kinds(x.route(queues[region].pop(0)))
        since = {o["object_id"]: (o["since"], o["last_seen"]) for o in x.occupants("A")}
        if sorted(got) != sorted(want) or x.stats()["held_now"] or since != {"o1": (120.0, 130.0),
                                                                              "o2": (105.0, 105.0)}:
            wrong.append("".join(arrival))
    assert len(arrivals) == 560 and wrong == []


# --------------------------------------------------------------------------- property

AREA = (9.50, 47.10, 9.52, 47.12)
WORKERS = ("w0", "w1")


@dataclasses.dataclass
class Scenario:
    fences: dict[str, Any]
    worldmap: Worldmap
    ring: HashRing
    walk: list[tuple[str, float, float, float]]  # (object, lon, lat, ts) in time order
    truth: list[Ev]  # shapely's events, position by position

    def geo(self, region: str) -> XGeo:
        """x-geo of `region` with its bindings (as recovered at a start: objects unknown)."""
        g = XGeo(region, list(WORKERS), self.ring, announce_unknown=True)
        for fid, geom in self.fences.items():
            cov = hk.cover(geom, 20).to_bits(INDEX_BITS)
            clipped = self.worldmap.clip(cov.ranges, cov.interior)
            if region in clipped:
                g.add_binding(FenceBinding(fid, 1, *clipped[region]))
        return g

    def worker_core(self, w: str) -> XFence:
        x = XFence(w)
        for fid, geom in self.fences.items():
            if self.ring.node_for(fid) == w:
                x.define(FenceDef(fence_id=fid, version=1, geometry=geom, timeout_s=1e9), 0.0)
        return x


def scenario(rng: np.random.Generator, n_regions: int | None = None) -> Scenario:
    """5 objects x 30 rounds over 2-3 fences, steps of ~150 m: they cross fences and region
    borders (of 2-3 regions unless given)."""
    x0, y0, x1, y1 = AREA
    centres, sizes = rng.uniform((x0, y0), (x1, y1), (3, 2)), rng.uniform(0.002, 0.008, (3, 2))
    fences = {f"F{i}": box(*(centres[i] - sizes[i]), *(centres[i] + sizes[i]))
              for i in range(int(rng.integers(2, 4)))}
    n = int(rng.integers(2, 4)) if n_regions is None else n_regions
    worldmap = Worldmap.over_area(["a", "b", "c"][:n], AREA)
    lon, lat = rng.uniform(x0, x1, 5), rng.uniform(y0, y1, 5)
    walk: list[tuple[str, float, float, float]] = []
    truth: list[Ev] = []
    inside: list[set[str]] = [set() for _ in range(5)]
    for t in range(100, 130):
        lon = np.clip(lon + rng.normal(0.0, 0.002, 5), x0, x1)
        lat = np.clip(lat + rng.normal(0.0, 0.002, 5), y0, y1)
        for o in rng.permutation(5).tolist():
            walk.append((f"o{o}", float(lon[o]), float(lat[o]), float(t)))
            now = {f for f, g in fences.items() if shapely.contains_xy(g, lon[o], lat[o])}
            truth += [(ENTER, f, f"o{o}", ENTERED, t) for f in now - inside[o]]
            truth += [(LEAVE, f, f"o{o}", EXITED, t) for f in inside[o] - now]
            inside[o] = now
    return Scenario(fences, worldmap, HashRing(WORKERS), walk, truth)


def ingress_batches(sc: Scenario, rng: np.random.Generator) -> list[PositionBatch]:
    """The walk in x-ingress batches of 1-8 positions, in time order."""
    out, lo = [], 0
    while lo < len(sc.walk):
        hi = min(len(sc.walk), lo + int(rng.integers(1, 9)))
        ids, lons, lats, tss = zip(*sc.walk[lo:hi], strict=True)
        out.append(PositionBatch(list(ids), np.array(lons), np.array(lats), np.array(tss),
                                 np.zeros(hi - lo, np.uint64)))
        lo = hi
    return out


def interleaved(sc: Scenario, streams: dict[str, dict[str, list[WorkerBatch]]], rng: np.random.Generator
                ) -> tuple[list[Ev], int, int]:
    """Each worker takes its regions' streams, each in order, interleaved at random: the
    events, and how many notices and held positions there were."""
    got: list[Ev] = []
    held = notices = 0
    for w in WORKERS:
        x, queues = sc.worker_core(w), [q for q in streams[w].values() if q]
        notices += sum(int(wb.notices().sum()) for q in queues for wb in q)
        while queues:
            q = queues[int(rng.integers(len(queues)))]
            got += kinds(x.route(q.pop(0)))
            queues = [q for q in queues if q]
        assert x.stats()["held_now"] == 0 and x.stats()["holds_expired"] == 0
        held += x.stats()["held_positions"]
    return got, notices, held


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_region_streams_interleaved_at_random_give_the_time_ordered_events(seed: int) -> None:
    """Objects walk across a 2-3 region worldmap; real x-ingress (notices, entries) and one
    real x-geo per region (candidates, gates) route them; each worker gets every region's
    messages in that region's order, regions interleaved at random. The events are those of
    the same batches fed in time order (gates dropped), which are shapely's."""
    rng = np.random.default_rng(seed)
    sc = scenario(rng)
    geo = {r: sc.geo(r) for r in sc.worldmap.regions}
    ingress = XIngress(sc.worldmap)
    streams: dict[str, dict[str, list[WorkerBatch]]] = {w: {r: [] for r in sc.worldmap.regions}
                                                        for w in WORKERS}
    in_order, want = {w: sc.worker_core(w) for w in WORKERS}, []
    for batch in ingress_batches(sc, rng):
        to_worker: dict[str, list[WorkerBatch]] = {}
        for region, rb in ingress.route(batch).regions.items():
            for w, wb in geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate,
                                           announced=rb.announced).items():
                streams[w][region].append(wb)
                to_worker.setdefault(w, []).append(wb)
        for w, wbs in to_worker.items():
            want += kinds(in_order[w].route(dataclasses.replace(WorkerBatch.concat(wbs), gate=None)))
    assert sorted(want) == sorted(sc.truth) and len(sc.truth) >= 10
    got, notices, held = interleaved(sc, streams, rng)
    assert notices > 0 and held > 0  # objects crossed regions, and positions had to wait
    assert sorted(got) == sorted(want)


@pytest.mark.parametrize("seed", range(24))
def test_restarts_of_x_ingress_and_x_geo_mid_stream_lose_and_add_no_event(seed: int) -> None:
    """As above over two regions, with x-ingress and the x-geos restarted (their memory of
    objects gone: announcements, unseen objects to every worker) at random batches, while
    the workers take the regions' streams at random (one region's backlog behind the
    other's): the events are still shapely's."""
    rng = np.random.default_rng(1000 + seed)
    sc = scenario(rng, 2)
    geo = {r: sc.geo(r) for r in sc.worldmap.regions}
    ingress = XIngress(sc.worldmap)
    streams: dict[str, dict[str, list[WorkerBatch]]] = {w: {r: [] for r in sc.worldmap.regions}
                                                        for w in WORKERS}
    restarts = 0
    for batch in ingress_batches(sc, rng):
        if rng.random() < 0.08:
            ingress.forget_objects()
            restarts += 1
        for region in geo:
            if rng.random() < 0.05:
                geo[region] = sc.geo(region)
                restarts += 1
        for region, rb in ingress.route(batch).regions.items():
            for w, wb in geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate,
                                           announced=rb.announced).items():
                streams[w][region].append(WorkerBatch.from_wire(wb.to_wire()))
    got, _, _ = interleaved(sc, streams, rng)
    assert restarts > 0 and len(sc.truth) >= 4
    assert sorted(got) == sorted(sc.truth)


def test_a_batch_whose_events_have_hundreds_of_distinct_times() -> None:
    """Event ids are made per (kind, instant): with more than 127 instants in one batch the
    index once overflowed int8 and the worker crashed on the batch (dead-lettering it alone).
    Devices with their own clocks give every position its own time."""
    n = 400
    x = core()
    ids = [f"o{k}" for k in range(n)]
    pos = PositionBatch(ids, np.full(n, IN_A[0]), np.full(n, IN_A[1]), 100.0 + np.arange(n) / 1000.0,
                        np.zeros(n, np.uint64))
    wb = WorkerBatch("w0", pos, np.arange(n + 1, dtype=np.int64), ["A"], np.zeros(n, np.int32),
                     np.ones(n, bool))
    enters = x.route(wb)
    want = [(ENTER, ids[k], 100.0 + k / 1000.0) for k in range(n)]
    assert [(e.event, e.object_id, e.ts) for e in enters] == want
    assert len({e.event_id for e in enters}) == n
    leaves = x.expire(100.0 + 300.0 + 1.0)  # every object silent past the fence's 300 s timeout
    assert sorted(e.object_id for e in leaves) == sorted(ids) and {e.event for e in leaves} == {LEAVE}
    assert len({e.event_id for e in leaves} | {e.event_id for e in enters}) == 2 * n
    again = core()
    again.route(wb)
    dropped = again.drop("A", 2, 200.0)
    assert len(dropped) == n and len({e.event_id for e in dropped}) == n
