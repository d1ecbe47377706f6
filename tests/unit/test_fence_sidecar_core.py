"""fence/sidecar.py without a broker: `concat` of routed parts, and `FenceSidecar.handover`
(what a region an object left tells its x-fence worker) applied to the real x-fence core."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from shapely.geometry import box

from exchanges.batch import PositionBatch
from exchanges.x_geo import WorkerBatch
from fence.sidecar import FenceSidecar, concat
from fence.state import ENTER, ENTERED, EXITED, LEAVE, Event, FenceDef, XFence

Cand = list[tuple[str, bool]]


def positions(ids: Sequence[str], lon: Sequence[float] | None = None, lat: Sequence[float] | None = None,
              ts: Sequence[float] | None = None, extra: list[dict[str, object] | None] | None = None
              ) -> PositionBatch:
    n = len(ids)
    return PositionBatch(
        list(ids),
        np.asarray(lon if lon is not None else np.linspace(9.5, 9.6, n), np.float64),
        np.asarray(lat if lat is not None else np.linspace(47.1, 47.2, n), np.float64),
        np.asarray(ts if ts is not None else 1000.0 + np.arange(n), np.float64),
        np.arange(n, dtype=np.uint64) * np.uint64(7),
        extra or [],
    )


def part(ids: Sequence[str], cands: Sequence[Cand], worker: str = "w0", ts0: float = 1000.0,
         fences: Sequence[str] | None = None, extra: list[dict[str, object] | None] | None = None
         ) -> WorkerBatch:
    """A WorkerBatch whose position i has candidates cands[i] (fence, interior)."""
    order = list(fences) if fences is not None else list(dict.fromkeys(f for c in cands for f, _ in c))
    ptr = np.zeros(len(ids) + 1, np.int64)
    ptr[1:] = np.cumsum([len(c) for c in cands])
    cand = np.array([order.index(f) for c in cands for f, _ in c], np.int32)
    interior = np.array([i for c in cands for _, i in c], bool)
    pos = positions(ids, ts=[ts0 + k for k in range(len(ids))], extra=extra)
    return WorkerBatch(worker, pos, ptr, order, cand, interior)


def all_candidates(wb: WorkerBatch) -> list[Cand]:
    return [wb.candidates(i) for i in range(len(wb.positions))]


def check_concat(parts: Sequence[WorkerBatch]) -> WorkerBatch:
    out = concat(parts)
    assert out.worker == parts[0].worker
    assert out.positions.ids == [i for p in parts for i in p.positions.ids]
    np.testing.assert_array_equal(out.positions.lon, np.concatenate([p.positions.lon for p in parts]))
    np.testing.assert_array_equal(out.positions.ts, np.concatenate([p.positions.ts for p in parts]))
    np.testing.assert_array_equal(out.positions.h, np.concatenate([p.positions.h for p in parts]))
    assert all_candidates(out) == [c for p in parts for c in all_candidates(p)]
    assert len(out.ptr) == len(out.positions) + 1 and out.ptr[0] == 0
    assert (np.diff(out.ptr) >= 0).all()
    assert int(out.ptr[-1]) == out.cand.size == out.interior.size
    assert out.ptr.dtype == np.int64 and out.cand.dtype == np.int32 and out.interior.dtype == np.bool_
    assert len(set(out.fences)) == len(out.fences)
    assert set(out.fences) == {f for p in parts for f in p.fences}
    # the same as the x-geo library's concatenation
    ref = WorkerBatch.concat(parts)
    assert all_candidates(ref) == all_candidates(out)
    # and it survives the wire
    assert all_candidates(WorkerBatch.from_wire(out.to_wire())) == all_candidates(out)
    return out


# --------------------------------------------------------------------------- concat


def test_concat_overlapping_fence_lists() -> None:
    a = part(["o1", "o2", "o3"], [[("A", True), ("B", False)], [], [("B", True)]])
    b = part(["o4", "o1"], [[("C", False), ("A", False)], [("B", True), ("C", True)]], ts0=2000.0)
    c = part(["o5"], [[("A", True)]], ts0=3000.0, fences=["C", "A"])
    out = check_concat([a, b, c])
    assert out.fences == ["A", "B", "C"]
    assert out.candidates(3) == [("C", False), ("A", False)]
    assert out.candidates(5) == [("A", True)]


def test_concat_disjoint_fence_lists() -> None:
    a = part(["o1", "o2"], [[("A", False)], [("A", True), ("B", True)]])
    b = part(["o3"], [[("X", False), ("Y", True)]], ts0=2000.0)
    out = check_concat([a, b])
    assert out.fences == ["A", "B", "X", "Y"]
    np.testing.assert_array_equal(out.cand, [0, 0, 1, 2, 3])


def test_concat_with_parts_that_have_no_candidates() -> None:
    empty_a = part(["o1", "o2"], [[], []])  # a handover notice: positions, no fences
    b = part(["o3"], [[("A", True)]], ts0=2000.0)
    empty_c = part(["o4"], [[]], ts0=3000.0)
    out = check_concat([empty_a, b, empty_c])
    np.testing.assert_array_equal(out.ptr, [0, 0, 0, 1, 1])
    assert out.fences == ["A"]


def test_concat_of_only_empty_parts() -> None:
    out = check_concat([part(["o1"], [[]]), part(["o2", "o3"], [[], []], ts0=2000.0)])
    assert out.fences == [] and out.cand.size == 0 and out.interior.size == 0
    np.testing.assert_array_equal(out.ptr, [0, 0, 0, 0])


def test_concat_with_a_part_of_no_positions() -> None:
    nothing = WorkerBatch("w0", PositionBatch.empty(), np.zeros(1, np.int64), [], np.empty(0, np.int32),
                          np.empty(0, bool))
    a = part(["o1"], [[("A", False)]])
    out = check_concat([nothing, a, nothing])
    assert out.positions.ids == ["o1"] and out.candidates(0) == [("A", False)]


def test_concat_keeps_listed_fences_no_candidate_mentions() -> None:
    a = part(["o1"], [[("A", True)]], fences=["Z", "A"])
    b = part(["o2"], [[("B", False)]], ts0=2000.0)
    out = check_concat([a, b])
    assert out.fences == ["Z", "A", "B"]


def test_concat_single_part_is_that_part() -> None:
    a = part(["o1"], [[("A", True)]])
    assert concat([a]) is a


def test_concat_keeps_pass_through_fields() -> None:
    a = part(["o1"], [[("A", True)]], extra=[{"speed": 1}])
    b = part(["o2", "o3"], [[], [("A", False)]], ts0=2000.0)
    out = check_concat([a, b])
    assert out.positions.extra == [{"speed": 1}, None, None]


def test_concat_many_parts_against_a_loop() -> None:
    rng = np.random.default_rng(5)
    names = [f"f{i}" for i in range(12)]
    parts = []
    for p in range(8):
        n = int(rng.integers(0, 6))
        cands: list[Cand] = []
        for _ in range(n):
            k = int(rng.integers(0, 4))
            chosen = rng.choice(len(names), size=k, replace=False)
            cands.append([(names[int(c)], bool(rng.integers(0, 2))) for c in chosen])
        parts.append(part([f"o{p}-{i}" for i in range(n)], cands, ts0=1000.0 * p))
    check_concat(parts)


# --------------------------------------------------------------------------- handover

A = box(9.500, 47.100, 9.510, 47.110)
B = box(9.520, 47.100, 9.530, 47.110)
IN_A = (9.505, 47.105)
IN_A_ELSEWHERE = (9.501, 47.109)
IN_B = (9.525, 47.105)
OUTSIDE = (9.515, 47.105)  # between A and B


def sidecar() -> FenceSidecar:
    s = FenceSidecar.__new__(FenceSidecar)
    s.core = XFence("w0")
    assert s.core.define(FenceDef("A", 1, A, 300.0), 0.0) == []
    assert s.core.define(FenceDef("B", 1, B, 300.0), 0.0) == []
    return s


def at(oid: str, where: tuple[float, float], ts: float, cands: Cand) -> WorkerBatch:
    """One position routed with the given candidates (as a region's x-geo would)."""
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64))
    return WorkerBatch("w0", pos, np.array([0, len(cands)], np.int64), [f for f, _ in cands],
                       np.arange(len(cands), dtype=np.int32), np.array([i for _, i in cands], bool))


