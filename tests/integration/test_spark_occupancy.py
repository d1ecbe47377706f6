"""occupancy-analytics (spark_jobs/occupancy.py) against its pure-Python reference.

Small generated event sets (several fences and objects over four days, the third without any
event, objects that never leave or stay across midnight, clocks ahead and behind, repeated
events, a leave without an enter, events at midnight and at one instant) go into a clone of
fence_event in a schema of their own; the job runs in the session-wide local Spark session
and its tables must equal what spark_jobs/occupancy_reference.py computes from the same
events: counts exactly, floats within 1e-9. Also: a re-run replaces a day (same rows, none
twice), day-by-day runs (snapshot carry-in, gap replay, stored history) equal one pass, a day
without data, and a run that fails leaves the tables as they were.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import random
from typing import Any

import asyncpg
import numpy as np
import pyarrow as pa
import pytest

from deploy.settings import ConnectionSettings
from spark_jobs import occupancy
from spark_jobs.occupancy_reference import Event, Result, compute, epoch
from spark_jobs.session import JobConfig

START = dt.date(2024, 3, 4)  # a Monday
DAYS = [START + dt.timedelta(days=i) for i in range(4)]
QUIET = DAYS[2]  # no event at all that day (objects stay inside across it)
FENCES = ("cafe", "shop", "park", "gate")
PG_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
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


async def insert(conn: Any, schema: str, events: list[Event]) -> None:
    rows = [(e.event_id, e.fence_id, e.object_id, e.event, "entered" if e.event == "enter" else "exited",
             e.ts, PG_EPOCH + dt.timedelta(microseconds=round(e.archived_at * 1e6))) for e in events]
    await conn.copy_records_to_table("fence_event", schema_name=schema, records=rows, columns=[
        "event_id", "fence_id", "object_id", "event", "reason", "ts", "archived_at"])


async def tables(conn: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every output table's rows (computed_at left out), sorted."""
    queries = {
        "hourly": "SELECT fence_id, day, hour, entries, exits, mean_occupancy, peak_occupancy, stays, "
                  "dwell_p50_s, dwell_p90_s FROM {}.occupancy_hourly",
        "open": "SELECT day, fence_id, object_ids FROM {}.occupancy_open",
        "day": "SELECT day, events, fences, open_at_end FROM {}.occupancy_day",
        "busiest": "SELECT as_of, fence_id, weekday, rank, hour, mean_occupancy, days "
                   "FROM {}.occupancy_busiest",
        "forecast": "SELECT fence_id, day, hour, occupancy, seasonal, trend, basis, samples "
                    "FROM {}.occupancy_forecast",
    }
    s = f'"{schema}"'
    return {k: sorted(tuple(r) for r in await conn.fetch(q.format(s))) for k, q in queries.items()}


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def assert_matches(got: dict[str, list[tuple[Any, ...]]], want: Result, days: list[dt.date],
                   seasonal: bool = True) -> None:
    """The job's rows of `days` equal the reference's."""
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


@pytest.fixture
async def db(stack: ConnectionSettings, pg_schema: str) -> Any:
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await occupancy.create_tables(conn, pg_schema)
        yield conn
    finally:
        await conn.close()


async def run(cfg: JobConfig, schema: str, last: dt.date, days: int = 1) -> occupancy.Summary:
    """The job in a thread of its own (it runs its own event loop for asyncpg)."""
    return await asyncio.to_thread(occupancy.run_job, cfg, occupancy.Window(last, days), schema,
                                   progress=lambda _: None)


