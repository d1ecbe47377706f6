"""The venue analytics core (spark_jobs/venue_core.py) against a second-by-second reference.

Counts land on whole seconds, so the reference can hold the occupancy curve as one value per
second of the day and take its hourly means and peaks by brute force; the core's event sweep
must give the same figures. Also the drift correction, DST days, computed and empty days,
phones, the profile and the forecast rule.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import numpy as np
import pytest

from spark_jobs import venue_core as core


def hive(at: list[float] | np.ndarray, entries: list[int] | np.ndarray, exits: list[int] | np.ndarray,
         tz: str = "UTC", reset_hour: int = 4, **kw: object) -> core.HiveInput:
    return core.HiveInput("h1", tz, reset_hour, bool(kw.pop("has_fence", False)), np.asarray(at, np.float64),
                          np.asarray(entries, np.int64), np.asarray(exits, np.int64), **kw)  # type: ignore[arg-type]


def reference(h: core.HiveInput, day: dt.date, complete: bool) -> dict[int, tuple[int, int, float, float]]:
    """hour -> (entries, exits, mean, peak) from the curve held per second."""
    start, end = core.day_bounds(day, h.tz, h.reset_hour)
    n = round(end - start)
    sel = (h.at >= start) & (h.at < end)
    offs = (h.at[sel] - start).astype(np.int64)
    e = np.zeros(n, np.int64)
    x = np.zeros(n, np.int64)
    np.add.at(e, offs, h.entries[sel])
    np.add.at(x, offs, h.exits[sel])
    _, fe, fx = core.correction(int(e.sum()), int(x.sum()), complete)
    curve = np.maximum(0.0, fe * np.cumsum(e) - fx * np.cumsum(x))
    z = ZoneInfo(h.tz)
    out: dict[int, list[tuple[int, int, float, float]]] = {}
    for k in range(0, n, 3600):
        label = dt.datetime.fromtimestamp(start + k, dt.UTC).astimezone(z).hour
        part = slice(k, min(k + 3600, n))
        out.setdefault(label, []).append((int(e[part].sum()), int(x[part].sum()), float(curve[part].mean()),
                                          float(curve[part].max())))
    return {hr: (sum(p[0] for p in ps), sum(p[1] for p in ps), sum(p[2] for p in ps) / len(ps),
                 max(p[3] for p in ps)) for hr, ps in out.items()}


def random_day(rng: np.random.Generator, day: dt.date, tz: str, reset_hour: int, n: int
               ) -> core.HiveInput:
    start, end = core.day_bounds(day, tz, reset_hour)
    at = rng.integers(int(start) - 7200, int(end) + 7200, n).astype(np.float64)  # some outside the day
    at[: n // 5] = at[n // 5: 2 * (n // 5)]  # shared instants
    entries = rng.integers(0, 6, n)
    exits = rng.integers(0, 6, n)
    return hive(at, entries, exits, tz, reset_hour)


def check(h: core.HiveInput, day: dt.date, now: float) -> core.Day:
    d = core.analyse_day(h, day, now)
    assert d is not None
    want = reference(h, day, d.complete)
    assert sorted(np.flatnonzero(d.present).tolist()) == sorted(want)
    for hour, (e, x, mean, peak) in want.items():
        assert (int(d.hourly_entries[hour]), int(d.hourly_exits[hour])) == (e, x), hour
        assert d.mean[hour] == pytest.approx(mean, rel=1e-9, abs=1e-9), hour
        assert d.peak[hour] == pytest.approx(peak, rel=1e-9, abs=1e-9), hour
    return d


@pytest.mark.parametrize(("tz", "day", "reset_hour", "hours"), [
    ("UTC", dt.date(2026, 3, 10), 4, 24),
    ("Europe/Vaduz", dt.date(2026, 3, 28), 4, 23),   # forward at 02:00 on the 29th: 23 hours
    ("Europe/Vaduz", dt.date(2026, 10, 25), 0, 24),  # back at 03:00: 25 slots, hour 2 twice
    ("America/New_York", dt.date(2026, 11, 1), 4, 24),
    ("Asia/Kolkata", dt.date(2026, 6, 5), 6, 24),    # +05:30
    ("Pacific/Kiritimati", dt.date(2026, 6, 5), 3, 24),  # +14
])
def test_random_days_equal_the_second_by_second_reference(tz: str, day: dt.date, reset_hour: int,
                                                          hours: int) -> None:
    rng = np.random.default_rng(hash((tz, day.toordinal())) & 0xFFFF)
    for n in (1, 7, 300):
        h = random_day(rng, day, tz, reset_hour, n)
        start, end = core.day_bounds(day, tz, reset_hour)
        if not ((h.at >= start) & (h.at < end)).any():
            assert core.analyse_day(h, day, end + 1) is None
            continue
        for now in (end + 1, end - 1):  # complete (corrected) and open (raw)
            d = check(h, day, now)
            assert int(d.present.sum()) == hours
            assert d.complete == (now >= end)


def test_the_drift_correction_ends_the_day_at_zero_and_keeps_the_raw_counts() -> None:
    day = dt.date(2026, 5, 4)
    start, end = core.day_bounds(day, "UTC", 4)
    at = [start + 3600, start + 7200, start + 10_800]
    d = core.analyse_day(hive(at, [10, 0, 0], [0, 4, 4]), day, end)  # 2 exits missed
    assert d is not None and (d.correction, d.entries, d.exits) == ("exits", 10, 8)
    assert d.factor == pytest.approx(10 / 8)
    assert d.peak[5] == 10 and d.peak[7] == pytest.approx(0.0, abs=1e-12)  # 10 - 8 * 1.25
    assert (int(d.hourly_exits.sum()), int(d.hourly_entries.sum())) == (8, 10)  # as counted
    d = core.analyse_day(hive(at, [3, 3, 0], [0, 0, 8]), day, end)  # exits ran ahead
    assert d is not None and d.correction == "entries" and d.factor == pytest.approx(8 / 6)
    assert d.peak[6] == pytest.approx(8.0)  # 6 entries * 4/3
    d = core.analyse_day(hive(at, [5, 0, 0], [0, 0, 0]), day, end)  # no exit at all
    assert d is not None and d.correction == "one-sided" and d.peak[7] == 5
    d = core.analyse_day(hive(at, [10, 0, 0], [0, 4, 4]), day, end - 1)  # not ended: raw
    assert d is not None and d.correction == "open" and d.peak[7] == 2
    d = core.analyse_day(hive(at, [2, 0, 0], [0, 5, 0]), day, end)
    assert d is not None and d.mean[6] >= 0  # clamped at zero


def test_a_day_of_zero_reports_is_computed_and_a_silent_day_is_not() -> None:
    day = dt.date(2026, 5, 4)
    start, end = core.day_bounds(day, "Europe/Vaduz", 4)
    h = hive([start + 900 * k for k in range(96)], [0] * 96, [0] * 96, "Europe/Vaduz")
    out = core.analyse_hive(h, [day], end)
    assert len(out.hourly) == 24 and all(r[5] == 0 for r in out.hourly)
    assert out.days == [("h1", day, 96, 0, 0, 0, "none", 1.0, True)]
    assert core.analyse_hive(hive([end + 10], [1], [0], "Europe/Vaduz"), [day], end).hourly == []


def test_phones_take_the_utc_hour_the_local_hour_begins_in() -> None:
    day = dt.date(2026, 7, 1)  # Vaduz is UTC+2: local 04:00 is 02:00 UTC
    start, _ = core.day_bounds(day, "Europe/Vaduz", 4)
    assert dt.datetime.fromtimestamp(start, dt.UTC).hour == 2
    phones = {start: (1.5, 3), start + 3600: (0.25, 1)}
    h = hive([start + 10], [1], [0], "Europe/Vaduz", has_fence=True, phones=phones)
    d = core.analyse_day(h, day, start + 86_400)
    assert d is not None and d.phones_mean is not None and d.phones_peak is not None
    assert (d.phones_mean[4], d.phones_peak[4], d.phones_mean[5], d.phones_peak[5]) == (1.5, 3, 0.25, 1)
    assert d.phones_mean[6] == 0.0
    assert core.analyse_day(hive([start + 10], [1], [0], "Europe/Vaduz"), day, start).phones_mean is None


def flat(value: float) -> np.ndarray:
    return np.full(24, value)


def test_profile_and_forecast_follow_the_fence_rule() -> None:
    last = dt.date(2026, 5, 31)  # a Sunday
    history: dict[dt.date, tuple[np.ndarray, np.ndarray | None]] = {}
    for i in range(1, 28):  # the 27 days before `last`, Mondays busier; one day missing
        d = last - dt.timedelta(days=i)
        if i == 10:
            continue
        history[d] = (flat(4.0 if d.isoweekday() == 1 else 1.0 + (i < 7)), flat(0.5))
    start, end = core.day_bounds(last, "UTC", 4)
    h = hive([start + 60, start + 3600 * 5], [3, 0], [0, 3], has_fence=True, history=history)
    out = core.analyse_hive(h, [last], end)
    # the forecast of Monday 1 June: the mean of the Mondays, times the trend
    used = {**{d: m[0] for d, m in history.items()}}
    got = core.analyse_day(h, last, end)
    assert got is not None
    used[last] = got.mean
    mondays = [m for d, m in used.items() if d.isoweekday() == 1]
    recent = [m for d, m in used.items() if (last - d).days < 7]
    trend = min(max(np.mean(recent) / np.mean(list(used.values())), 0.5), 2.0)
    rows = {r[2]: r for r in out.forecast}
    assert len(rows) == 24 and all(r[1] == last + dt.timedelta(days=1) for r in rows.values())
    assert rows[9][3] == pytest.approx(np.mean(mondays, axis=0)[9] * trend)
    assert (rows[9][5], rows[9][6], rows[9][7], rows[9][8]) == (pytest.approx(4.0), pytest.approx(trend),
                                                                "weekday", 4)
    phones = {d: flat(0.5) for d in history} | {last: flat(0.0)}  # none inside on the last day
    p_trend = np.mean([m for d, m in phones.items() if (last - d).days < 7]) / np.mean(list(phones.values()))
    assert rows[9][4] == pytest.approx(0.5 * p_trend)
    profile = {(r[1], r[2]): r for r in out.profile}
    assert len(profile) == 7 * 24 and {r[6] for r in profile.values()} == {last}
    assert profile[1, 12][3] == pytest.approx(4.0) and profile[1, 12][5] == 4
    sundays = [m for d, m in used.items() if d.isoweekday() == 7]
    assert profile[7, 4][3] == pytest.approx(np.mean(sundays, axis=0)[4])


def test_a_hive_without_history_gets_an_hour_based_forecast_and_none_without_days() -> None:
    day = dt.date(2026, 5, 4)  # a Monday; the forecast is for Tuesday, no Tuesday known
    start, end = core.day_bounds(day, "UTC", 4)
    out = core.analyse_hive(hive([start + 60, start + 7200], [2, 0], [0, 2]), [day], end)
    assert {r[7] for r in out.forecast} == {"hour"} and {r[8] for r in out.forecast} == {1}
    assert {r[6] for r in out.forecast} == {1.0}  # one day: its own level
    assert core.analyse_hive(hive([], [], []), [day], end) == core.Output()


def test_a_simulated_clean_day_follows_the_true_occupancy() -> None:
    """The sensor simulator (the ground truth) through the sensor core's counting and this
    core: a restaurant's day with a clean legacy sensor ends at zero without correction, each
    hour's peak is within a report's worth of events (the firmware reports every 5 events or
    30 minutes) of the true peak, and the day's person-hours match the truth's."""
    from deploy.demo.sensors import SimSensor, simulate
    from fence.venues.counting import EVENTS_PER_REPORT
    from fence.venues.sensor_core import Frame, SensorCore, SensorInfo

    day, tz = dt.date(2026, 6, 10), "Europe/Vaduz"
    start, end = core.day_bounds(day, tz, 4)
    sensor = SimSensor("s1", "restaurant", version=1, tz=tz, scale=150.0)
    sent, truth = simulate(sensor, start, 25.0, seed=4)
    counted = SensorCore({"s1": SensorInfo("s1", "h1", tz=tz)}).process(
        [Frame(x.sensor_id, x.topic, x.frame, x.received_at) for x in sent]).counts
    h = hive([r.at for r in counted], [r.entries for r in counted], [r.exits for r in counted], tz)
    d = core.analyse_day(h, day, end)
    assert d is not None and d.entries > 500
    assert (d.correction, d.entries - d.exits) == ("none", 0)

    events = sorted((t, k) for t, k in truth.events if start <= t < end)
    assert sum(1 for t, k in truth.events if t < start) == 0  # nobody inside at the reset
    times = np.array([t for t, _ in events])
    inside = np.cumsum([1 if k else -1 for _, k in events])
    edges, labels = core.slots(day, tz, 4)
    true_mean, true_peak = np.zeros(24), np.zeros(24)
    for i, label in enumerate(labels.tolist()):
        a, b = edges[i], edges[i + 1]
        k = np.searchsorted(times, [a, b], side="right") - 1
        knots = np.r_[a, times[(times >= a) & (times < b)], b]
        values = inside[np.searchsorted(times, knots[:-1], side="right") - 1] if len(times) else np.zeros(1)
        values = np.where(np.searchsorted(times, knots[:-1], side="right") > 0, values, 0)
        true_mean[label] = float(np.sum(values * np.diff(knots)) / (b - a))
        true_peak[label] = max(values.max(), inside[k[0]] if k[0] >= 0 else 0)
    assert np.all(np.abs(d.peak - true_peak) <= EVENTS_PER_REPORT - 1)
    assert d.mean.sum() == pytest.approx(true_mean.sum(), rel=0.01)
    assert d.peak.max() >= 10