def notice(oid: str, where: tuple[float, float], ts: float) -> WorkerBatch:
    """A handover notice: the new position, no candidates (from the region the object left)."""
    return at(oid, where, ts, [])


def kinds(events: list[Event]) -> list[tuple[str, str, str, str, float]]:
    return [(e.event, e.fence_id, e.object_id, e.reason, e.ts) for e in events]


@pytest.fixture
def inside_a() -> FenceSidecar:
    s = sidecar()
    events = s.core.route(at("o1", IN_A, 100.0, [("A", False)]))
    assert kinds(events) == [(ENTER, "A", "o1", ENTERED, 100.0)]
    assert s.core.fences_of("o1") == ["A"]
    return s


def test_handover_builds_exact_candidates_from_the_fences_the_object_is_in(inside_a: FenceSidecar) -> None:
    wb = inside_a.handover(notice("o1", OUTSIDE, 110.0))
    assert wb.worker == "w0"
    assert wb.positions.ids == ["o1"]
    assert wb.candidates(0) == [("A", False)]  # never the interior shortcut
    assert not wb.interior.any()


def test_handover_still_inside_gives_no_event(inside_a: FenceSidecar) -> None:
    s = inside_a
    assert s.core.route(s.handover(notice("o1", IN_A_ELSEWHERE, 110.0))) == []
    assert s.core.fences_of("o1") == ["A"]
    assert s.core.occupants("A")[0]["since"] == 100.0  # the stay goes on


