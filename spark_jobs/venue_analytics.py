"""The venue part of occupancy-analytics: hives' sensor counts and phones, per business day and
local hour, "popular times" and tomorrow's forecast (deploy/migrations/0010_venue_analytics.sql;
the rules are in spark_jobs/venue_core.py).

spark_jobs/occupancy.py runs it after the fences, in the same Spark session and for the same
days, so the phones figure (occupancy_hourly of each hive's fence) is the one just computed. A
day that had not ended when it was computed (a hive east of UTC, or a run before the hive's
reset hour) is stored as 'open' and recomputed by the next run: the venue window reaches back
to the earliest open day of the week before.

Each Spark task takes a share of the hives (hashtext(hive id)), reads their counts, phones and
stored history on one connection, runs the core and stages its rows with COPY, tagged with its
attempt; the driver swaps the kept attempts' rows in, in one transaction (as the fence part:
a re-run replaces, a failed run leaves the tables as they were).

Trade-off: the task reads with plain queries (asyncpg's binary rows), not the COPY-into-Arrow
the fence part uses: a hive has a few hundred reports a day, so even 10,000 hives are a few
million small rows, and the per-hive core (Python around numpy) costs more than the read.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fence.venues.venue_store import counts_sql
from spark_jobs import venue_core as core
from spark_jobs.session import hash_predicates, run_tasks

OUTPUT_OF = {"venue_hourly": "hourly", "venue_day": "days", "venue_profile": "profile",
             "venue_forecast": "forecast"}  # table -> the core's Output field with its rows
TABLES = {  # stage and output columns, in the core's row order
    "venue_hourly": ("hive_id", "day", "hour", "entries", "exits", "mean_occupancy", "peak_occupancy",
                     "phones_mean", "phones_peak"),
    "venue_day": ("hive_id", "day", "reports", "entries", "exits", "residual", "correction", "factor",
                  "complete"),
    "venue_profile": ("hive_id", "weekday", "hour", "occupancy", "phones", "samples", "as_of"),
    "venue_forecast": ("hive_id", "day", "hour", "occupancy", "phones", "seasonal", "trend", "basis",
                       "samples"),
}
SUMMARY_DDL = "task string, hive_days long, counts long"
OPEN_LOOKBACK_DAYS = 7  # an 'open' day this far back is recomputed
SPAN_S = 3 * 86_400.0  # counts read around the window: any zone, any reset hour


@dataclass(frozen=True)
class VenueTask:
    """What every task of a run shares (pickled to the executors)."""

    dsn: str
    schema: str
    n: int  # tasks
    days: tuple[dt.date, ...]
    now: float
    run_id: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for batch in batches:
            for i in batch.column(0).to_pylist():
                tag = f"{i}.{ctx.attemptNumber() if ctx else 0}"
                hive_days, counts = asyncio.run(self.share(i, tag))
                yield pa.RecordBatch.from_pydict({"task": [tag], "hive_days": [hive_days],
                                                  "counts": [counts]})

    async def share(self, i: int, tag: str) -> tuple[int, int]:
        """Share i: read, analyse, stage; (hive days computed, counted instants read)."""
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            hives = await read_share(conn, self.schema, hash_predicates("h.id", self.n)[i], self.days)
            out = core.analyse(hives, self.days, self.now)
            for table, columns in TABLES.items():
                rows = getattr(out, OUTPUT_OF[table])
                if rows:
                    await conn.copy_records_to_table(f"{table}_stage", schema_name=self.schema,
                                                     columns=("run_id", "task", *columns),
                                                     records=[(self.run_id, tag, *r) for r in rows])
        finally:
            await conn.close()
        return len(out.days), sum(len(h.at) for h in hives)


async def read_share(conn: Any, schema: str, predicate: str, days: Sequence[dt.date]) -> list[core.HiveInput]:
    """The hives matching `predicate` (on h.id) with their counts around `days`, their fences'
    phones and their computed days of the lookback."""
    s = f'"{schema}"'
    first, last = days[0], days[-1]
    lo = dt.datetime.combine(first, dt.time(), dt.UTC) - dt.timedelta(seconds=SPAN_S)
    hi = dt.datetime.combine(last, dt.time(), dt.UTC) + dt.timedelta(seconds=SPAN_S)
    hives = await conn.fetch(f"SELECT h.id, h.tz, h.reset_hour, h.fence_id FROM {s}.hive h WHERE {predicate} "
                             "ORDER BY h.id")
    if not hives:
        return []
    counts = await conn.fetch(counts_sql(schema, predicate), lo, hi)
    phones = await conn.fetch(
        f"SELECT h.id, date_part('epoch', o.day::timestamp AT TIME ZONE 'UTC') + o.hour * 3600 AS t, "
        f"o.mean_occupancy, o.peak_occupancy FROM {s}.occupancy_hourly o "
        f"JOIN {s}.hive h ON h.fence_id = o.fence_id WHERE {predicate} AND o.day BETWEEN $1 AND $2",
        first - dt.timedelta(days=2), last + dt.timedelta(days=2))
    since = first - dt.timedelta(days=core.LOOKBACK_DAYS - 1)
    history = await conn.fetch(
        f"SELECT h.id, v.day, v.hour, v.mean_occupancy, v.phones_mean FROM {s}.venue_hourly v "
        f"JOIN {s}.venue_day d ON d.hive_id = v.hive_id AND d.day = v.day "
        f"JOIN {s}.hive h ON h.id = v.hive_id "
        f"WHERE {predicate} AND v.day >= $1 AND v.day < $2", since, first)
    return build_inputs(hives, counts, phones, history)


def build_inputs(hives: Sequence[Any], counts: Sequence[Any], phones: Sequence[Any], history: Sequence[Any]
                 ) -> list[core.HiveInput]:
    """The core's inputs from the rows of read_share's queries."""
    by_hive: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for r in counts:
        by_hive[r[0]].append((float(r[1]), int(r[2]), int(r[3])))
    phones_of: dict[str, dict[float, tuple[float, int]]] = defaultdict(dict)
    for r in phones:
        phones_of[r[0]][float(r[1])] = (float(r[2]), int(r[3]))
    past: dict[str, dict[dt.date, tuple[np.ndarray, np.ndarray]]] = defaultdict(dict)
    has_phones: dict[tuple[str, dt.date], bool] = {}
    for r in history:
        sensors, ph = past[r[0]].setdefault(r[1], (np.zeros(24), np.zeros(24)))
        sensors[r[2]] = r[3]
        if r[4] is not None:
            ph[r[2]] = r[4]
            has_phones[r[0], r[1]] = True
    out = []
    for h in hives:
        rows = by_hive.get(h[0], [])
        a = np.array(rows, dtype=np.float64).reshape(-1, 3)
        hist = {d: (m, ph if has_phones.get((h[0], d)) else None)
                for d, (m, ph) in past.get(h[0], {}).items()}
        out.append(core.HiveInput(h[0], h[1], int(h[2]), h[3] is not None, a[:, 0],
                                  a[:, 1].astype(np.int64), a[:, 2].astype(np.int64),
                                  phones_of.get(h[0], {}), hist))
    return out


# ---------------------------------------------------------------- the driver's side


async def open_days(dsn: str, schema: str, first: dt.date) -> dt.date | None:
    """The earliest 'open' day of the week before `first` (recomputed with the run)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for table in TABLES:  # staged rows of a run that died
            await conn.execute(f'DELETE FROM "{schema}".{table}_stage WHERE staged_at < now() - interval '
                               "'1 day'")
        day: dt.date | None = await conn.fetchval(
            f'SELECT min(day) FROM "{schema}".venue_day WHERE NOT complete AND day >= $1 AND day < $2',
            first - dt.timedelta(days=OPEN_LOOKBACK_DAYS), first)
        return day
    finally:
        await conn.close()


