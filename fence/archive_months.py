"""The events archive's months (issue 40): fence_event is partitioned by month of the event's
time (migration 0029), one table `fence_event_YYYY_MM` (UTC) per month. This module says which
months there are, which have passed the retention, and takes one out of the archive.

A month leaves in three steps, each safe to repeat after a crash:
1. DETACH PARTITION CONCURRENTLY (reads and writes of the other months go on; a detach left
   pending by a crash is FINALIZEd), then the table is renamed `fence_event_YYYY_MM_out_<t>`.
   From then on nothing writes to it: an event of that month archived later (a late device)
   makes the month's table again (fence_event_month), and the next run takes that one out too.
2. Its rows exported, when an export directory is set (spark_jobs/archive_export.py: Parquet,
   `<dir>/fence_event/month=YYYY-MM/part-<t>.parquet`, the same name on a retry).
3. DROP TABLE.
A run first finishes the `_out_` tables an earlier run left.

Trade-off: a month leaves whole, on its last day's retention: an archive kept 30 days holds up
to 30 days plus a month. A row-wise DELETE would keep it exact at the cost of a scan, dead rows
and vacuum on the hottest table.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

MONTH_RE = re.compile(r"fence_event_(\d{4})_(\d{2})")
LEAVING_RE = re.compile(r"fence_event_(\d{4})_(\d{2})_out_(\d+)")


@dataclass(frozen=True)
class Month:
    """One month's table of the archive."""

    name: str
    year: int
    month: int
    rows: int  # PostgreSQL's estimate (reltuples; -1: never analysed)
    bytes: int
    detaching: bool = False  # a DETACH .. CONCURRENTLY a crash left pending

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        return next_month(self.start)

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"


def next_month(at: datetime) -> datetime:
    return (at.replace(day=1) + timedelta(days=32)).replace(day=1)


def table_name(at: datetime) -> str:
    return f"fence_event_{at.year:04d}_{at.month:02d}"


def expired(months: list[Month], now: datetime, retention_days: int) -> list[Month]:
    """The months whose every event is older than `retention_days` before `now`, oldest first;
    none when retention_days is 0 (the archive keeps everything)."""
    if retention_days <= 0:
        return []
    horizon = now - timedelta(days=retention_days)
    return sorted((m for m in months if m.end <= horizon), key=lambda m: (m.year, m.month))


async def months(conn: asyncpg.Connection) -> list[Month]:
    """The archive's month tables, oldest first."""
    rows = await conn.fetch(
        "SELECT c.relname, c.reltuples::bigint AS rows, pg_total_relation_size(c.oid) AS bytes, "
        "i.inhdetachpending AS pending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'fence_event'::regclass")
    out = []
    for r in rows:
        m = MONTH_RE.fullmatch(r["relname"])
        if m:
            out.append(Month(r["relname"], int(m[1]), int(m[2]), int(r["rows"]), int(r["bytes"]),
                             bool(r["pending"])))
    return sorted(out, key=lambda m: (m.year, m.month))


async def leaving(conn: asyncpg.Connection) -> list[str]:
    """Tables an earlier run detached and has not dropped yet."""
    names = await conn.fetch("SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = "
                             "current_schema()::regnamespace AND relname LIKE 'fence\\_event\\_%\\_out\\_%'")
    return sorted(r["relname"] for r in names if LEAVING_RE.fullmatch(r["relname"]))


async def ensure(conn: asyncpg.Connection, at: datetime) -> str:
    """The month of `at` has its table (made now if not); its name."""
    name: str = await conn.fetchval("SELECT fence_event_month($1)", at.timestamp())
    return name


async def detach(conn: asyncpg.Connection, month: Month, stamp: int) -> str:
    """Step 1: the month out of the archive (see the module's docstring); the detached table's
    name. Not inside a transaction: DETACH .. CONCURRENTLY refuses one."""
    if conn.is_in_transaction():
        raise asyncpg.InterfaceError("detach on a connection inside a transaction")
    how = "FINALIZE" if month.detaching else "CONCURRENTLY"
    await conn.execute(f'ALTER TABLE fence_event DETACH PARTITION "{month.name}" {how}')
    out = f"{month.name}_out_{stamp}"
    await conn.execute(f'ALTER TABLE "{month.name}" RENAME TO "{out}"')
    return out


async def drop(conn: asyncpg.Connection, name: str) -> None:
    """Step 3: a detached table dropped (only one named as `detach` names them)."""
    if not LEAVING_RE.fullmatch(name):
        raise ValueError(f"{name!r} is no detached month of the archive")
    await conn.execute(f'DROP TABLE IF EXISTS "{name}"')


Export = Callable[[asyncpg.Connection, str], Awaitable[int]]


@dataclass
class Outcome:
    made: list[str]  # month tables made ahead
    removed: list[tuple[str, int]]  # (month, rows exported or dropped)
    kept: int  # months left in the archive


async def maintain(conn: asyncpg.Connection, now: datetime, retention_days: int,
                   export: Export | None, stamp: int,
                   progress: Callable[[str, int, int], None] = lambda *_: None) -> Outcome:
    """One nightly run: this month's and the next month's tables made ahead (the archiver then
    never waits to make one), the detached tables of an earlier run finished, then every month
    past the retention taken out (exported first by `export(conn, table)` when given, which
    returns the rows it wrote). `progress(line, months out, months to take out)` at each step."""
    made = [await ensure(conn, now), await ensure(conn, next_month(now))]
    removed: list[tuple[str, int]] = []
    todo = await leaving(conn)
    due = expired(await months(conn), now, retention_days)
    total = len(todo) + len(due)
    for m in due:
        progress(f"detaching {m.name}", 0, total)
        todo.append(await detach(conn, m, stamp))
    for name in todo:
        label = LEAVING_RE.fullmatch(name)
        assert label is not None
        if export is not None:
            progress(f"exporting {name}", len(removed), total)
            rows = await export(conn, name)
        else:
            rows = int(await conn.fetchval(f'SELECT count(*) FROM "{name}"'))
        await drop(conn, name)
        removed.append((f"{label[1]}-{label[2]}", rows))
        progress(f"{name}: {rows:,} rows {'exported and ' if export else ''}dropped", len(removed), total)
    return Outcome(made, removed, len(await months(conn)))