def test_handover_outside_gives_one_leave(inside_a: FenceSidecar) -> None:
    s = inside_a
    events = s.core.route(s.handover(notice("o1", OUTSIDE, 110.0)))
    assert kinds(events) == [(LEAVE, "A", "o1", EXITED, 110.0)]
    assert s.core.fences_of("o1") == []


def test_handover_into_b_leaves_a_but_does_not_enter_b(inside_a: FenceSidecar) -> None:
    s = inside_a
    events = s.core.route(s.handover(notice("o1", IN_B, 110.0)))
    assert kinds(events) == [(LEAVE, "A", "o1", EXITED, 110.0)]
    assert s.core.fences_of("o1") == []
    # the ENTER comes from the region that owns the position, with its candidates there
    events = s.core.route(at("o1", IN_B, 110.0, [("B", True)]))
    assert kinds(events) == [(ENTER, "B", "o1", ENTERED, 110.0)]
    assert s.core.fences_of("o1") == ["B"]


def test_handover_and_new_region_in_the_other_order_give_the_same_events(inside_a: FenceSidecar) -> None:
    s = inside_a
    first = s.core.route(at("o1", IN_B, 110.0, [("B", True)]))  # a newer observation without A
    assert s.core.fences_of("o1") == ["B"]
    wb = s.handover(notice("o1", IN_B, 110.0))
    assert wb.candidates(0) == [("B", False)]
    second = s.core.route(wb)
    assert second == []  # same ts: the notice can only add fences, and B holds
    assert sorted(kinds(first + second)) == sorted([(ENTER, "B", "o1", ENTERED, 110.0),
                                                    (LEAVE, "A", "o1", EXITED, 110.0)])
    assert s.core.fences_of("o1") == ["B"]


def test_handover_of_an_unknown_object_has_no_candidates_and_no_events() -> None:
    s = sidecar()
    wb = s.handover(notice("ghost", IN_A, 50.0))
    assert wb.fences == [] and wb.cand.size == 0
    np.testing.assert_array_equal(wb.ptr, [0, 0])
    assert s.core.route(wb) == []


def test_handover_of_several_objects() -> None:
    s = sidecar()
    both = WorkerBatch.concat([at("o1", IN_A, 100.0, [("A", True)]), at("o2", IN_B, 100.0, [("B", True)]),
                               at("o3", OUTSIDE, 100.0, [])])
    assert len(s.core.route(both)) == 2
    pos = PositionBatch(["o3", "o2", "o1"], np.array([IN_A[0], OUTSIDE[0], IN_A[0]]),
                        np.array([IN_A[1], OUTSIDE[1], IN_A[1]]), np.full(3, 120.0), np.zeros(3, np.uint64))
    wb = s.handover(WorkerBatch("w0", pos, np.zeros(4, np.int64), [], np.empty(0, np.int32),
                                np.empty(0, bool)))
    assert [wb.candidates(i) for i in range(3)] == [[], [("B", False)], [("A", False)]]
    # o3 is not entered into A by a handover; o2 leaves B; o1 stays in A
    assert kinds(s.core.route(wb)) == [(LEAVE, "B", "o2", EXITED, 120.0)]
    assert s.core.fences_of("o1") == ["A"] and s.core.fences_of("o3") == []


def test_handover_ignores_candidates_in_the_notice(inside_a: FenceSidecar) -> None:
    s = inside_a
    wb = s.handover(at("o1", IN_B, 110.0, [("B", True)]))
    assert wb.candidates(0) == [("A", False)]
    assert kinds(s.core.route(wb)) == [(LEAVE, "A", "o1", EXITED, 110.0)]


def test_a_stale_handover_changes_nothing(inside_a: FenceSidecar) -> None:
    s = inside_a
    assert s.core.route(s.handover(notice("o1", OUTSIDE, 90.0))) == []  # older than ts 100
    assert s.core.fences_of("o1") == ["A"]
