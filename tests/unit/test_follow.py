"""fence/follow.py: circles around a position, and FollowCore deciding when a following fence moves
(rate limit per fence, minimum shift, pending moves, older positions ignored)."""

from __future__ import annotations

import itertools
import math

import pytest
import shapely
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.fence_def import InvalidFence
from fence.follow import (
    EARTH_M_PER_DEG,
    MIN_INTERVAL_S,
    MIN_MOVE_M,
    SEGMENTS,
    FollowCore,
    Move,
    circle,
    distance_m,
)

LON, LAT = 9.52, 47.14  # somewhere in the Rhine valley
TS = 1_700_000_000.0


def north(m: float, lon: float = LON, lat: float = LAT) -> tuple[float, float]:
    """The point m metres north of (lon, lat) (exact for distance_m: same longitude)."""
    return lon, lat + m / EARTH_M_PER_DEG


def east(m: float, lon: float = LON, lat: float = LAT) -> tuple[float, float]:
    return lon + m / (EARTH_M_PER_DEG * math.cos(math.radians(lat))), lat


def core(*fences: tuple[str, str, float], min_interval_s: float = MIN_INTERVAL_S,
         min_move_m: float = MIN_MOVE_M) -> FollowCore:
    """A core with fences (fence_id, object_id, radius_m) whose place is not known yet."""
    c = FollowCore(min_interval_s, min_move_m)
    c.set_fences((f, o, r, None, None) for f, o, r in fences)
    return c


def at(lon_lat: tuple[float, float], ts: float, fence_id: str = "f1", object_id: str = "car") -> Move:
    return Move(fence_id, object_id, lon_lat[0], lon_lat[1], ts)


def observe(c: FollowCore, lon_lat: tuple[float, float], ts: float, now: float,
            object_id: str = "car") -> list[Move]:
    return c.observe(object_id, lon_lat[0], lon_lat[1], ts, now)


# --------------------------------------------------------------------------- circle / distance


def test_circle_has_the_radius_around_its_centre() -> None:
    c = circle(LON, LAT, 500.0)
    assert c.is_valid and c.geom_type == "Polygon"
    ring = list(c.exterior.coords)
    assert len(ring) == SEGMENTS + 1 and ring[0] == ring[-1]
    for lon, lat in ring[:-1]:
        assert distance_m(LON, LAT, lon, lat) == pytest.approx(500.0, rel=2e-3)
    centroid = c.centroid
    assert distance_m(LON, LAT, centroid.x, centroid.y) < 0.01
    area_m2 = c.area * EARTH_M_PER_DEG**2 * math.cos(math.radians(LAT))
    assert area_m2 == pytest.approx(math.pi * 500.0**2, rel=0.01)
    assert area_m2 < math.pi * 500.0**2  # an inscribed polygon
    assert c.contains(shapely.Point(LON, LAT))
    assert c.contains(shapely.Point(*north(490.0))) and not c.contains(shapely.Point(*north(510.0)))
    assert c.contains(shapely.Point(*east(490.0))) and not c.contains(shapely.Point(*east(510.0)))


def test_circle_segments() -> None:
    assert len(circle(LON, LAT, 100.0, segments=8).exterior.coords) == 9
    assert len(circle(LON, LAT, 100.0, segments=64).exterior.coords) == 65


def test_circle_at_the_antimeridian_is_clamped_to_180() -> None:
    c = circle(180.0, 10.0, 1000.0)
    assert c.is_valid
    x0, _, x1, _ = c.bounds
    assert x1 == 180.0 and x0 < 180.0
    c = circle(-180.0, -10.0, 1000.0)
    assert c.is_valid and c.bounds[0] == -180.0


def test_circle_far_north_is_wider_in_degrees_of_longitude() -> None:
    x0, y0, x1, y1 = circle(0.0, 80.0, 1000.0).bounds
    assert (x1 - x0) / (y1 - y0) == pytest.approx(1 / math.cos(math.radians(80.0)), rel=0.01)


@pytest.mark.parametrize(("lon", "lat"), [
    (180.5, 0.0), (-180.5, 0.0), (0.0, 85.1), (0.0, -85.1), (math.nan, 0.0), (0.0, math.nan),
    (math.inf, 0.0), (0.0, -math.inf),
])
def test_circle_refuses_a_bad_centre(lon: float, lat: float) -> None:
    with pytest.raises(InvalidFence, match=r"centre .*lon in \[-180, 180\], lat in \[-85, 85\]"):
        circle(lon, lat, 100.0)