async def swap(dsn: str, schema: str, run_id: str, tags: list[str], days: Sequence[dt.date]
               ) -> dict[str, int]:
    """The kept attempts' rows replace the days' rows (the forecasts of the day after each, the
    profiles as of a later day kept), in one transaction."""
    import asyncpg

    s = f'"{schema}"'
    first, last = days[0], days[-1]
    one = dt.timedelta(days=1)
    written: dict[str, int] = {}
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"venue-analytics {schema}")
            for table, lo, hi in (("venue_hourly", first, last), ("venue_day", first, last),
                                  ("venue_forecast", first + one, last + one)):
                columns = ", ".join(TABLES[table]) + (", run_id" if table == "venue_day" else "")
                await conn.execute(f"DELETE FROM {s}.{table} WHERE day BETWEEN $1 AND $2", lo, hi)
                status = await conn.execute(
                    f"INSERT INTO {s}.{table} ({columns}, computed_at) SELECT {columns}, now() FROM "
                    f"{s}.{table}_stage WHERE run_id = $1 AND task = ANY($2::text[])", run_id, tags)
                written[table] = int(status.split()[-1])
            columns = ", ".join(TABLES["venue_profile"])
            status = await conn.execute(
                f"INSERT INTO {s}.venue_profile AS p ({columns}) SELECT {columns} "
                f"FROM {s}.venue_profile_stage WHERE run_id = $1 AND task = ANY($2::text[]) "
                "ON CONFLICT (hive_id, weekday, hour) DO UPDATE "
                "SET occupancy = excluded.occupancy, phones = excluded.phones, samples = excluded.samples, "
                "as_of = excluded.as_of, computed_at = now() WHERE excluded.as_of >= p.as_of", run_id, tags)
            written["venue_profile"] = int(status.split()[-1])
            await unstage(conn, schema, run_id)
    finally:
        await conn.close()
    return written


