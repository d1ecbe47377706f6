"""The occupancy reference (spark_jobs/occupancy_reference.py) on tiny cases computed by hand.

Times are written as (day, "HH:MM:SS") on the days below; archived_at is the effective time
plus one second unless a case is about clock skew.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from spark_jobs.occupancy_reference import Event, Hourly, compute, epoch, percentile

MON, TUE, WED = dt.date(2024, 3, 4), dt.date(2024, 3, 5), dt.date(2024, 3, 6)
_ids = itertools.count()


def at(day: dt.date, hms: str) -> float:
    h, m, s = (int(x) for x in hms.split(":"))
    return epoch(day) + h * 3600 + m * 60 + s


def ev(kind: str, when: float, obj: str = "o1", fence: str = "f1", archived: float | None = None) -> Event:
    return Event(f"e{next(_ids):04d}", fence, obj, kind, when, when + 1.0 if archived is None else archived)


def row(**kw: object) -> Hourly:
    base: dict[str, object] = dict(entries=0, exits=0, mean_occupancy=0.0, peak_occupancy=0, stays=0,
                                   dwell_p50_s=None, dwell_p90_s=None)
    base.update(kw)
    return Hourly(**base)  # type: ignore[arg-type]


def hours(result: object, fence: str = "f1", day: dt.date = MON) -> dict[int, Hourly]:
    got = {h: r for (f, d, h), r in result.hourly.items() if f == fence and d == day}  # type: ignore[attr-defined]
    assert not got or sorted(got) == list(range(24)), "a (fence, day) has all 24 hours or none"
    return got


def test_one_stay_inside_an_hour() -> None:
    r = compute([ev("enter", at(MON, "10:10:00")), ev("leave", at(MON, "10:40:00"))], MON, MON)
    h = hours(r)
    assert h[10] == row(entries=1, exits=1, mean_occupancy=0.5, peak_occupancy=1, stays=1,
                        dwell_p50_s=1800.0, dwell_p90_s=1800.0)
    assert all(h[x] == row() for x in range(24) if x != 10)  # the whole day, zeros included
    assert r.open == set()
    assert r.days[MON].events == 2 and r.days[MON].fences == 1 and r.days[MON].open_at_end == 0


def test_a_stay_over_hours_counts_where_it_begins_and_occupies_each_hour() -> None:
    r = compute([ev("enter", at(MON, "10:30:00")), ev("leave", at(MON, "12:15:00"))], MON, MON)
    h = hours(r)
    assert h[10] == row(entries=1, mean_occupancy=0.5, peak_occupancy=1, stays=1, dwell_p50_s=6300.0,
                        dwell_p90_s=6300.0)
    assert h[11] == row(mean_occupancy=1.0, peak_occupancy=1)
    assert h[12] == row(exits=1, mean_occupancy=0.25, peak_occupancy=1)


def test_repeated_enter_and_leave_without_enter_change_nothing() -> None:
    events = [ev("leave", at(MON, "09:00:00")),  # no enter before it: ignored
              ev("enter", at(MON, "10:00:00")), ev("enter", at(MON, "10:20:00")),  # the 2nd: a repeat
              ev("leave", at(MON, "11:00:00")), ev("leave", at(MON, "11:30:00"))]  # the 2nd: ignored
    h = hours(compute(events, MON, MON))
    assert h[9] == row()  # the fence is active that day, but nothing happened in the hour
    assert h[10] == row(entries=1, mean_occupancy=1.0, peak_occupancy=1, stays=1, dwell_p50_s=3600.0,
                        dwell_p90_s=3600.0)
    assert h[11] == row(exits=1)


def test_an_object_that_never_leaves_is_inside_until_the_day_ends_and_carried_over() -> None:
    events = [ev("enter", at(MON, "22:30:00")), ev("leave", at(TUE, "01:30:00"))]
    r = compute(events, MON, TUE)
    mon, tue = hours(r, day=MON), hours(r, day=TUE)
    assert mon[22] == row(entries=1, mean_occupancy=0.5, peak_occupancy=1, stays=1, dwell_p50_s=5400.0,
                          dwell_p90_s=5400.0)
    assert mon[23] == row(mean_occupancy=1.0, peak_occupancy=1)
    assert (MON, "f1", "o1") in r.open and (TUE, "f1", "o1") not in r.open
    # Tuesday: a stay of its own from 00:00, no entry
    assert tue[0] == row(mean_occupancy=1.0, peak_occupancy=1, stays=1, dwell_p50_s=5400.0,
                         dwell_p90_s=5400.0)
    assert tue[1] == row(exits=1, mean_occupancy=0.5, peak_occupancy=1)
    assert r.days[MON].open_at_end == 1 and r.days[TUE].open_at_end == 0


def test_a_window_of_one_day_carries_in_from_earlier_events_and_closes_at_its_end() -> None:
    events = [ev("enter", at(MON, "20:00:00")),  # before the window: the object is inside at 00:00
              ev("enter", at(TUE, "18:00:00"), obj="o2")]  # never leaves
    r = compute(events, TUE, TUE)
    h = hours(r, day=TUE)
    assert h[0] == row(mean_occupancy=1.0, peak_occupancy=1, stays=1, dwell_p50_s=86400.0,
                       dwell_p90_s=86400.0)
    assert h[18] == row(entries=1, mean_occupancy=2.0, peak_occupancy=2, stays=1, dwell_p50_s=21600.0,
                        dwell_p90_s=21600.0)
    assert r.open == {(TUE, "f1", "o1"), (TUE, "f1", "o2")}
    assert r.days[TUE].events == 1  # the carried-in object's enter is Monday's


def test_a_stay_over_three_days_is_one_part_per_day() -> None:
    r = compute([ev("enter", at(MON, "12:00:00")), ev("leave", at(WED, "06:00:00"))], MON, WED)
    assert hours(r, day=TUE)[0].dwell_p50_s == 86400.0
    assert hours(r, day=TUE)[5] == row(mean_occupancy=1.0, peak_occupancy=1)
    assert hours(r, day=WED)[6] == row(exits=1)
    assert {(d, o) for d, _, o in r.open} == {(MON, "o1"), (TUE, "o1")}
    assert r.days[TUE].events == 0 and r.days[TUE].fences == 1  # occupied without an event


def test_a_leave_at_midnight_belongs_to_the_next_day() -> None:
    r = compute([ev("enter", at(MON, "23:00:00")), ev("leave", at(TUE, "00:00:00"))], MON, TUE)
    assert (MON, "f1", "o1") in r.open
    assert hours(r, day=MON)[23].mean_occupancy == 1.0
    # Tuesday: a part of zero length at 00:00 and the exit
    assert hours(r, day=TUE)[0] == row(exits=1, stays=1, dwell_p50_s=0.0, dwell_p90_s=0.0)


def test_a_clock_ahead_is_clamped_to_the_archiving_time() -> None:
    # the device's clock runs 2 h ahead: its leave says 12:30 but was archived at 10:30:01
    enter = ev("enter", at(MON, "10:00:00"))
    leave = ev("leave", at(MON, "12:30:00"), archived=at(MON, "10:30:01"))
    assert leave.t == at(MON, "10:30:01")
    h = hours(compute([enter, leave], MON, MON))
    assert h[10] == row(entries=1, exits=1, mean_occupancy=1801 / 3600, peak_occupancy=1, stays=1,
                        dwell_p50_s=1801.0, dwell_p90_s=1801.0)
    assert h[12] == row()


def test_events_clamped_to_one_instant_keep_the_devices_order() -> None:
    # both archived in one batch at 10:00:05, both stamped ahead: the device's order decides
    batch = at(MON, "10:00:05")
    events = [ev("leave", at(MON, "11:00:00"), archived=batch),
              ev("enter", at(MON, "10:59:00"), archived=batch)]
    r = compute(events, MON, MON)
    assert hours(r)[10] == row(entries=1, exits=1, stays=1, dwell_p50_s=0.0, dwell_p90_s=0.0)
    assert r.open == set()


def test_a_clock_behind_is_trusted_and_may_move_an_event_before_the_window() -> None:
    events = [ev("enter", at(MON, "23:59:00"), archived=at(TUE, "00:00:30")),  # 1 min behind: Monday
              ev("leave", at(TUE, "00:10:00"))]
    r = compute(events, TUE, TUE)
    assert hours(r, day=TUE)[0] == row(exits=1, mean_occupancy=600 / 3600, peak_occupancy=1, stays=1,
                                       dwell_p50_s=600.0, dwell_p90_s=600.0)
    assert r.days[TUE].events == 1


def test_at_one_instant_the_enter_comes_first() -> None:
    t = at(MON, "10:00:00")
    outside = compute([ev("leave", t, archived=t + 5), ev("enter", t, archived=t + 5)], MON, MON)
    assert hours(outside)[10] == row(entries=1, exits=1, stays=1, dwell_p50_s=0.0, dwell_p90_s=0.0)
    assert outside.open == set()  # not a phantom object left inside
    inside = compute([ev("enter", at(MON, "09:00:00")), ev("leave", t), ev("enter", t)], MON, MON)
    assert hours(inside)[10] == row(exits=1)  # the enter repeats, the leave closes
    assert inside.open == set()


def test_peak_counts_objects_inside_at_one_instant() -> None:
    events = [ev("enter", at(MON, "10:00:00"), "a"), ev("leave", at(MON, "10:30:00"), "a"),
              ev("enter", at(MON, "10:30:00"), "b"), ev("leave", at(MON, "11:00:00"), "b"),  # back to back
              ev("enter", at(MON, "11:10:00"), "c"), ev("enter", at(MON, "11:20:00"), "d"),
              ev("leave", at(MON, "11:40:00"), "c"), ev("leave", at(MON, "11:50:00"), "d")]
    h = hours(compute(events, MON, MON))
    assert h[10].peak_occupancy == 1 and h[10].mean_occupancy == 1.0
    assert h[11].peak_occupancy == 2 and h[11].mean_occupancy == pytest.approx(60 / 60)


def test_peak_includes_the_level_at_the_hours_start() -> None:
    events = [ev("enter", at(MON, "09:50:00"), "a"), ev("enter", at(MON, "09:55:00"), "b"),
              ev("leave", at(MON, "10:05:00"), "a"), ev("leave", at(MON, "10:10:00"), "b")]
    assert hours(compute(events, MON, MON))[10].peak_occupancy == 2


def test_dwell_percentiles_interpolate_between_ranks() -> None:
    events = []
    for obj, minutes in (("a", 1), ("b", 2), ("c", 10)):
        start = at(MON, "14:00:00")
        events += [ev("enter", start, obj), ev("leave", start + 60 * minutes, obj)]
    h = hours(compute(events, MON, MON))
    assert h[14].stays == 3
    assert h[14].dwell_p50_s == 120.0
    assert h[14].dwell_p90_s == pytest.approx(0.2 * 120 + 0.8 * 600)
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_fences_and_objects_are_separate_sequences() -> None:
    events = [ev("enter", at(MON, "08:00:00"), "o1", "f1"), ev("enter", at(MON, "08:00:00"), "o1", "f2"),
              ev("leave", at(MON, "08:30:00"), "o1", "f2"), ev("enter", at(MON, "08:15:00"), "o2", "f1"),
              ev("leave", at(MON, "09:00:00"), "o1", "f1")]
    r = compute(events, MON, MON)
    stays = (3600.0, at(MON, "00:00:00") + 86400 - at(MON, "08:15:00"))  # o2 stays until midnight
    assert hours(r, "f1")[8] == row(entries=2, mean_occupancy=1.75, peak_occupancy=2, stays=2,
                                    dwell_p50_s=sum(stays) / 2, dwell_p90_s=0.1 * stays[0] + 0.9 * stays[1])
    assert hours(r, "f2")[8] == row(entries=1, exits=1, mean_occupancy=0.5, peak_occupancy=1, stays=1,
                                    dwell_p50_s=1800.0, dwell_p90_s=1800.0)
    assert r.open == {(MON, "f1", "o2")}


def test_a_day_without_events_has_no_hourly_rows_but_a_forecast() -> None:
    r = compute([ev("enter", at(MON, "10:00:00")), ev("leave", at(MON, "11:00:00"))], MON, TUE)
    assert not hours(r, day=TUE)
    assert r.days[TUE].events == 0 and r.days[TUE].fences == 0
    # as of Tuesday: Monday's 1.0 at 10h, Tuesday's zeros; Wednesday has no same weekday yet
    f = r.forecast["f1", WED, 10]
    assert f.basis == "hour" and f.samples == 2 and f.seasonal == 0.5 and f.trend == 1.0
    assert f.occupancy == 0.5
    assert r.forecast["f1", WED, 9].occupancy == 0.0


def test_busiest_hours_rank_the_mean_per_weekday_top_three_above_zero() -> None:
    events = []
    for obj, (start, end) in enumerate((("08:00:00", "10:00:00"), ("09:00:00", "10:30:00"),
                                        ("17:00:00", "17:30:00"), ("19:00:00", "19:30:00"))):
        events += [ev("enter", at(MON, start), f"o{obj}"), ev("leave", at(MON, end), f"o{obj}")]
    r = compute(events, MON, MON)
    top = {rank: (b.hour, b.mean_occupancy, b.days) for (_, _, w, rank), b in r.busiest.items() if w == 1}
    # 9h: 2.0; then 8h, 10h, 17h and 19h at 1.0 / 0.5 / 0.5 / 0.5: the earlier hour wins ties
    assert top == {1: (9, 2.0, 1), 2: (8, 1.0, 1), 3: (10, 0.5, 1)}
    assert not [k for k in r.busiest if k[2] != 1]  # only Mondays were computed


def test_forecast_uses_the_same_weekday_and_the_trend_of_the_last_week() -> None:
    events = []
    # four Mondays with one object 10-11h; the last week twice as busy from Monday to Sunday
    for week in range(4):
        monday = MON - dt.timedelta(days=7 * (3 - week))
        events += [ev("enter", at(monday, "10:00:00"), f"w{week}"),
                   ev("leave", at(monday, "11:00:00"), f"w{week}")]
    sunday = MON + dt.timedelta(days=6)
    for day in (MON + dt.timedelta(days=i) for i in range(7)):
        events += [ev("enter", at(day, "15:00:00"), f"x{day}"), ev("leave", at(day, "16:00:00"), f"x{day}")]
    first = MON - dt.timedelta(days=21)
    r = compute(events, first, sunday)
    f = r.forecast["f1", sunday + dt.timedelta(days=1), 10]  # a Monday
    assert f.basis == "weekday" and f.samples == 4 and f.seasonal == 1.0
    # 28 days: 4 + 7 object-hours; last 7 days: 1 + 7
    level, recent = 11 / (28 * 24), 8 / (7 * 24)
    assert f.trend == pytest.approx(min(recent / level, 2.0)) and f.trend == 2.0
    assert f.occupancy == 2.0
    assert r.forecast["f1", sunday + dt.timedelta(days=1), 15].seasonal == 0.25


def test_a_quiet_last_week_halves_at_most() -> None:
    events = [ev("enter", at(MON, "10:00:00")), ev("leave", at(MON, "20:00:00"))]
    last = MON + dt.timedelta(days=13)
    f = compute(events, MON, last).forecast["f1", last + dt.timedelta(days=1), 10]
    assert f.trend == 0.5 and f.basis == "weekday" and f.samples == 2 and f.seasonal == 0.5


def test_events_outside_the_window_only_decide_the_carry_in() -> None:
    events = [ev("enter", at(MON, "10:00:00")), ev("leave", at(MON, "11:00:00")),
              ev("enter", at(WED, "10:00:00"))]
    r = compute(events, TUE, TUE)
    assert r.hourly == {} and r.open == set()
    assert r.days[TUE].events == 0
