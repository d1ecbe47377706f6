"""The pure core of the venue analytics: a hive's counts in, its hourly rows, days, "popular
times" profile and forecast out. No I/O; spark_jobs/venue_analytics.py is the shell. A single
day's curve is fence/venues/day_curve.py's (the owners' live "today" uses it too).

Rules (tests/unit/test_venue_core.py checks them against a second-by-second reference):
- Days and hours. A hive's business day D runs from D reset_hour:00 local time to the next
  day's (fence/venues/occupancy.business_day, as the live figure). Its hours are its local
  clock hours: the day clocks go forward has 23 (the skipped hour has no row), the day they go
  back 25 (the repeated hour's row covers both: counts summed, means averaged, peaks the
  higher). Slots are 3,600 s from the day's start, labelled by the local hour they begin in.
- Counts. What the live figure adds (sensor_report's entries / exits and v2 event reports),
  each at its `at` (the sensor sidecar's clock-skew rule). The occupancy curve starts the
  day at zero and steps at each counted instant (a legacy sensor reporting every 15 minutes
  gives 15-minute steps: that is what is known); counts at one instant are one step.
- Drift correction, on days that have ended. Door sensors drift: they miss people, exits run
  ahead. residual = entries - exits at the day's end (the live figure's reset sets it back to
  zero). residual > 0 (exits missed): every exit of the day is scaled by entries / exits
  ('exits'); residual < 0 (entries missed): every entry by exits / entries ('entries'). The
  corrected curve keeps its shape and ends the day at zero. A side that counted nothing cannot
  be scaled ('one-sided': raw curve); a day not yet ended is raw ('open'). The curve is always
  clamped at zero, as shown live; hourly entries / exits stay as counted.
- Means and peaks. mean = the curve's time-weighted mean over the hour, peak = its highest
  value in the hour (the value it enters the hour with included).
- Phones. The second source: app users' phones inside the hive's fence, from the fence
  analytics' occupancy_hourly (UTC hours): a local hour takes the UTC hour it begins in (exact
  for zones whose offset is a whole number of hours; a :30 zone takes the hour that holds its
  first half). A hive without a fence has NULL there.
- Computed days. A (hive, day) with at least one counted instant in it. A day whose sensors
  said nothing is not a day of zero guests (a dead sensor, a power cut): it has no rows and
  the profile and forecast leave it out. A closed day still has its sensors' periodic zero
  reports, so it counts, as zeros.
- Profile as of a (the run's last day): per ISO weekday of the business day and local hour,
  the mean over the computed days of that weekday among the 28 ending at a (an hour a computed
  day lacks - the skipped DST hour - counts zero). "Busier than usual" compares the live figure
  with it (fence/venues/occupancy.busyness).
- Forecast of d + 1, made as of each day d of the run, as the fence analytics do
  (spark_jobs/occupancy.py): seasonal(h) = the mean of h over the computed days of (d + 1)'s
  weekday among the 28 ending at d (basis 'weekday'), else over all of them ('hour'); trend =
  (mean of the computed days among the last 7) / (mean of the 28), clamped to [0.5, 2], 1 when
  the 28 are empty; occupancy = seasonal * trend; phones the same from their own means.

Trade-off: one hive at a time in Python, its days' arithmetic in numpy. A hive has a few
hundred reports a day, so the per-hive Python (about 0.2 ms a day) dominates and 10,000 hives
take a couple of seconds per task and day; fusing all hives into one array sweep, as the fence
core does, would save that at the price of the time-zone and DST handling per hive.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fence.venues.day_curve import (
    CORRECTIONS,
    HOUR_S,
    Day,
    HiveInput,
    analyse_day,
    correction,
    day_bounds,
    slots,
)

__all__ = ["CORRECTIONS", "HOUR_S", "LOOKBACK_DAYS", "Day", "HiveInput", "Output", "analyse", "analyse_day",
           "analyse_hive", "correction", "day_bounds", "slots"]  # a day's curve: fence/venues/day_curve.py

LOOKBACK_DAYS = 28
RECENT_DAYS = 7
TREND_LIMITS = (0.5, 2.0)


@dataclass
class Output:
    """Rows for the tables of deploy/migrations/0010_venue_analytics.sql (their column order)."""

    hourly: list[tuple[object, ...]] = field(default_factory=list)
    days: list[tuple[object, ...]] = field(default_factory=list)
    profile: list[tuple[object, ...]] = field(default_factory=list)
    forecast: list[tuple[object, ...]] = field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.hourly += other.hourly
        self.days += other.days
        self.profile += other.profile
        self.forecast += other.forecast


def _seasonal(days: Sequence[tuple[dt.date, np.ndarray]], target_weekday: int | None
              ) -> tuple[np.ndarray, str, int]:
    same = [m for d, m in days if d.isoweekday() == target_weekday]
    basis, base = ("weekday", same) if same else ("hour", [m for _, m in days])
    return np.mean(base, axis=0), basis, len(base)


def _trend(days: Sequence[tuple[dt.date, np.ndarray]], as_of: dt.date) -> float:
    level = float(np.mean([m for _, m in days]))
    recent = [m for d, m in days if (as_of - d).days < RECENT_DAYS]
    if level <= 0:
        return 1.0
    level_recent = float(np.mean(recent)) if recent else level
    return min(max(level_recent / level, TREND_LIMITS[0]), TREND_LIMITS[1])


def analyse_hive(h: HiveInput, days: Sequence[dt.date], now: float) -> Output:
    """A hive's rows for the run's days (consecutive, ascending)."""
    out = Output()
    means: dict[dt.date, tuple[np.ndarray, np.ndarray | None]] = dict(h.history)
    for day in days:
        d = analyse_day(h, day, now)
        means.pop(day, None)
        if d is None:
            continue
        means[day] = (d.mean, d.phones_mean)
        out.days.append((h.hive_id, day, d.reports, d.entries, d.exits, d.entries - d.exits, d.correction,
                         d.factor, d.complete))
        for hour in np.flatnonzero(d.present).tolist():
            out.hourly.append((h.hive_id, day, hour, int(d.hourly_entries[hour]), int(d.hourly_exits[hour]),
                               float(d.mean[hour]), float(d.peak[hour]),
                               None if d.phones_mean is None else float(d.phones_mean[hour]),
                               None if d.phones_peak is None else int(d.phones_peak[hour])))
    for as_of in days:
        used = sorted((d, m) for d, m in means.items() if 0 <= (as_of - d).days < LOOKBACK_DAYS)
        if not used:
            continue
        target = as_of + dt.timedelta(days=1)
        sensors = [(d, m[0]) for d, m in used]
        seasonal, basis, samples = _seasonal(sensors, target.isoweekday())
        trend = _trend(sensors, as_of)
        phones: np.ndarray | None = None
        if h.has_fence:
            ph = [(d, m[1] if m[1] is not None else np.zeros(24)) for d, m in used]
            phones = _seasonal(ph, target.isoweekday())[0] * _trend(ph, as_of)
        for hour in range(24):
            out.forecast.append((h.hive_id, target, hour, float(seasonal[hour] * trend),
                                 None if phones is None else float(phones[hour]), float(seasonal[hour]),
                                 trend, basis, samples))
        if as_of == days[-1]:
            for weekday in range(1, 8):
                same = [m for d, m in used if d.isoweekday() == weekday]
                if not same:
                    continue
                occ = np.mean([m[0] for m in same], axis=0)
                ph_mean = np.mean([m[1] if m[1] is not None else np.zeros(24) for m in same], axis=0) \
                    if h.has_fence else None
                for hour in range(24):
                    out.profile.append((h.hive_id, weekday, hour, float(occ[hour]),
                                        None if ph_mean is None else float(ph_mean[hour]), len(same), as_of))
    return out


def analyse(hives: Iterable[HiveInput], days: Sequence[dt.date], now: float) -> Output:
    out = Output()
    for h in hives:
        out.extend(analyse_hive(h, days, now))
    return out
