"""The occupancy job's numpy core (spark_jobs/occupancy_core.py) on its own, without Spark or
PostgreSQL: the rows a task reads are built from the generated events of
tests/occupancy_events.py (the window's events, the objects carried in, the hourly history of
the computed days before), the core's output is put in the shape of the job's tables and must
equal what spark_jobs/occupancy_reference.py computes: in one pass, day by day (carry-in and
history), and whether a share is analysed whole or in chunks of fences.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from spark_jobs import occupancy_core as core
from spark_jobs.occupancy_reference import DAY_S, Event, compute, epoch
from tests.occupancy_events import DAYS, QUIET, assert_matches, generate

ROW_TYPES = {"fence_id": pa.string(), "object_id": pa.string(), "kind": pa.int16(), "enter": pa.bool_(),
             "t": pa.float64(), "ts": pa.float64()}  # the columns of the job's events_sql


def carried_in(events: list[Event], w0: float) -> set[tuple[str, str]]:
    """(fence, object) inside at w0: the last event before it decides (enters first at one instant)."""
    last: dict[tuple[str, str], tuple[tuple[float, float, bool], str]] = {}
    for e in events:
        key = (e.t, e.ts, e.event == "leave")
        if e.t < w0 and ((e.fence_id, e.object_id) not in last or key >= last[e.fence_id, e.object_id][0]):
            last[e.fence_id, e.object_id] = (key, e.event)
    return {k for k, (_, event) in last.items() if event == "enter"}


def core_rows(events: list[Event], first: dt.date, days: int, carried: set[tuple[str, str]],
              history: Sequence[tuple[str, dt.date, int, float]] = ()) -> pa.Table:
    """What a task reads for the window first .. first + days - 1: its events, the objects
    carried in and the hourly means (fence, day, hour, mean) of the computed days before."""
    w0, w1 = epoch(first), epoch(first) + days * DAY_S
    rows: list[tuple[str, str | None, int, bool | None, float, float]] = [
        (e.fence_id, e.object_id, core.EVENT, e.event == "enter", e.t, e.ts)
        for e in events if w0 <= e.t < w1]
    rows += [(f, o, core.CARRIED, True, -np.inf, -np.inf) for f, o in sorted(carried)]
    rows += [(f, None, core.HISTORY, None, float((d - first).days * 24 + h), m) for f, d, h, m in history]
    return pa.table({name: pa.array([r[i] for r in rows], t)
                     for i, (name, t) in enumerate(ROW_TYPES.items())})


# the job's tables: their columns, as the core's (a day offset becomes a date)
TABLES = {
    core.HOURLY: ("hourly", ("fence_id", "day", "hour", "entries", "exits", "mean_occupancy",
                             "peak_occupancy", "stays", "dwell_p50_s", "dwell_p90_s")),
    core.OPEN: ("open", ("day", "fence_id", "object_ids")),
    core.BUSIEST: ("busiest", ("day", "fence_id", "weekday", "rank", "hour", "mean_occupancy", "samples")),
    core.FORECAST: ("forecast", ("fence_id", "day", "hour", "mean_occupancy", "seasonal", "trend", "basis",
                                 "samples")),
}


def as_tables(out: pa.Table, first: dt.date, days: int) -> dict[str, list[tuple[Any, ...]]]:
    """The core's rows as the job's tables hold them (occupancy_day's fences and open_at_end
    counted from the hourly and open rows, as the swap does)."""
    got: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    events, fences, open_at_end = [0] * days, [set[str]() for _ in range(days)], [0] * days
    for r in out.to_pylist():
        d = r["day"]
        if r["kind"] == core.DAY_EVENTS:
            events[d] += r["events"]
            continue
        name, columns = TABLES[r["kind"]]
        got[name].append(tuple(first + dt.timedelta(days=r[c]) if c == "day" else r[c] for c in columns))
        if r["kind"] == core.HOURLY:
            fences[d].add(r["fence_id"])
        elif r["kind"] == core.OPEN:
            open_at_end[d] += len(r["object_ids"])
    got["day"] = [(first + dt.timedelta(days=d), events[d], len(fences[d]), open_at_end[d])
                  for d in range(days)]
    return {name: sorted(rows) for name, rows in got.items()}


def test_one_pass_equals_the_reference() -> None:
    events = generate()
    w0 = epoch(DAYS[0])
    want = compute(events, DAYS[0], DAYS[-1])
    assert any(e.t != e.ts for e in events) and want.days[QUIET].events == 0  # skew; a quiet day
    assert ("park", "parked") in carried_in(events, w0)  # inside before the window, never leaves

    rows = core_rows(events, DAYS[0], len(DAYS), carried_in(events, w0))
    out = core.analyse(rows, core.Plan(w0, len(DAYS)))
    got = as_tables(out, DAYS[0], len(DAYS))
    assert_matches(got, want, DAYS)
    assert len(got["hourly"]) == len(want.hourly)
    assert (QUIET, "gate", "night") in want.open and (DAYS[-1], "cafe", "never") in want.open
    assert want.hourly["park", QUIET, 12].mean_occupancy == 1.0  # carried through the quiet day


def test_day_by_day_with_the_carry_in_and_the_history_equals_the_reference() -> None:
    """Each day alone, as the job runs nightly: who was inside at the end of the day before
    carried in, the hourly means of the days before as history (a first day replays the
    events before it)."""
    events = generate(seed=11)
    want = compute(events, DAYS[0], DAYS[-1])
    carried = carried_in(events, epoch(DAYS[0]))
    history: list[tuple[str, dt.date, int, float]] = []
    for i, day in enumerate(DAYS):
        plan = core.Plan(epoch(day), 1, tuple(range(-i, 0)))
        got = as_tables(core.analyse(core_rows(events, day, 1, carried, history), plan), day, 1)
        assert_matches(got, want, [day])
        carried = {(f, o) for _, f, objects in got["open"] for o in objects}
        history += [(f, d, h, mean) for f, d, h, _, _, mean, *_ in got["hourly"]]
    assert ("cafe", "never") in carried and carried == {(f, o) for d, f, o in want.open if d == DAYS[-1]}


def test_the_core_gives_the_same_rows_in_chunks() -> None:
    events = generate(seed=5)
    w0, w1 = epoch(DAYS[0]), epoch(DAYS[-1]) + DAY_S
    plan = core.Plan(w0, len(DAYS))
    inside = [e for e in events if w0 <= e.t < w1]
    rows = pa.table({
        "fence_id": [e.fence_id for e in inside], "object_id": [e.object_id for e in inside],
        "kind": pa.array(np.zeros(len(inside)), pa.int16()), "enter": [e.event == "enter" for e in inside],
        "t": [e.t for e in inside], "ts": [e.ts for e in inside]})
    chunks = list(core.fence_chunks(rows, plan, events=40))
    assert len(chunks) > 2 and sum(c.num_rows for c in chunks) == rows.num_rows

    def normal(table: pa.Table) -> list[tuple[Any, ...]]:
        rows = table.to_pylist()
        events = [0] * len(DAYS)  # the events of a day: one row per chunk, summed by the job
        for r in rows:
            if r["kind"] == core.DAY_EVENTS:
                events[r["day"]] += r["events"]
        rest = (tuple(round(v, 9) if isinstance(v, float) else v for v in r.values())
                for r in rows if r["kind"] != core.DAY_EVENTS)
        return [tuple(events), *sorted(rest, key=repr)]

    whole = core.analyse(rows, plan)
    assert normal(pa.concat_tables([core.analyse(c, plan) for c in chunks])) == normal(whole)
    assert {r["kind"] for r in whole.to_pylist()} == {core.HOURLY, core.OPEN, core.DAY_EVENTS,
                                                     core.BUSIEST, core.FORECAST}
