"""occupancy-analytics: the nightly job turning fence_event into hourly occupancy per fence.

    spark-submit --jars /usr/share/java/postgresql.jar spark_jobs/occupancy.py [--day D] [--days N]
    geofence spark occupancy-analytics [--day D] [--days N] [--master M] [--schema S] [--partitions P]

Then the venues (spark_jobs/venue_analytics.py): per hive, business day and local hour the
sensors' counts and occupancy beside the phones', "popular times" and tomorrow's forecast.

For each UTC day of the window (the N days ending at --day, default yesterday) and each fence:
per hour the entries, exits, time-weighted mean and peak occupancy, stays and their dwell p50 /
p90 (occupancy_hourly) and the objects still inside at the day's end (occupancy_open); as of
each day the three busiest hours per weekday (occupancy_busiest) and the forecast of the next
day (occupancy_forecast). spark_jobs/occupancy_reference.py computes the same from a list of
events in plain loops; the tests hold the two equal.

Rules (the reference follows them too):
- Clock skew. A device's clock may be off. An event's effective time is t = min(ts,
  archived_at): a device cannot report from the future, so a clock running ahead is clamped to
  the moment the archiver stored the event. A clock running behind cannot be told from a late
  delivery and is trusted. Events of one (fence, object) are taken in (t, ts) order, so events
  clamped to one archiving instant keep the device's own order; at one (t, ts) the enters come
  first (an enter and a leave at one instant: a stay of zero length, not a phantom object left
  inside). Events equal in (t, ts, kind) give the same result in any order, so the outcome is
  the same on every run and event_id need not be read.
- Sequences. After an event an object is inside iff the event is an enter, whatever came
  before: a repeated enter or a leave without an enter changes nothing and is not counted as an
  entry / exit (both still make the fence active that day). A stay is [enter, leave).
- Days. A stay is cut at midnight: each day counts its part as a stay of its own, beginning at
  00:00 for a stay carried in. A stay never closed ends at the window's end. Who is inside at
  a day's end is stored (occupancy_open), so the next day's run starts from it instead of
  re-reading older events; a first run, or one after a gap, replays the older events.
- Per hour: entries / exits by the event's t; stays and dwell by the hour the part begins;
  mean occupancy = the parts' overlap with the hour / 3,600 s; peak = the most parts covering
  one instant ([start, end): a leave and an enter at one instant do not overlap). Every hour
  of a (fence, day) with an event or a part gets a row, zeros included. Percentiles are exact,
  linear between the nearest ranks (as Spark's `percentile`).
- As of day a, over the computed days (occupancy_day) among the 28 ending at a, a fence without
  a row on one of them counting zero: busiest = per ISO weekday the mean occupancy of each hour,
  the top 3 above zero (ranked at 1e-9, ties to the earlier hour). Forecast of a + 1, hour h:
  seasonal(h) = the mean of h over the computed days of a + 1's weekday, i.e. that weekday in
  the last 4 weeks (basis 'weekday'), or over all computed days if there is none (basis
  'hour'); trend = (mean occupancy of the last 7 days) / (mean of the 28), clamped to [0.5, 2],
  1 if the 28 days were empty; occupancy = seasonal(h) * trend. Every fence with a row in the
  28 days gets a forecast, also after a day without events.
- Idempotent per day: each task stages its rows in the *_stage tables (COPY, keyed by the run
  id and the task's attempt); then one transaction (under an advisory lock) deletes the
  window's days from every output table, inserts the staged rows of the attempts Spark kept
  and deletes the run's staged rows. A re-run replaces, a failed run leaves the tables as they
  were, a failed or speculative attempt adds nothing. Re-running a day does not recompute the
  later days that carried its stays in: give --days to cover them.

This module is the shell: the window, the SQL, Spark's tasks and PostgreSQL. What happens
per event or per fence is the pure numpy core in spark_jobs/occupancy_core.py.

Trade-off: everything per event or per fence happens in one numpy core per task (all the
task's fences at once, sorted and swept with array operations, no Python call per fence or
per row), and each task moves its own data: it reads its share of the fences
(hashtext(fence_id) predicate) with one COPY ... (FORMAT csv) straight into Arrow, with the
fences' hourly history riding along, analyses it and stages its output with COPY. Spark
schedules the tasks (in parallel, retried, on any cluster whose executors reach PostgreSQL)
and nothing crosses the JVM but a few counts. Measured on local[2], 10M events: through JDBC
and Spark's Arrow conversion into Python 9.3 s, by COPY 7.8 s; the JDBC stage of the output
(854k rows) took 4.3 s, the tasks' COPY a fraction of a second each. The price: every task's
query scans the window's blocks (BRIN) for its share, and a task must fit a Python worker's
memory (raise --partitions as the data grows). The core works in chunks of ~1M events, as it
is bound by memory access.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import io
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

if __package__ in (None, ""):  # spark-submit spark_jobs/occupancy.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exchanges.settings import ConfigError
from spark_jobs import occupancy_core as core
from spark_jobs import venue_analytics
from spark_jobs.occupancy_reference import DAY_S, LOOKBACK_DAYS, epoch
from spark_jobs.session import (
    JobConfig,
    check_schema,
    clone_schema,
    hash_predicates,
    partitions,
    run_tasks,
    spark_session,
)
from spark_jobs.stage_progress import StageBars

APP_NAME = "geofence-occupancy-analytics"
MIGRATIONS = ("0005_occupancy.sql", "0007_occupancy_stage_task.sql", "0010_venue_analytics.sql")
VENUE_INPUTS = ("hive", "sensor", "sensor_report", "sensor_event")  # the venue part's (public's) tables
OUTPUTS = ("occupancy_hourly", "occupancy_open", "occupancy_busiest", "occupancy_forecast")
STALE_STAGE = "1 day"  # staged rows of a run that died are removed after this

Progress = Callable[[str], None]


def _say(text: str) -> None:
    print(f"occupancy-analytics: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the window


@dataclass(frozen=True)
class Window:
    """The UTC days last - days + 1 .. last."""

    last: dt.date
    days: int = 1

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ConfigError("--days must be at least 1")

    @property
    def first(self) -> dt.date:
        return self.last - dt.timedelta(days=self.days - 1)

    @property
    def dates(self) -> list[dt.date]:
        return [self.first + dt.timedelta(days=i) for i in range(self.days)]

    @property
    def w0(self) -> float:
        return epoch(self.first)

    @property
    def w1(self) -> float:
        return epoch(self.last) + DAY_S


# ---------------------------------------------------------------- a task (in an executor)

EVENT_TYPES = {"fence_id": pa.string(), "object_id": pa.string(), "kind": pa.int16(), "enter": pa.bool_(),
               "t": pa.float64(), "ts": pa.float64()}  # events_sql's columns
SUMMARY_DDL = "task string, day int, events long"
# stage table: (core row kind, [(stage column, core column)]); "day" is the core's day offset
STAGE = {
    "occupancy_hourly": (core.HOURLY, [("fence_id", "fence_id"), ("day", "day"), ("hour", "hour"),
                                  ("entries", "entries"), ("exits", "exits"),
                                  ("mean_occupancy", "mean_occupancy"), ("peak_occupancy", "peak_occupancy"),
                                  ("stays", "stays"), ("dwell_p50_s", "dwell_p50_s"),
                                  ("dwell_p90_s", "dwell_p90_s")]),
    "occupancy_open": (core.OPEN, [("day", "day"), ("fence_id", "fence_id"), ("object_ids", "object_ids")]),
    "occupancy_busiest": (core.BUSIEST, [("as_of", "day"), ("fence_id", "fence_id"), ("weekday", "weekday"),
                                    ("rank", "rank"), ("hour", "hour"), ("mean_occupancy", "mean_occupancy"),
                                    ("days", "samples")]),
    "occupancy_forecast": (core.FORECAST, [("fence_id", "fence_id"), ("day", "day"), ("hour", "hour"),
                                      ("occupancy", "mean_occupancy"), ("seasonal", "seasonal"),
                                      ("trend", "trend"), ("basis", "basis"), ("samples", "samples")]),
}


def parse_events(data: bytes) -> pa.Table:
    """events_sql's rows as PostgreSQL's COPY ... (FORMAT csv) writes them: an unquoted empty
    field is NULL, a quoted one an empty string; floats are exact (shortest round trip)."""
    if not data:
        return pa.table({k: pa.array([], t) for k, t in EVENT_TYPES.items()})
    return pcsv.read_csv(
        pa.BufferReader(pa.py_buffer(data)),
        read_options=pcsv.ReadOptions(column_names=list(EVENT_TYPES)),
        parse_options=pcsv.ParseOptions(newlines_in_values=True),
        convert_options=pcsv.ConvertOptions(column_types=EVENT_TYPES, true_values=["t"], false_values=["f"],
                                            null_values=[""], strings_can_be_null=True,
                                            quoted_strings_can_be_null=False))


def pg_text_arrays(lists: pa.Array) -> pa.Array:
    """list<string> as PostgreSQL text[] literals ({"a","b \\"q\\""}), every element quoted."""
    lists = lists.cast(pa.list_(pa.string()))
    values = pc.replace_substring(pc.replace_substring(lists.flatten(), "\\", "\\\\"), '"', '\\"')
    offsets = pc.subtract(lists.offsets, lists.offsets[0])  # values() of a slice start at 0
    quoted = pa.ListArray.from_arrays(offsets, values)
    joined = pc.binary_join_element_wise(pa.scalar('{"'), pc.binary_join(quoted, '","'), pa.scalar('"}'), "")
    empty = pc.equal(pc.list_value_length(lists), 0)
    return pc.if_else(empty, pa.scalar("{}"), joined)


def stage_csv(out: pa.Table, table: str, first: dt.date, run_id: str, task: str) -> tuple[list[str], bytes]:
    """A core output's rows of one stage table, as its COPY columns and CSV."""
    kind, columns = STAGE[table]
    rows = out.filter(pc.equal(out.column("kind"), kind))
    n = rows.num_rows
    arrays: dict[str, pa.Array] = {"run_id": pa.array([run_id] * n, pa.string()),
                                   "task": pa.array([task] * n, pa.string())}
    offset = (first - dt.date(1970, 1, 1)).days
    for name, source in columns:
        column = rows.column(source).combine_chunks()
        if source == "day":
            column = pc.add(column, offset).cast(pa.int32()).cast(pa.date32())
        elif source == "object_ids":
            column = pg_text_arrays(column)
        arrays[name] = column
    buf = pa.BufferOutputStream()
    pcsv.write_csv(pa.table(arrays), buf, pcsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    return list(arrays), buf.getvalue().to_pybytes()


@dataclass(frozen=True)
class Task:
    """What every task of a run shares (pickled to the executors)."""

    dsn: str
    schema: str
    sql: str  # events_sql of the window
    predicates: tuple[str, ...]  # one per partition
    plan: core.Plan
    first: dt.date
    run_id: str

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """mapInArrow's function: for each partition number in, its fences read (COPY),
        analysed in chunks and staged (COPY, tagged with this attempt); out: the events per
        day and the tag."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for batch in batches:
            for i in batch.column(0).to_pylist():
                tag = f"{i}.{ctx.attemptNumber() if ctx else 0}"
                events = asyncio.run(self.share(i, tag))
                yield pa.RecordBatch.from_pydict({"task": [tag] * self.plan.days,
                                                  "day": np.arange(self.plan.days, dtype=np.int32),
                                                  "events": events})

    async def share(self, i: int, tag: str) -> np.ndarray:
        """Partition i on one connection: read (COPY out), analyse, stage (COPY in); the
        window's events per day."""
        import asyncpg

        chunks: list[bytes] = []

        async def sink(data: bytes) -> None:
            chunks.append(data)

        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.copy_from_query(f"SELECT * FROM ({self.sql}) AS q WHERE {self.predicates[i]}",
                                       output=sink, format="csv")
            rows = parse_events(b"".join(chunks))
            chunks.clear()
            outs = [core.analyse(part, self.plan) for part in core.fence_chunks(rows, self.plan)] \
                if rows.num_rows else []
            out = pa.concat_tables(outs) if outs else core.core_table(0)
            for table in STAGE:
                columns, data = stage_csv(out, table, self.first, self.run_id, tag)
                if data:
                    await conn.copy_to_table(f"{table}_stage", schema_name=self.schema,
                                             source=io.BytesIO(data), columns=columns, format="csv")
        finally:
            await conn.close()
        day_rows = out.filter(pc.equal(out.column("kind"), core.DAY_EVENTS))
        events = np.zeros(self.plan.days, np.int64)
        np.add.at(events, day_rows.column("day").to_numpy(), day_rows.column("events").to_numpy())
        return events


# ---------------------------------------------------------------- SQL

EFFECTIVE_T = "LEAST(ts, date_part('epoch', archived_at))"


def _t_from(x: float) -> str:
    """SQL for effective time >= x (both columns filtered, so the BRIN indexes serve it)."""
    return f"ts >= {x!r} AND archived_at >= to_timestamp({x!r})"


def _t_before(x: float) -> str:
    return f"(ts < {x!r} OR archived_at < to_timestamp({x!r}))"


_STAYS = "event IN ('enter', 'leave')"  # the events of stays (not CROSS)


def carry_sql(schema: str, w0: float, snapshot: dt.date | None) -> str:
    """(fence_id, object_id) inside at w0: the snapshot of `snapshot`'s end updated by the
    events after it (the last one decides), or, without a snapshot, by all earlier events."""
    s = f'"{schema}"'
    stored = (f"SELECT o.fence_id, unnest(o.object_ids) AS object_id FROM {s}.occupancy_open o "
              f"WHERE o.day = DATE '{snapshot}'")
    gap_from = epoch(snapshot) + DAY_S if snapshot else None
    if gap_from is not None and gap_from >= w0:
        return stored
    # (a CROSS, not a stay, changes no occupancy)
    where = _t_before(w0) + (f" AND {_t_from(gap_from)}" if gap_from is not None else "") + f" AND {_STAYS}"
    gap = (f"SELECT DISTINCT ON (fence_id, object_id) fence_id, object_id, event FROM {s}.fence_event "
           f"WHERE {where} ORDER BY fence_id, object_id, {EFFECTIVE_T} DESC, ts DESC, event DESC")
    sql = f"WITH gap AS ({gap}) SELECT fence_id, object_id FROM gap WHERE event = 'enter'"
    if snapshot is None:
        return sql
    return (f"{sql} UNION ALL SELECT o.fence_id, o.object_id FROM ({stored}) o WHERE NOT EXISTS "
            "(SELECT 1 FROM gap g WHERE g.fence_id = o.fence_id AND g.object_id = o.object_id)")


def events_sql(schema: str, window: Window, snapshot: dt.date | None) -> str:
    """The core's input (columns fence_id, object_id, kind, enter, t, ts): the window's events
    (effective time in [w0, w1)), the objects carried in (an enter at -inf) and the hourly
    means of the computed days of the lookback (t = the hour's offset from the window's
    start, ts = the mean)."""
    s, first = f'"{schema}"', window.first
    since = first - dt.timedelta(days=LOOKBACK_DAYS - 1)
    window_events = f"{_t_from(window.w0)} AND {_t_before(window.w1)} AND {_STAYS}"
    return (f"SELECT fence_id, object_id, {core.EVENT}::int2 AS kind, event = 'enter' AS enter, "
            f"{EFFECTIVE_T} AS t, ts FROM {s}.fence_event WHERE {window_events} "
            f"UNION ALL SELECT fence_id, object_id, {core.CARRIED}::int2, true, '-Infinity', '-Infinity' "
            f"FROM ({carry_sql(schema, window.w0, snapshot)}) c "
            f"UNION ALL SELECT h.fence_id, NULL, {core.HISTORY}::int2, NULL, "
            f"(h.day - DATE '{first}') * 24 + h.hour, h.mean_occupancy "
            f"FROM {s}.occupancy_hourly h JOIN {s}.occupancy_day USING (day) "
            f"WHERE h.day >= DATE '{since}' AND h.day < DATE '{first}'")


# ---------------------------------------------------------------- Spark


@dataclass
class Summary:
    window: Window
    events: int = 0
    rows: int = 0
    wall_s: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    written: dict[str, int] = dataclasses.field(default_factory=dict)
    venues: venue_analytics.VenueSummary | None = None

    def line(self) -> str:
        rate = self.events / self.wall_s if self.wall_s else 0.0
        w = self.window
        return (f"days {w.first}..{w.last}: {self.events:,} events read, {self.rows:,} rows written "
                f"({', '.join(f'{k} {v:,}' for k, v in self.written.items())}), "
                f"{self.wall_s:.1f} s, {rate:,.0f} events/s"
                + (f"; {self.venues.line()}" if self.venues else ""))


def run_job(cfg: JobConfig, window: Window, schema: str = "public", *, progress: Progress = _say) -> Summary:
    """Compute the window's days and swap them in (the session: spark_session's, so a running
    one is reused)."""
    check_schema(schema)
    t_start = time.perf_counter()
    summary = Summary(window)
    mark = [t_start]

    def phase(name: str) -> None:
        now = time.perf_counter()
        summary.phases[name] = round(now - mark[0], 3)
        mark[0] = now

    run_id = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    history, snapshot = asyncio.run(_prepare(cfg.postgres_url, schema, window))
    plan = core.Plan(window.w0, window.days, tuple((d - window.first).days for d in history))
    progress(f"days {window.first}..{window.last} (run {run_id}), "
             + (f"carrying in who was inside at the end of {snapshot}" if snapshot
                else "no earlier day computed: replaying all earlier events")
             + (" and the events since" if snapshot and epoch(snapshot) + DAY_S < window.w0 else "")
             + f"; {len(history)} computed days of history")
    phase("prepare")
    spark = spark_session(cfg, APP_NAME)
    phase("session")
    n = partitions(spark, cfg)
    task = Task(cfg.postgres_url, schema, events_sql(schema, window, snapshot),
                tuple(hash_predicates("fence_id", n)), plan, window.first, run_id)
    try:
        with StageBars(spark):  # the stages with their time left, on a terminal
            progress(f"reading, analysing and staging the events ({n} tasks, each a share of the fences)")
            done, tags = run_tasks(spark, n, task, SUMMARY_DDL, "fence")
            per_day: dict[int, int] = {}
            for r in done:
                per_day[r["day"]] = per_day.get(r["day"], 0) + int(r["events"])
            summary.events = sum(per_day.values())
            phase("read+analyse+stage")
            progress("swapping the days in")
            summary.written = asyncio.run(_swap(cfg.postgres_url, schema, run_id, tags, window, per_day))
            summary.rows = sum(summary.written.values())
            phase("swap")
            summary.venues = venue_analytics.run(spark, cfg.postgres_url, schema, window.first, window.last,
                                                 n, run_id, progress)
            phase("venues")
    finally:
        asyncio.run(_unstage(cfg.postgres_url, schema, run_id))
    summary.wall_s = time.perf_counter() - t_start
    return summary


# ---------------------------------------------------------------- PostgreSQL (asyncpg)


async def _prepare(dsn: str, schema: str, window: Window) -> tuple[list[dt.date], dt.date | None]:
    """The computed days of the lookback before the window, and the latest computed day
    before it (its occupancy_open rows are the carry-in); stale staged rows removed."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for name in OUTPUTS:
            await conn.execute(f'DELETE FROM "{schema}".{name}_stage WHERE staged_at < now() - interval '
                               f"'{STALE_STAGE}'")
        since = window.first - dt.timedelta(days=LOOKBACK_DAYS - 1)
        rows = await conn.fetch(f'SELECT day FROM "{schema}".occupancy_day WHERE day >= $1 AND day < $2 '
                                "ORDER BY day", since, window.first)
        snapshot = await conn.fetchval(f'SELECT max(day) FROM "{schema}".occupancy_day WHERE day < $1',
                                       window.first)
        return [r["day"] for r in rows], snapshot
    finally:
        await conn.close()


SWAP = {  # table: (its day column, that day's offset from the window's, columns)
    "occupancy_hourly": ("day", 0, "fence_id, day, hour, entries, exits, mean_occupancy, peak_occupancy, "
                                   "stays, dwell_p50_s, dwell_p90_s"),
    "occupancy_open": ("day", 0, "day, fence_id, object_ids"),
    "occupancy_busiest": ("as_of", 0, "as_of, fence_id, weekday, rank, hour, mean_occupancy, days"),
    "occupancy_forecast": ("day", 1, "fence_id, day, hour, occupancy, seasonal, trend, basis, samples"),
}


async def _swap(dsn: str, schema: str, run_id: str, tags: list[str], window: Window,
                per_day: dict[int, int]) -> dict[str, int]:
    """The staged rows of the kept attempts (`tags`) replace the window's, in every table at once."""
    import asyncpg

    s = f'"{schema}"'
    written = {}
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"occupancy-analytics {schema}")
            for table, (column, shift, columns) in SWAP.items():
                lo = window.first + dt.timedelta(days=shift)
                hi = window.last + dt.timedelta(days=shift)
                await conn.execute(f"DELETE FROM {s}.{table} WHERE {column} BETWEEN $1 AND $2", lo, hi)
                status = await conn.execute(f"INSERT INTO {s}.{table} ({columns}) SELECT {columns} FROM "
                                            f"{s}.{table}_stage WHERE run_id = $1 AND task = ANY($2::text[])",
                                            run_id, tags)
                written[table] = int(status.split()[-1])
                await conn.execute(f"DELETE FROM {s}.{table}_stage WHERE run_id = $1", run_id)
            events = [per_day.get(i, 0) for i in range(window.days)]
            status = await conn.execute(
                f"INSERT INTO {s}.occupancy_day AS o (day, events, fences, open_at_end, run_id) "
                f"SELECT d, e, (SELECT count(DISTINCT fence_id) FROM {s}.occupancy_hourly h "
                "WHERE h.day = d), (SELECT coalesce(sum(cardinality(object_ids)), 0) "
                f"FROM {s}.occupancy_open p WHERE p.day = d), "
                "$3 FROM unnest($1::date[], $2::bigint[]) AS u (d, e) "
                "ON CONFLICT (day) DO UPDATE SET events = excluded.events, fences = excluded.fences, "
                "open_at_end = excluded.open_at_end, run_id = excluded.run_id, computed_at = now()",
                window.dates, events, run_id)
            written["occupancy_day"] = int(status.split()[-1])
    finally:
        await conn.close()
    return written


