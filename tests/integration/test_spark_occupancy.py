"""occupancy-analytics (spark_jobs/occupancy.py) against its pure-Python reference.

The generated event sets of tests/occupancy_events.py go into a clone of fence_event in a
schema of their own; the job runs in the session-wide local Spark session and its tables must
equal what spark_jobs/occupancy_reference.py computes from the same events: counts exactly,
floats within 1e-9. Also: a re-run replaces a day (same rows, none twice), day-by-day runs
(snapshot carry-in, gap replay, stored history) equal one pass, a day without data, and a run
that fails leaves the tables as they were. The numpy core alone (chunks included) is tested in
tests/unit/test_occupancy_core.py.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from typing import Any

import pytest

from deploy import spark_cmd
from deploy.settings import ConnectionSettings
from spark_jobs import occupancy
from spark_jobs.occupancy_reference import Event, compute, epoch
from spark_jobs.session import JobConfig
from tests.occupancy_events import DAYS, QUIET, assert_matches, generate

PG_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)




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




@pytest.fixture
def db(occupancy_db: Any) -> Any:
    return occupancy_db


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
    parser = argparse.ArgumentParser()  # as `geofence spark occupancy-analytics` runs it
    spark_cmd.add_arguments(parser, "occupancy-analytics")
    args = parser.parse_args(["--day", DAYS[1].isoformat(), "--schema", pg_schema, "--master", "local[2]"])
    assert await asyncio.to_thread(spark_cmd.run, args) == 0
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
