"""The pure core of the venue analytics: a hive's counts in, its hourly rows, days, "popular
times" profile and forecast out. No I/O; spark_jobs/venue_analytics.py is the shell.

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
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np

LOOKBACK_DAYS = 28
RECENT_DAYS = 7
TREND_LIMITS = (0.5, 2.0)
HOUR_S = 3_600.0
CORRECTIONS = ("none", "exits", "entries", "one-sided", "open")


@lru_cache(maxsize=1024)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


@dataclass(frozen=True)
class HiveInput:
    """One hive's data for a run: its counts (any order), its fence's phones per UTC hour
    start (mean, peak), and its computed days before the run (day -> the 24 hourly means of the
    sensors, and of the phones or None)."""

    hive_id: str
    tz: str
    reset_hour: int
    has_fence: bool
    at: np.ndarray  # float64 epoch seconds
    entries: np.ndarray  # int64
    exits: np.ndarray  # int64
    phones: Mapping[float, tuple[float, int]] = field(default_factory=dict)
    history: Mapping[dt.date, tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)


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


def day_bounds(day: dt.date, tz: str, reset_hour: int) -> tuple[float, float]:
    """The instants business day `day` starts and ends at."""
    z = _zone(tz)

    def start(d: dt.date) -> float:
        return dt.datetime.combine(d, dt.time(reset_hour), z).timestamp()

    return start(day), start(day + dt.timedelta(days=1))


def slots(day: dt.date, tz: str, reset_hour: int) -> tuple[np.ndarray, np.ndarray]:
    """The day's hour slots: their edges (n + 1 instants) and the local hour each begins in."""
    start, end = day_bounds(day, tz, reset_hour)
    n = max(1, round((end - start) / HOUR_S))
    edges = start + HOUR_S * np.arange(n + 1, dtype=np.float64)
    edges[-1] = end
    z = _zone(tz)
    labels = np.array([dt.datetime.fromtimestamp(e, dt.UTC).astimezone(z).hour for e in edges[:-1]],
                      dtype=np.int64)
    return edges, labels


@dataclass(frozen=True)
class Day:
    """One computed day: its row for venue_day and its 24 hourly figures."""

    day: dt.date
    reports: int
    entries: int
    exits: int
    correction: str
    factor: float
    complete: bool
    hourly_entries: np.ndarray  # (24,) int64
    hourly_exits: np.ndarray
    mean: np.ndarray  # (24,) float64
    peak: np.ndarray
    present: np.ndarray  # (24,) bool: the hour exists that day
    phones_mean: np.ndarray | None
    phones_peak: np.ndarray | None


def correction(entries: int, exits: int, complete: bool) -> tuple[str, float, float]:
    """(rule, entry factor, exit factor) of a day's drift correction."""
    if not complete:
        return "open", 1.0, 1.0
    if entries == exits:
        return "none", 1.0, 1.0
    if entries > exits:
        return ("exits", 1.0, entries / exits) if exits else ("one-sided", 1.0, 1.0)
    return ("entries", exits / entries, 1.0) if entries else ("one-sided", 1.0, 1.0)


def analyse_day(h: HiveInput, day: dt.date, now: float) -> Day | None:
    """A day of a hive, None when nothing was counted in it."""
    edges, labels = slots(day, h.tz, h.reset_hour)
    start, end = float(edges[0]), float(edges[-1])
    sel = (h.at >= start) & (h.at < end)
    if not sel.any():
        return None
    order = np.argsort(h.at[sel], kind="stable")
    at, ent, ex = h.at[sel][order], h.entries[sel][order], h.exits[sel][order]
    e_tot, x_tot = int(ent.sum()), int(ex.sum())
    complete = end <= now
    rule, fe, fx = correction(e_tot, x_tot, complete)
    value = np.maximum(0.0, fe * np.cumsum(ent) - fx * np.cumsum(ex))
    last = np.flatnonzero(np.r_[at[1:] != at[:-1], True])  # one step per instant
    t, v = at[last], value[last]
    # the curve: 0 before t[0], v[i] on [t[i], t[i+1]); area from the start up to each knot
    width = np.diff(np.r_[t, end])
    area = np.r_[0.0, np.cumsum(v * width)[:-1]]
    k = np.searchsorted(t, edges, side="right") - 1
    inside = k >= 0
    at_edge = np.where(inside, v[np.maximum(k, 0)], 0.0)
    cum = np.where(inside, area[np.maximum(k, 0)] + at_edge * (edges - t[np.maximum(k, 0)]), 0.0)
    n = len(labels)
    slot_mean = np.diff(cum) / np.diff(edges)
    slot_peak = at_edge[:-1].copy()
    np.maximum.at(slot_peak, np.searchsorted(edges, t, side="right") - 1, v)
    slot_of = np.searchsorted(edges, at, side="right") - 1
    slot_e = np.bincount(slot_of, ent, minlength=n)
    slot_x = np.bincount(slot_of, ex, minlength=n)

    # local hours: a repeated hour (DST ends) merges its two slots
    present = np.zeros(24, bool)
    present[labels] = True
    times = np.bincount(labels, minlength=24)
    mean = np.bincount(labels, slot_mean, minlength=24) / np.maximum(times, 1)
    peak = np.zeros(24)
    np.maximum.at(peak, labels, slot_peak)
    phones_mean = phones_peak = None
    if h.has_fence:
        got = [h.phones.get(math.floor(s / HOUR_S) * HOUR_S, (0.0, 0)) for s in edges[:-1]]
        phones_mean = np.bincount(labels, [g[0] for g in got], minlength=24) / np.maximum(times, 1)
        phones_peak = np.zeros(24, np.int64)
        np.maximum.at(phones_peak, labels, np.array([g[1] for g in got], np.int64))
    return Day(day, len(at), e_tot, x_tot, rule, fx if rule == "exits" else fe, complete,
               np.bincount(labels, slot_e, minlength=24).round().astype(np.int64),
               np.bincount(labels, slot_x, minlength=24).round().astype(np.int64),
               mean, peak, present, phones_mean, phones_peak)


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