@pytest.mark.parametrize("radius", [0.0, -1.0, math.nan, math.inf])
def test_circle_refuses_a_bad_radius(radius: float) -> None:
    with pytest.raises(InvalidFence, match="positive metres"):
        circle(LON, LAT, radius)


def test_circle_accepts_the_edges_of_the_range() -> None:
    for lon, lat in ((-180.0, -85.0), (180.0, 85.0), (0.0, 0.0)):
        assert circle(lon, lat, 10.0).is_valid


def test_distance_m() -> None:
    assert distance_m(LON, LAT, LON, LAT) == 0.0
    assert distance_m(0.0, 0.0, 0.0, 1.0) == pytest.approx(EARTH_M_PER_DEG)
    assert distance_m(0.0, 0.0, 1.0, 0.0) == pytest.approx(EARTH_M_PER_DEG)
    assert distance_m(0.0, 60.0, 1.0, 60.0) == pytest.approx(EARTH_M_PER_DEG / 2)
    assert distance_m(*north(123.0), LON, LAT) == pytest.approx(123.0)
    assert distance_m(*east(77.0), LON, LAT) == pytest.approx(77.0, rel=1e-6)
    a, b = east(30.0, *north(40.0)), (LON, LAT)
    assert distance_m(*a, *b) == pytest.approx(50.0, rel=1e-3)
    assert distance_m(*a, *b) == distance_m(*b, *a)


# --------------------------------------------------------------------------- fences and objects


def test_set_fences_lists_fences_per_object() -> None:
    c = core(("f2", "car", 100.0), ("f1", "car", 50.0), ("g", "bike", 10.0))
    assert c.objects == {"car", "bike"}
    assert c.fences_of("car") == ["f1", "f2"]
    assert c.fences_of("bike") == ["g"]
    assert c.fences_of("boat") == []
    c.set_fences([("g", "bike", 10.0, None, None)])
    assert c.objects == {"bike"} and c.fences_of("car") == []
    assert observe(c, (LON, LAT), TS, 0.0) == []  # car is followed no more


def test_first_position_moves_at_once_with_its_time() -> None:
    c = core(("f1", "car", 100.0))
    assert observe(c, (LON, LAT), TS, 0.0) == [at((LON, LAT), TS)]


def test_unknown_object_moves_nothing() -> None:
    c = core(("f1", "car", 100.0))
    assert c.observe("bike", LON, LAT, TS, 0.0) == []
    assert c.due(100.0) == []


def test_min_move_is_a_twentieth_of_the_radius() -> None:
    c = core(("f1", "car", 100.0))  # min move 5 m
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(4.9), TS + 1, 10.0) == []
    assert observe(c, east(4.9), TS + 2, 20.0) == []
    assert c.due(1000.0) == []  # a shift under the min move is not pending either
    assert observe(c, north(5.1), TS + 3, 30.0) == [at(north(5.1), TS + 3)]


def test_min_move_is_at_least_one_metre() -> None:
    c = core(("f1", "car", 10.0))  # radius / 20 = 0.5 m
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(0.9), TS + 1, 10.0) == []
    assert observe(c, north(1.1), TS + 2, 20.0) == [at(north(1.1), TS + 2)]


def test_min_move_m_of_the_core() -> None:
    c = core(("f1", "car", 100.0), min_move_m=10.0)  # more than radius / 20
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(9.5), TS + 1, 10.0) == []
    assert observe(c, north(10.5), TS + 2, 20.0) == [at(north(10.5), TS + 2)]


def test_a_shift_of_exactly_the_min_move_moves() -> None:
    far = (LON, LAT + 0.001)
    d = distance_m(LON, LAT, *far)  # the min move, exactly as the core will measure it
    c = core(("f1", "car", 10.0), min_move_m=d)
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, (LON, LAT + 0.000999), TS + 1, 10.0) == []
    assert observe(c, far, TS + 2, 20.0) == [at(far, TS + 2)]


def test_min_move_is_measured_from_where_the_fence_stands() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    # creeping 3 m at a time: no single step is a min move, but the sum is
    assert observe(c, north(3.0), TS + 1, 10.0) == []
    assert observe(c, north(6.0), TS + 2, 20.0) == [at(north(6.0), TS + 2)]
    assert observe(c, north(9.0), TS + 3, 30.0) == []
    assert observe(c, north(11.5), TS + 4, 40.0) == [at(north(11.5), TS + 4)]


