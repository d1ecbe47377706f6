"""The venue part of occupancy-analytics (spark_jobs/venue_analytics.py) on real PostgreSQL and
local Spark.

Hives with sensors' reports and v2 event reports go into a schema of their own (with the fence
part's tables); the job's venue tables must hold what the core (spark_jobs/venue_core.py, its
rules checked second by second in tests/unit/test_venue_core.py) computes from the same counts,
the phones figure must be the fence part's occupancy of the hive's fence, a re-run replaces,
and a day stored as 'open' is recomputed by the next run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import numpy as np
import pytest

from spark_jobs import occupancy, venue_analytics
from spark_jobs import venue_core as core
from spark_jobs.session import JobConfig

DAYS = [dt.date(2026, 3, 27) + dt.timedelta(days=i) for i in range(3)]  # Fri..Sun, DST on Sunday
T0 = dt.datetime(2026, 3, 26, tzinfo=dt.UTC)
HIVES = {"bar-utc": ("UTC", 4, None), "cafe-vaduz": ("Europe/Vaduz", 4, "cafe-fence")}


@pytest.fixture
def db(occupancy_db: Any) -> Any:
    return occupancy_db


def ts(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


async def fill(conn: Any, schema: str, seed: int = 5) -> dict[str, list[tuple[float, int, int]]]:
    """Two hives, a sensor each, four days of reports (every 15 min, some counts) and v2 event
    reports; phones entering and leaving the Vaduz hive's fence. The counts per hive."""
    s = f'"{schema}"'
    rng = np.random.default_rng(seed)
    counts: dict[str, list[tuple[float, int, int]]] = {h: [] for h in HIVES}
    for hive_id, (tz, reset, fence) in HIVES.items():
        await conn.execute(f"INSERT INTO {s}.hive (id, name, type, lon, lat, tz, reset_hour, fence_id) "
                           "VALUES ($1, $1, 'bar', 9.5, 47.1, $2, $3, $4)", hive_id, tz, reset, fence)
        await conn.execute(f"INSERT INTO {s}.sensor (id, hive_id) VALUES ($1, $2)", f"s-{hive_id}", hive_id)
        reports, events = [], []
        for k in range(4 * 96):
            at = k * 900.0 + 450
            e, x = (int(v) for v in rng.integers(0, 5, 2)) if rng.random() < 0.6 else (0, 0)
            reports.append((f"s-{hive_id}", ts(at), ts(at + 3), ts(at), 2, 0, k, 0, 0, e, x, "increase", 0, 0,
                            False, False, b"\x00"))
            counts[hive_id].append((at, e, x))
            if rng.random() < 0.2:
                kind = int(rng.integers(0, 2))
                events.append((f"s-{hive_id}", int(T0.timestamp() + at + 60), 0, kind, 1000, ts(at + 60),
                               ts(at + 61)))
                counts[hive_id].append((at + 60, kind, 1 - kind))
        await conn.copy_records_to_table("sensor_report", schema_name=schema, records=reports, columns=[
            "sensor_id", "device_at", "received_at", "at", "version", "report_type", "counter", "total_in",
            "total_out", "entries", "exits", "rule", "gap", "lost_reports", "unknowable", "skewed", "raw"])
        await conn.copy_records_to_table("sensor_event", schema_name=schema, records=events, columns=[
            "sensor_id", "device_ts", "slot", "event_type", "distance_mm", "at", "received_at"])
    phones = []
    for i in range(40):
        enter = float(rng.uniform(0, 4 * 86_400 - 7200))
        phones += [(f"p{i}-in", "cafe-fence", f"phone{i}", "enter", "entered", T0.timestamp() + enter,
                    ts(enter + 1)),
                   (f"p{i}-out", "cafe-fence", f"phone{i}", "leave", "exited",
                    T0.timestamp() + enter + float(rng.uniform(600, 7000)), ts(enter + 7001))]
    await conn.copy_records_to_table("fence_event", schema_name=schema, records=phones, columns=[
        "event_id", "fence_id", "object_id", "event", "reason", "ts", "archived_at"])
    return counts


async def venue_tables(conn: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    s = f'"{schema}"'
    return {table: sorted(tuple(r) for r in await conn.fetch(f"SELECT {', '.join(columns)} FROM {s}.{table}"))
            for table, columns in venue_analytics.TABLES.items()}


def rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(round(v, 9) if isinstance(v, float) else v for v in r) for r in rows)


async def run(cfg: JobConfig, schema: str, last: dt.date, days: int = 1) -> occupancy.Summary:
    return await asyncio.to_thread(occupancy.run_job, cfg, occupancy.Window(last, days), schema,
                                   progress=lambda _: None)