async def unstage(conn: Any, schema: str, run_id: str) -> None:
    for table in TABLES:
        await conn.execute(f'DELETE FROM "{schema}".{table}_stage WHERE run_id = $1', run_id)


@dataclass
class VenueSummary:
    days: tuple[dt.date, ...] = ()
    hive_days: int = 0
    counts: int = 0
    written: dict[str, int] | None = None

    def line(self) -> str:
        if not self.days:
            return "venues: nothing to compute"
        w = self.written or {}
        return (f"venues {self.days[0]}..{self.days[-1]}: {self.counts:,} counted instants, "
                f"{self.hive_days:,} hive days ({', '.join(f'{k} {v:,}' for k, v in w.items())})")


def run(spark: Any, dsn: str, schema: str, first: dt.date, last: dt.date, n: int, run_id: str,
        progress: Callable[[str], None], now: float | None = None) -> VenueSummary:
    """The venue days first..last (reaching back to an open day) on `spark`, swapped in."""
    import time

    now = time.time() if now is None else now
    reopen = asyncio.run(open_days(dsn, schema, first))
    if reopen is not None and reopen < first:
        progress(f"venues: recomputing from {reopen}, a day that had not ended when it was computed")
        first = reopen
    days = tuple(first + dt.timedelta(days=i) for i in range((last - first).days + 1))
    task = VenueTask(dsn, schema, n, days, now, run_id)
    summary = VenueSummary(days)
    try:
        progress(f"venues: reading, analysing and staging the hives ({n} tasks, each a share of them)")
        done, tags = run_tasks(spark, n, task, SUMMARY_DDL, "venue")
        summary.hive_days = sum(int(r["hive_days"]) for r in done)
        summary.counts = sum(int(r["counts"]) for r in done)
        summary.written = asyncio.run(swap(dsn, schema, run_id, tags, days))
    finally:
        asyncio.run(_unstage(dsn, schema, run_id))
    return summary


async def _unstage(dsn: str, schema: str, run_id: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await unstage(conn, schema, run_id)
    finally:
        await conn.close()