def test_moves_are_throttled_and_the_latest_waits() -> None:
    c = core(("f1", "car", 100.0))
    assert observe(c, (LON, LAT), TS, 100.0) == [at((LON, LAT), TS)]
    assert observe(c, north(50.0), TS + 1, 100.3) == []
    assert observe(c, north(80.0), TS + 2, 100.6) == []  # replaces the pending move
    assert c.due(100.9) == []
    assert c.due(100.0 + MIN_INTERVAL_S) == [at(north(80.0), TS + 2)]  # exactly the interval
    assert c.due(200.0) == []  # released once
    # the interval counts from that release
    assert observe(c, north(200.0), TS + 3, 101.5) == []
    assert c.due(101.99) == []
    assert c.due(102.0) == [at(north(200.0), TS + 3)]


def test_a_position_after_the_interval_moves_at_once() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS + 1, 0.5) == []
    assert observe(c, north(90.0), TS + 2, 1.0) == [at(north(90.0), TS + 2)]  # the newer one wins
    assert c.due(50.0) == []  # and nothing older is left pending


def test_min_interval_s_of_the_core() -> None:
    c = core(("f1", "car", 100.0), min_interval_s=5.0)
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS + 1, 4.9) == []
    assert c.due(4.99) == []
    assert c.due(5.0) == [at(north(50.0), TS + 1)]
    c = core(("f1", "car", 100.0), min_interval_s=0.0)
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS + 1, 0.0) == [at(north(50.0), TS + 1)]


def test_defaults() -> None:
    c = FollowCore()
    assert (c.min_interval_s, c.min_move_m) == (MIN_INTERVAL_S, MIN_MOVE_M) == (1.0, 1.0)


def test_back_where_it_stands_cancels_the_pending_move() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS + 1, 0.2) == []
    assert observe(c, north(2.0), TS + 2, 0.4) == []  # within the min move of where it stands
    assert c.due(10.0) == []


def test_older_or_equal_positions_are_ignored() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS, 10.0) == []  # same time as the one it stands on
    assert observe(c, north(50.0), TS - 5, 20.0) == []
    assert c.due(30.0) == []
    # older than the pending one, or as old: ignored, the pending one stays
    assert observe(c, north(80.0), TS + 10, 40.0) == [at(north(80.0), TS + 10)]
    assert observe(c, north(200.0), TS + 20, 40.5) == []
    assert observe(c, north(300.0), TS + 15, 40.6) == []
    assert observe(c, north(300.0), TS + 20, 40.7) == []
    assert observe(c, north(80.0), TS + 19, 40.8) == []  # would cancel it, were it not older
    assert c.due(41.0) == [at(north(200.0), TS + 20)]


def test_a_known_centre_from_the_store() -> None:
    c = FollowCore()
    c.set_fences([("f1", "car", 100.0, (LON, LAT), TS)])
    assert observe(c, north(50.0), TS - 1, 0.0) == []  # older than the stored position
    assert observe(c, north(4.0), TS + 1, 0.0) == []  # within the min move of the stored centre
    assert observe(c, north(50.0), TS + 2, 0.0) == [at(north(50.0), TS + 2)]  # never moved here: at once


def test_a_centre_without_ts_accepts_any_time() -> None:
    c = FollowCore()
    c.set_fences([("f1", "car", 100.0, (LON, LAT), None)])
    assert observe(c, north(4.0), -1e9, 0.0) == []  # the centre counts for the min move
    assert observe(c, north(50.0), -1e9, 0.0) == [at(north(50.0), -1e9)]


def test_set_fences_keeps_the_state_of_fences_that_stay() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50.0), TS + 1, 0.5) == []
    c.set_fences([("f1", "car", 100.0, None, None), ("f2", "car", 100.0, None, None)])
    assert c.due(1.0) == [at(north(50.0), TS + 1)]  # the pending move survived
    # the time of its last move survives the store's older view of it
    c.set_fences([("f1", "car", 100.0, (LON, LAT), TS), ("f2", "car", 100.0, None, None)])
    assert observe(c, north(100.0), TS + 2, 1.5) == [at(north(100.0), TS + 2, "f2")]
    assert c.due(1.99) == []
    assert c.due(2.0) == [at(north(100.0), TS + 2)]
    # and so do where it stands and the time of that position
    c.set_fences([("f1", "car", 100.0, (LON, LAT), TS + 1)])
    assert observe(c, north(103.0), TS + 3, 5.0) == []
    assert observe(c, north(60.0), TS + 2, 10.0) == []
    assert c.fences_of("car") == ["f1"]


def test_set_fences_takes_a_newer_position_from_the_store() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    c.set_fences([("f1", "car", 100.0, north(500.0), TS + 10)])  # another replica moved it
    assert observe(c, north(700.0), TS + 5, 10.0) == []  # older than where it stands now
    assert observe(c, north(503.0), TS + 11, 20.0) == []  # within the min move of its new place
    assert observe(c, (LON, LAT), TS + 12, 30.0) == [at((LON, LAT), TS + 12)]