async def test_the_job_stores_what_the_core_computes_with_the_phones_beside(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    counts = await fill(db, pg_schema)
    summary = await run(spark_config, pg_schema, DAYS[-1], len(DAYS))
    assert summary.venues is not None and summary.venues.hive_days == 2 * len(DAYS)
    got = await venue_tables(db, pg_schema)

    inputs = []
    for hive_id, (tz, reset, fence) in HIVES.items():
        a = np.array(counts[hive_id], np.float64)
        inputs.append(core.HiveInput(hive_id, tz, reset, fence is not None, T0.timestamp() + a[:, 0],
                                     a[:, 1].astype(np.int64), a[:, 2].astype(np.int64)))
    want = core.analyse(inputs, DAYS, now=1e12)
    assert rounded([r[:7] for r in got["venue_hourly"]]) == rounded([r[:7] for r in want.hourly])
    assert rounded(got["venue_day"]) == rounded(want.days)
    assert all(r[-1] for r in got["venue_day"])  # the days have ended: complete, corrected
    # 23 hours on the Vaduz hive's Saturday business day (clocks forward at 02:00 on Sunday)
    assert sum(1 for r in got["venue_hourly"] if r[0] == "cafe-vaduz" and r[1] == DAYS[1]) == 23
    assert summary.venues.written == {k: len(v) for k, v in got.items()}

    # phones: the fence part's occupancy of cafe-fence, by the UTC hour the local hour begins in
    s = f'"{pg_schema}"'
    fence_hours = {(r["day"], r["hour"]): (r["mean_occupancy"], r["peak_occupancy"]) for r in await db.fetch(
        f"SELECT day, hour, mean_occupancy, peak_occupancy FROM {s}.occupancy_hourly "
        "WHERE fence_id = 'cafe-fence'")}
    seen = 0
    for r in got["venue_hourly"]:
        if r[0] == "bar-utc":
            assert r[7] is None and r[8] is None  # no fence
            continue
        edges, labels = core.slots(r[1], "Europe/Vaduz", 4)
        utc = dt.datetime.fromtimestamp(float(edges[list(labels).index(r[2])]), dt.UTC)
        mean, peak = fence_hours.get((utc.date(), utc.hour), (0.0, 0))
        assert (r[7], r[8]) == (pytest.approx(mean), peak)
        seen += peak > 0
    assert seen > 10
    assert {r[0] for r in got["venue_forecast"]} == set(HIVES)
    assert {r[1] for r in got["venue_forecast"]} == {d + dt.timedelta(days=1) for d in DAYS}
    assert {(r[0], r[6]) for r in got["venue_profile"]} == {(h, DAYS[-1]) for h in HIVES}

    again = await run(spark_config, pg_schema, DAYS[-1], len(DAYS))  # a re-run replaces
    assert await venue_tables(db, pg_schema) == got
    assert again.venues is not None and again.venues.written == summary.venues.written
    for table in venue_analytics.TABLES:
        assert await db.fetchval(f"SELECT count(*) FROM {s}.{table}_stage") == 0


async def test_an_open_day_is_recomputed_and_an_older_profile_does_not_replace_a_newer(
        spark: object, spark_config: JobConfig, db: Any, pg_schema: str) -> None:
    await fill(db, pg_schema, seed=9)
    s = f'"{pg_schema}"'
    await run(spark_config, pg_schema, DAYS[0])
    await db.execute(f"UPDATE {s}.venue_day SET complete = false, correction = 'open' WHERE day = $1",
                     DAYS[0])
    summary = await run(spark_config, pg_schema, DAYS[1])
    assert summary.venues is not None and summary.venues.days == (DAYS[0], DAYS[1])
    rows = await db.fetch(f"SELECT complete, correction FROM {s}.venue_day WHERE day = $1", DAYS[0])
    assert len(rows) == 2 and all(r["complete"] and r["correction"] != "open" for r in rows)
    assert await db.fetchval(f"SELECT min(as_of) FROM {s}.venue_profile") == DAYS[1]
    await run(spark_config, pg_schema, DAYS[0])  # an older day again: the profile as of DAYS[1] stays
    assert await db.fetchval(f"SELECT min(as_of) FROM {s}.venue_profile") == DAYS[1]
    # the Friday and Saturday history feeds Sunday's run: forecast basis and samples
    await run(spark_config, pg_schema, DAYS[2])
    rows = await db.fetch(f"SELECT DISTINCT basis, samples FROM {s}.venue_forecast WHERE day = $1",
                          DAYS[2] + dt.timedelta(days=1))
    assert [(r["basis"], r["samples"]) for r in rows] == [("hour", 3)]