async def _unstage(dsn: str, schema: str, run_id: str) -> None:
    """Whatever a failed run staged (after a swap there is nothing left)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for name in OUTPUTS:
            with contextlib.suppress(asyncpg.UndefinedTableError):  # not to hide why the run failed
                await conn.execute(f'DELETE FROM "{schema}".{name}_stage WHERE run_id = $1', run_id)
    finally:
        await conn.close()


async def create_tables(conn: Any, schema: str, migrations_dir: Path) -> None:
    """For tests and benchmarks: in `schema`, copies of public.fence_event and the venue part's
    inputs (VENUE_INPUTS; clone_schema) and this job's tables and indexes, made by the job's
    migrations (MIGRATIONS) themselves, read from `migrations_dir`: the project's,
    deploy.migrate.MIGRATIONS_DIR, which the caller passes (the job does not import deploy)."""
    await clone_schema(conn, schema, ("fence_event", *VENUE_INPUTS))
    async with conn.transaction():
        await conn.execute(f'SET LOCAL search_path TO "{check_schema(schema)}"')
        for name in MIGRATIONS:
            await conn.execute((migrations_dir / name).read_text())


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser, name: str = "occupancy-analytics") -> None:
    parser.add_argument("--day", type=dt.date.fromisoformat, default=None,
                        help="the (last) UTC day to compute, YYYY-MM-DD (default: yesterday)")
    parser.add_argument("--days", type=int, default=1,
                        help="recompute this many days ending at --day in one pass (default 1)")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: GEOFENCE_SPARK_MASTER or local[*])")
    parser.add_argument("--schema", default="public", help="schema of fence_event and the output tables")
    parser.add_argument("--partitions", type=int, default=None,
                        help="tasks, each reading a share of the fences (default: twice the cores)")


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None,
        also_known: Iterable[str] = ()) -> int:
    """The job as the command line asks; settings from `env` (default: the process's) as
    JobConfig.from_env reads them (`also_known`: the launcher's own GEOFENCE_* keys)."""
    try:
        cfg = JobConfig.from_env(env, also_known=also_known, master=args.master, partitions=args.partitions)
        day = args.day or dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
        window = Window(day, args.days)
        check_schema(args.schema)
    except ConfigError as exc:
        print(f"occupancy-analytics: error: {exc}", file=sys.stderr)
        return 2
    summary = run_job(cfg, window, args.schema)
    print(f"occupancy-analytics: {summary.line()}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="occupancy-analytics", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    from spark_jobs import occupancy as job  # the executors unpickle the core from the package

    sys.exit(job.main())