def test_a_radius_change_starts_afresh() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS + 10, 0.0)
    assert observe(c, north(50.0), TS + 11, 0.5) == []  # pending
    c.set_fences([("f1", "car", 200.0, None, None)])
    assert c.due(0.55) == []  # the pending move is gone
    # position, time and interval are forgotten: an older position moves it, at once
    assert observe(c, north(6.0), TS, 0.6) == [at(north(6.0), TS)]
    # and the new radius sets the min move (10 m)
    assert observe(c, north(15.0), TS + 1, 10.0) == []
    assert observe(c, north(16.5), TS + 2, 20.0) == [at(north(16.5), TS + 2)]


def test_a_radius_change_takes_the_stored_centre() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    c.set_fences([("f1", "car", 40.0, north(300.0), TS - 100)])
    assert observe(c, north(301.0), TS - 50, 10.0) == []  # near the stored centre; older is fine
    assert observe(c, north(310.0), TS - 49, 20.0) == [at(north(310.0), TS - 49)]


def test_forget() -> None:
    c = core(("f1", "car", 100.0), ("f2", "car", 100.0), ("g", "bike", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    observe(c, north(50.0), TS + 1, 0.5)
    c.forget("f1")
    assert c.fences_of("car") == ["f2"]
    assert c.due(10.0) == [at(north(50.0), TS + 1, "f2")]  # f1's pending move went with it
    c.forget("f2")
    assert c.objects == {"bike"}
    assert observe(c, north(500.0), TS + 2, 20.0) == []
    c.forget("nope")
    c.forget("f1")  # twice: nothing to do
    assert c.objects == {"bike"} and c.fences_of("bike") == ["g"]


def test_forgotten_fence_comes_back_fresh() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS + 10, 0.0)
    c.forget("f1")
    c.set_fences([("f1", "car", 100.0, None, None)])
    assert observe(c, (LON, LAT), TS, 0.1) == [at((LON, LAT), TS)]


def test_several_fences_follow_one_object() -> None:
    c = core(("small", "car", 20.0), ("large", "car", 1000.0), ("other", "bike", 20.0))
    first = observe(c, (LON, LAT), TS, 0.0)
    assert sorted(first, key=lambda m: m.fence_id) == [at((LON, LAT), TS, "large"),
                                                       at((LON, LAT), TS, "small")]
    # 20 m: beyond small's min move (1 m), within large's (50 m)
    assert observe(c, north(20.0), TS + 1, 5.0) == [at(north(20.0), TS + 1, "small")]
    # each fence has its own interval: large never moved since 0.0, small moved at 5.0
    assert observe(c, north(80.0), TS + 2, 5.5) == [at(north(80.0), TS + 2, "large")]
    assert c.due(5.9) == []
    assert c.due(6.0) == [at(north(80.0), TS + 2, "small")]
    assert c.due(100.0) == []


def test_due_releases_every_waiting_fence() -> None:
    c = core(("f1", "car", 100.0), ("f2", "car", 100.0), ("g", "bike", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    c.observe("bike", LON, LAT, TS, 0.5)
    observe(c, north(50.0), TS + 1, 0.5)
    c.observe("bike", *north(70.0), TS + 1, 0.9)
    assert sorted(c.due(1.0), key=lambda m: m.fence_id) == [
        at(north(50.0), TS + 1, "f1"), at(north(50.0), TS + 1, "f2")]  # bike's g waits until 1.5
    assert c.due(1.5) == [at(north(70.0), TS + 1, "g", "bike")]


def test_a_fence_ends_on_the_last_position() -> None:
    c = core(("f1", "car", 100.0))
    moves: list[Move] = []
    track = [north(10.0 * i) for i in range(50)]  # 10 m every 0.1 s: faster than the interval
    for i, p in enumerate(track):
        moves += observe(c, p, TS + i, 0.1 * i)
    assert len(moves) <= 6  # about one per second, not 50
    moves += c.due(100.0)
    assert moves[-1] == at(track[-1], TS + 49)
    assert c.due(200.0) == []


# --------------------------------------------------------------------------- property

_offset = st.one_of(st.floats(-3.0, 3.0), st.floats(-300.0, 300.0))
_step = st.tuples(
    st.floats(0.001, 5.0),  # ts increment
    _offset, _offset,  # metres east, north of LON, LAT
    st.floats(0.0, 2.0),  # increment of the monotonic clock
    st.booleans(),  # call due() before observing
)


@settings(max_examples=300, deadline=None)
@given(radii=st.lists(st.sampled_from([5.0, 40.0, 100.0, 1000.0]), min_size=1, max_size=3),
       steps=st.lists(_step, min_size=1, max_size=40),
       min_interval=st.sampled_from([0.0, 0.5, 1.0, 2.5]),
       placed=st.booleans())
def test_moves_are_ordered_throttled_and_end_on_the_last_position(
        radii: list[float], steps: list[tuple[float, float, float, float, bool]], min_interval: float,
        placed: bool) -> None:
    c = FollowCore(min_interval_s=min_interval)
    ids = [f"f{i}" for i in range(len(radii))]
    c.set_fences((f, "car", r, (LON, LAT) if placed else None, TS - 1 if placed else None)
                 for f, r in zip(ids, radii, strict=True))
    c.set_fences((f, "car", r, None, None) for f, r in zip(ids, radii, strict=True))  # state kept
    moves: dict[str, list[tuple[float, Move]]] = {f: [] for f in ids}
    observed: dict[float, tuple[float, float]] = {}
    ts, now = TS, 1000.0
    last = (LON, LAT)

    def record(ms: list[Move], when: float) -> None:
        for m in ms:
            assert m.object_id == "car"
            moves[m.fence_id].append((when, m))

    for dts, dx, dy, dnow, call_due in steps:
        ts, now = ts + dts, now + dnow
        if call_due:
            record(c.due(now), now)
        last = east(dx, *north(dy))
        observed[ts] = last
        record(c.observe("car", *last, ts, now), now)
    end = now + 1e6
    record(c.due(end), end)
    assert c.due(end + 1e6) == []  # nothing left waiting

    for f, r in zip(ids, radii, strict=True):
        made = moves[f]
        for _, m in made:
            assert observed[m.ts] == (m.lon, m.lat)  # a move is an observed position
        for (_, m0), (_, m1) in itertools.pairwise(made):
            assert m1.ts > m0.ts
        # a fixed schedule: k moves take at least (k - 1) intervals, less half an interval
        for i, (when_i, _) in enumerate(made):
            for j in range(i + 1, len(made)):
                assert made[j][0] - when_i >= (j - i) * min_interval - min_interval / 2 - 1e-9
        stands = (made[-1][1].lon, made[-1][1].lat) if made else ((LON, LAT) if placed else None)
        assert stands is not None
        assert stands == last or distance_m(*stands, *last) < max(MIN_MOVE_M, r / 20)


# --------------------------------------------------------------------------- bugs found by these tests


def test_a_newer_stored_position_drops_an_older_pending_move() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(300.0), TS + 2, 0.5) == []  # pending
    c.set_fences([("f1", "car", 100.0, north(500.0), TS + 3)])
    assert c.due(1.0) == []  # TS + 2 is older than where the fence stands


def test_following_another_object_starts_afresh() -> None:
    c = core(("f1", "car", 100.0))
    observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(300.0), TS + 2, 0.5) == []  # car's move, pending
    c.set_fences([("f1", "bike", 100.0, None, None)])  # the store keeps no follow_ts on a re-target
    assert c.due(1.0) == []


def test_positions_once_an_interval_with_jitter_all_move() -> None:
    """The schedule does not drift: a position every interval, each handled a little late or
    early, moves the fence every time (stamping the decision time skipped ~1 in 10)."""
    c = FollowCore()
    c.set_fences([("f1", "car", 100.0, None, None)])
    jitter = [0.0, 0.3, 0.05, 0.25, 0.1, 0.29, 0.0, 0.2, 0.15, 0.3] * 3
    moved = 0
    for k, j in enumerate(jitter):
        moved += len(c.observe("car", *north(50.0 * k), TS + k, 100.0 + k + j))
    assert moved == len(jitter)


def test_a_move_the_store_could_not_take_goes_again_when_due() -> None:
    c = core(("f1", "car", 100.0))
    (move,) = observe(c, (LON, LAT), TS, 0.0)
    c.failed(move)  # PostgreSQL away
    assert c.due(1000.0) == [move]
    assert c.due(2000.0) == []


def test_a_failed_move_gives_way_to_a_newer_position_waiting() -> None:
    c = core(("f1", "car", 100.0))
    (first,) = observe(c, (LON, LAT), TS, 0.0)
    assert observe(c, north(50), TS + 1, 0.1) == []  # waits for its interval
    c.failed(first)
    assert c.due(1000.0) == [at(north(50), TS + 1)]