async def test_one_pass_equals_the_reference_and_a_rerun_replaces(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    events = generate()
    await insert(db, pg_schema, events)
    want = compute(events, DAYS[0], DAYS[-1])
    assert any(e.t != e.ts for e in events) and want.days[QUIET].events == 0  # skew; a quiet day

    summary = await run(spark_config, pg_schema, DAYS[-1], len(DAYS))
    got = await tables(db, pg_schema)
    assert_matches(got, want, DAYS)
    window = {e.event_id for e in events if epoch(DAYS[0]) <= e.t < epoch(DAYS[-1]) + 86400}
    assert summary.events == len(window)
    assert summary.written["occupancy_hourly"] == len(got["hourly"]) == len(want.hourly)
    # the edge cases are there, as the reference has them
    assert (QUIET, "gate", "night") in want.open and (DAYS[-1], "cafe", "never") in want.open
    assert want.hourly["park", QUIET, 12].mean_occupancy == 1.0  # carried through the quiet day

    again = await run(spark_config, pg_schema, DAYS[-1], len(DAYS))
    assert await tables(db, pg_schema) == got
    assert again.written == summary.written
    for name in occupancy.OUTPUTS:
        assert await db.fetchval(f'SELECT count(*) FROM "{pg_schema}".{name}_stage') == 0


async def test_day_by_day_equals_one_pass_and_a_late_event_is_taken_by_a_rerun(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    events = generate(seed=11)
    await insert(db, pg_schema, events)
    want = compute(events, DAYS[0], DAYS[-1])

    await run(spark_config, pg_schema, DAYS[0])  # no earlier day: replays the events before it
    await run(spark_config, pg_schema, DAYS[2])  # a gap: Monday's snapshot plus Tuesday's events
    assert_matches(await tables(db, pg_schema), want, [DAYS[0], DAYS[2]], seasonal=False)
    for day in DAYS[1:]:  # in order: snapshot carry-in and stored history
        await run(spark_config, pg_schema, day)
    before = await tables(db, pg_schema)
    assert_matches(before, want, DAYS)

    at_nine = epoch(DAYS[1]) + 9 * 3600
    late = Event("late-leave", "park", "parked", "leave", at_nine, at_nine + 7)
    await insert(db, pg_schema, [late])
    parser = argparse.ArgumentParser()
    occupancy.add_arguments(parser, "occupancy-analytics")
    args = parser.parse_args(["--day", DAYS[1].isoformat(), "--schema", pg_schema, "--master", "local[2]"])
    assert await asyncio.to_thread(occupancy.run, args) == 0
    after = await tables(db, pg_schema)
    assert_matches(after, compute([*events, late], DAYS[0], DAYS[-1]), [DAYS[1]])
    for name, rows in before.items():  # the other days are as they were
        column = 1 if name in ("hourly", "forecast") else 0
        rerun = DAYS[2] if name == "forecast" else DAYS[1]  # the forecast made on DAYS[1]
        assert [r for r in rows if r[column] != rerun] == [r for r in after[name] if r[column] != rerun]
    assert len(after["hourly"]) == len(set((r[0], r[1], r[2]) for r in after["hourly"]))


async def test_a_day_without_data_and_a_failed_run(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    events = [e for e in generate(seed=3) if e.t >= epoch(DAYS[0]) and e.t < epoch(DAYS[1])
              and e.object_id.startswith("visitor")]  # Monday only, everyone leaves
    await insert(db, pg_schema, events)
    await run(spark_config, pg_schema, DAYS[0])
    summary = await run(spark_config, pg_schema, DAYS[1])
    assert summary.events == 0 and summary.written["occupancy_hourly"] == 0
    got = await tables(db, pg_schema)
    want = compute(events, DAYS[0], DAYS[1])
    assert_matches(got, want, DAYS[:2])
    assert [r for r in got["day"] if r[0] == DAYS[1]] == [(DAYS[1], 0, 0, 0)]
    tomorrow = {r[0] for r in got["forecast"] if r[1] == DAYS[2]}
    assert tomorrow == {e.fence_id for e in events}  # a forecast from Monday's history

    # new data, and a run that fails while staging its last table
    await db.execute(f'INSERT INTO "{pg_schema}".fence_event VALUES '
                     "('x', 'cafe', 'someone', 'enter', 'entered', $1, now())", epoch(DAYS[1]) + 60)
    await db.execute(f'ALTER TABLE "{pg_schema}".occupancy_forecast_stage ADD COLUMN boom int NOT NULL')
    with pytest.raises(Exception, match="boom"):
        await run(spark_config, pg_schema, DAYS[1])
    assert await tables(db, pg_schema) == got
    for name in occupancy.OUTPUTS:
        assert await db.fetchval(f'SELECT count(*) FROM "{pg_schema}".{name}_stage') == 0


def test_the_core_gives_the_same_rows_in_chunks() -> None:
    events = generate(seed=5)
    window = occupancy.Window(DAYS[-1], len(DAYS))
    plan = occupancy.Plan(window.w0, window.days)
    inside = [e for e in events if window.w0 <= e.t < window.w1]
    rows = pa.table({
        "fence_id": [e.fence_id for e in inside], "object_id": [e.object_id for e in inside],
        "kind": pa.array(np.zeros(len(inside)), pa.int16()), "enter": [e.event == "enter" for e in inside],
        "t": [e.t for e in inside], "ts": [e.ts for e in inside]})
    chunks = list(occupancy.fence_chunks(rows, plan, events=40))
    assert len(chunks) > 2 and sum(c.num_rows for c in chunks) == rows.num_rows

    def normal(table: pa.Table) -> list[tuple[Any, ...]]:
        rows = table.to_pylist()
        events = [0] * len(DAYS)  # the events of a day: one row per chunk, summed by the job
        for r in rows:
            if r["kind"] == occupancy.DAY_EVENTS:
                events[r["day"]] += r["events"]
        rest = (tuple(round(v, 9) if isinstance(v, float) else v for v in r.values())
                for r in rows if r["kind"] != occupancy.DAY_EVENTS)
        return [tuple(events), *sorted(rest, key=repr)]

    whole = occupancy.analyse(rows, plan)
    assert normal(pa.concat_tables([occupancy.analyse(c, plan) for c in chunks])) == normal(whole)
    assert {r["kind"] for r in whole.to_pylist()} == {occupancy.HOURLY, occupancy.OPEN, occupancy.DAY_EVENTS,
                                                     occupancy.BUSIEST, occupancy.FORECAST}


async def test_ids_with_quotes_commas_braces_and_newlines_survive_both_copies(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    """The events go out of PostgreSQL as CSV and the open rows back in as text[] literals in
    CSV: an id with the characters either format quotes comes back as it was."""
    odd = ['say "hi"', "a,b", "{braced}", "back\\slash", "two\nlines", "", "NULL", "  spaced "]
    t0 = epoch(DAYS[0]) + 8 * 3600
    fence = 'fence, "quoted"'
    events = [Event(f"e{i}", fence, obj, "enter", t0 + i, t0 + i + 1) for i, obj in enumerate(odd)]
    events.append(Event("e-out", fence, "a,b", "leave", t0 + 600, t0 + 601))
    await insert(db, pg_schema, events)
    summary = await run(spark_config, pg_schema, DAYS[0])
    assert summary.events == len(events)
    got = await tables(db, pg_schema)
    assert_matches(got, compute(events, DAYS[0], DAYS[0]), [DAYS[0]])
    assert got["open"] == [(DAYS[0], 'fence, "quoted"', sorted(o for o in odd if o != "a,b"))]


async def test_only_the_attempts_spark_kept_are_swapped_in(db: Any, pg_schema: str,
                                                           stack: ConnectionSettings) -> None:
    """A task that staged rows and then failed, retried as attempt 1: the swap takes attempt
    1's rows only, and the run's staged rows are gone afterwards."""
    window = occupancy.Window(DAYS[0], 1)
    s = f'"{pg_schema}"'
    for task, entries in (("0.0", 99), ("0.1", 3)):
        await db.execute(f"INSERT INTO {s}.occupancy_hourly_stage (run_id, task, fence_id, day, hour, "
                         "entries, exits, mean_occupancy, peak_occupancy, stays) "
                         "VALUES ('r1', $1, 'cafe', $2, 9, $3, 0, 0.5, 1, 1)", task, DAYS[0], entries)
    written = await asyncio.to_thread(lambda: asyncio.run(occupancy._swap(
        stack["postgres"]["dsn"], pg_schema, "r1", ["0.1"], window, {0: 3})))
    assert written["occupancy_hourly"] == 1
    assert [tuple(r) for r in await db.fetch(f"SELECT fence_id, entries FROM {s}.occupancy_hourly")] == \
        [("cafe", 3)]
    assert await db.fetchval(f"SELECT count(*) FROM {s}.occupancy_hourly_stage WHERE run_id = 'r1'") == 0
