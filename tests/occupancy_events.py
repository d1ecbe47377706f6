"""Generated occupancy events and the comparison with the reference, shared by the unit tests
of the numpy core (tests/unit/test_occupancy_core.py) and the job's integration tests
(tests/integration/test_spark_occupancy.py): the same seed gives the same events.

Several fences and objects over four days, the third without any event, objects that never
leave or stay across midnight, clocks ahead and behind, repeated events, a leave without an
enter, events at midnight and at one instant. Rows are compared in the shape of the job's
tables: counts exactly, floats within 1e-9.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

from spark_jobs.occupancy_reference import Event, Result, epoch

START = dt.date(2024, 3, 4)  # a Monday
DAYS = [START + dt.timedelta(days=i) for i in range(4)]
QUIET = DAYS[2]  # no event at all that day (objects stay inside across it)
FENCES = ("cafe", "shop", "park", "gate")
TOLERANCE = 1e-9


def generate(seed: int = 7) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []

    def add(kind: str, fence: str, obj: str, true_t: float, skew: float = 0.0) -> None:
        # archived_at a little after the truth, in whole microseconds as PostgreSQL keeps it
        archived_us = round((true_t + rng.uniform(0.2, 3.0)) * 1e6)
        events.append(Event(f"{obj}-{len(events):05d}", fence, obj, kind, true_t + skew, archived_us / 1e6))

    for i in range(12):
        obj = f"visitor-{i:02d}"
        skew = {0: 7200.0, 1: -300.0}.get(i, 0.0)  # a clock 2 h ahead, one 5 min behind
        for day in DAYS:
            if day == QUIET:
                continue
            t, end = epoch(day) + rng.uniform(6, 9) * 3600, epoch(day) + 22 * 3600
            for _ in range(rng.randint(2, 5)):
                fence, dwell = rng.choice(FENCES), rng.expovariate(1 / 1800) + 30
                if t + dwell > end:
                    break
                add("enter", fence, obj, t, skew)
                add("leave", fence, obj, t + dwell, skew)
                t += dwell + rng.uniform(60, 5400)
    day0, day1, day3 = (epoch(d) for d in (DAYS[0], DAYS[1], DAYS[3]))
    add("enter", "park", "parked", day0 - 4 * 3600)  # before the window, never leaves
    add("enter", "gate", "night", day1 + 23.5 * 3600)  # across the quiet day
    add("leave", "gate", "night", day3 + 3600)
    add("enter", "cafe", "never", day3 + 22 * 3600)  # still inside at the window's end
    add("leave", "shop", "ghost", day0 + 12 * 3600)  # a leave without an enter
    add("enter", "cafe", "midnight", day1 - 600)  # leaves at 00:00:00 the next day
    add("leave", "cafe", "midnight", day1)
    add("enter", "shop", "instant", day0 + 15 * 3600)  # an enter and a leave at one instant
    add("leave", "shop", "instant", day0 + 15 * 3600)
    first_visit = next(e for e in events if e.object_id == "visitor-05" and e.event == "enter")
    events.append(Event("repeat-enter", first_visit.fence_id, first_visit.object_id, "enter",
                        first_visit.ts, first_visit.archived_at + 0.5))  # redelivered under a new id
    return events


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def assert_matches(got: dict[str, list[tuple[Any, ...]]], want: Result, days: list[dt.date],
                   seasonal: bool = True) -> None:
    """The job's rows of `days` (per table, as the job's tables hold them) equal the reference's."""
    hourly = {(f, d, h): rest for f, d, h, *rest in got["hourly"] if d in days}
    expected = {k: v for k, v in want.hourly.items() if k[1] in days}
    assert hourly.keys() == expected.keys()
    for key, (entries, exits, mean, peak, stays, p50, p90) in hourly.items():
        w = expected[key]
        assert (entries, exits, peak, stays) == (w.entries, w.exits, w.peak_occupancy, w.stays), key
        assert close(mean, w.mean_occupancy) and close(p50, w.dwell_p50_s) and close(p90, w.dwell_p90_s), key
    opened = {(d, f, o) for d, f, objects in got["open"] if d in days for o in objects}
    assert opened == {o for o in want.open if o[0] in days}
    assert all(objects == sorted(objects) for _, _, objects in got["open"])
    assert {d: rest for d, *rest in got["day"] if d in days} == {
        d: [s.events, s.fences, s.open_at_end] for d, s in want.days.items() if d in days}
    if not seasonal:
        return
    busiest = {(a, f, w, r): rest for a, f, w, r, *rest in got["busiest"] if a in days}
    assert busiest.keys() == {k for k in want.busiest if k[0] in days}
    for ranked, (hour, mean, n) in busiest.items():
        b = want.busiest[ranked]
        assert hour == b.hour and n == b.days and close(mean, b.mean_occupancy), ranked
    targets = [d + dt.timedelta(days=1) for d in days]
    forecast = {(f, d, h): rest for f, d, h, *rest in got["forecast"] if d in targets}
    assert forecast.keys() == {k for k in want.forecast if k[1] in targets}
    for at, (occ, seasonal_, trend, basis, samples) in forecast.items():
        f = want.forecast[at]
        assert (basis, samples) == (f.basis, f.samples), at
        assert close(occ, f.occupancy) and close(seasonal_, f.seasonal) and close(trend, f.trend), at
