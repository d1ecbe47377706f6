"""The occupancy analytics computed the plain way, from a list of events: what the Spark job
(spark_jobs/occupancy.py, whose docstring states the rules) must produce, row for row.

No Spark, no numpy: loops over each (fence, object) sequence and each hour, written to be
read and checked by hand. The tests compare the job's tables with `compute`'s result.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

DAY_S = 86_400.0
HOUR_S = 3_600.0
LOOKBACK_DAYS = 28  # busiest hours and the forecast look at the 28 days ending at as_of
RECENT_DAYS = 7  # ... and the trend compares their last 7 days with all 28
TREND_LIMITS = (0.5, 2.0)
TOP_HOURS = 3
RANK_SCALE = 1e9  # means are ranked at 1e-9 so that summation order cannot swap equal ones


@dataclass(frozen=True)
class Event:
    event_id: str
    fence_id: str
    object_id: str
    event: str  # enter | leave
    ts: float  # the device's time, epoch seconds
    archived_at: float  # the archiver's time, epoch seconds

    @property
    def t(self) -> float:
        """The effective time: a device cannot report from the future."""
        return min(self.ts, self.archived_at)


@dataclass(frozen=True)
class Hourly:
    entries: int
    exits: int
    mean_occupancy: float
    peak_occupancy: int
    stays: int
    dwell_p50_s: float | None
    dwell_p90_s: float | None


@dataclass(frozen=True)
class Busiest:
    hour: int
    mean_occupancy: float
    days: int


@dataclass(frozen=True)
class Forecast:
    occupancy: float
    seasonal: float
    trend: float
    basis: str
    samples: int


@dataclass(frozen=True)
class DayStats:
    events: int
    fences: int
    open_at_end: int


@dataclass
class Result:
    hourly: dict[tuple[str, dt.date, int], Hourly] = field(default_factory=dict)  # (fence, day, hour)
    open: set[tuple[dt.date, str, str]] = field(default_factory=set)  # (day, fence, object)
    days: dict[dt.date, DayStats] = field(default_factory=dict)
    # (as_of, fence, weekday, rank)
    busiest: dict[tuple[dt.date, str, int, int], Busiest] = field(default_factory=dict)
    forecast: dict[tuple[str, dt.date, int], Forecast] = field(default_factory=dict)  # (fence, day, hour)


def epoch(day: dt.date) -> float:
    return dt.datetime.combine(day, dt.time(), dt.UTC).timestamp()


def percentile(values: list[float], p: float) -> float:
    """Exact percentile, linear between the two nearest ranks (as Spark's `percentile`)."""
    v = sorted(values)
    pos = (len(v) - 1) * p
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return v[lo]
    return (hi - pos) * v[lo] + (pos - lo) * v[hi]


def compute(events: Iterable[Event], first: dt.date, last: dt.date) -> Result:
    """The analytics of the days first..last (all of them count as computed). Events before
    `first` only decide who is inside at its start; events after `last` are ignored."""
    days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
    starts = [epoch(d) for d in days] + [epoch(last) + DAY_S]
    w0, w1 = starts[0], starts[-1]

    def day_of(t: float) -> int:
        return max(i for i in range(len(days)) if starts[i] <= t)

    sequences: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for e in events:
        sequences[e.fence_id, e.object_id].append(e)

    # stays: (fence, object, start, end, open at the end), in the window
    entries: dict[tuple[str, int, int], int] = defaultdict(int)  # (fence, day, hour)
    exits: dict[tuple[str, int, int], int] = defaultdict(int)
    active: set[tuple[str, int]] = set()  # (fence, day) with an event
    day_events = [0] * len(days)
    stays: list[tuple[str, str, float, float]] = []
    for (fence, obj), seq in sequences.items():
        seq.sort(key=lambda e: (e.t, e.ts, e.event == "leave"))  # at one instant, enters first
        inside = False
        for e in seq:
            if e.t >= w0:
                break
            inside = e.event == "enter"  # the last event before the window decides
        since = w0 if inside else None
        for e in seq:
            if not w0 <= e.t < w1:
                continue
            d = day_of(e.t)
            hour = int((e.t - starts[d]) // HOUR_S)
            active.add((fence, d))
            day_events[d] += 1
            if e.event == "enter" and since is None:
                since = e.t
                entries[fence, d, hour] += 1
            elif e.event == "leave" and since is not None:
                stays.append((fence, obj, since, e.t))
                since = None
                exits[fence, d, hour] += 1
            # else: a repeated enter or a leave without an enter changes nothing
        if since is not None:
            stays.append((fence, obj, since, w1))  # never left: closed at the window's end

    # each stay cut into its part of each day; the part ending at the window's end, or going
    # on into the next day, is an object inside at the end of that day
    parts: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    result = Result()
    for fence, obj, begin, end in stays:
        last_day = min(day_of(end), len(days) - 1) if end < w1 else len(days) - 1
        for d in range(day_of(begin), last_day + 1):
            parts[fence, d].append((max(begin, starts[d]), min(end, starts[d + 1])))
            if end >= starts[d + 1]:
                result.open.add((days[d], fence, obj))

    for fence, d in sorted(active | set(parts)):
        day_parts = parts.get((fence, d), [])
        for hour in range(24):
            h0, h1 = starts[d] + hour * HOUR_S, starts[d] + (hour + 1) * HOUR_S
            overlap = sum(min(e, h1) - max(s, h0) for s, e in day_parts if min(e, h1) > max(s, h0))
            # the occupancy can only rise at h0 or where a part begins
            instants = [h0] + [s for s, _ in day_parts if h0 < s < h1]
            peak = max(sum(1 for s, e in day_parts if s <= t < e) for t in instants)
            dwell = [e - s for s, e in day_parts if h0 <= s < h1]
            result.hourly[fence, days[d], hour] = Hourly(
                entries=entries.get((fence, d, hour), 0), exits=exits.get((fence, d, hour), 0),
                mean_occupancy=overlap / HOUR_S, peak_occupancy=peak, stays=len(dwell),
                dwell_p50_s=percentile(dwell, 0.5) if dwell else None,
                dwell_p90_s=percentile(dwell, 0.9) if dwell else None)
    for d, day in enumerate(days):
        result.days[day] = DayStats(
            events=day_events[d], fences=len({f for f, dd in active | set(parts) if dd == d}),
            open_at_end=sum(1 for o in result.open if o[0] == day))
    for as_of in days:
        seasonal(result, as_of, computed=set(days))
    return result


def seasonal(result: Result, as_of: dt.date, computed: set[dt.date]) -> None:
    """Busiest hours as of `as_of` and the forecast of the next day, from result.hourly over
    the computed days among the 28 ending at as_of (a fence without a row that day: zeros)."""
    window = [as_of - dt.timedelta(days=i) for i in range(LOOKBACK_DAYS)]
    used = sorted(d for d in window if d in computed)
    recent = [d for d in used if (as_of - d).days < RECENT_DAYS]
    fences = sorted({f for f, d, _ in result.hourly if d in used})

    def occupancy(fence: str, day: dt.date, hour: int) -> float:
        row = result.hourly.get((fence, day, hour))
        return row.mean_occupancy if row else 0.0

    target = as_of + dt.timedelta(days=1)
    for fence in fences:
        for weekday in range(1, 8):
            same = [d for d in used if d.isoweekday() == weekday]
            if not same:
                continue
            means = [(sum(occupancy(fence, d, h) for d in same) / len(same), h) for h in range(24)]
            ranked = sorted(((m, h) for m, h in means if m > 0),
                            key=lambda mh: (-math.floor(mh[0] * RANK_SCALE + 0.5), mh[1]))
            for rank, (m, h) in enumerate(ranked[:TOP_HOURS], start=1):
                result.busiest[as_of, fence, weekday, rank] = Busiest(hour=h, mean_occupancy=m,
                                                                      days=len(same))

        level = sum(occupancy(fence, d, h) for d in used for h in range(24)) / (24 * len(used))
        level_recent = (sum(occupancy(fence, d, h) for d in recent for h in range(24))
                        / (24 * len(recent))) if recent else level
        trend = min(max(level_recent / level, TREND_LIMITS[0]), TREND_LIMITS[1]) if level > 0 else 1.0
        same = [d for d in used if d.isoweekday() == target.isoweekday()]
        basis, base = ("weekday", same) if same else ("hour", used)
        for h in range(24):
            s = sum(occupancy(fence, d, h) for d in base) / len(base)
            result.forecast[fence, target, h] = Forecast(occupancy=s * trend, seasonal=s, trend=trend,
                                                         basis=basis, samples=len(base))
