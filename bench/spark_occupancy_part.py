"""The occupancy-analytics part of `bench/spark_jobs.py`: N generated events, one job run.

`bench_occupancy(events, schema, master)` generates N fence events (numpy, seeded), loads
them with one binary COPY into `schema` (a fresh clone of fence_event plus the job's tables,
dropped at the end), then runs spark_jobs/occupancy.py over every generated day in one pass
(`--days`) and returns its figures. Only the job is timed; generating and loading are shown
on the progress line but not counted. The clone's B-tree indexes are dropped before the COPY
(the job reads by the BRIN indexes only) and the table is vacuumed before the run, as
autovacuum would have done to an archive's older rows.

The workload: F = N/5,000 fences (skewed popularity) and O = N/40 objects over 7 days; each
object visits one fence after another (log-normal dwell, median 20 min, exponential gaps), so
a (fence, object) sequence alternates enter/leave, except what real archives also hold: ~0.2% of
stays never left, 0.5% of events repeated under another event_id, stays still open at the
end, events cut at the start of the period (a leave without its enter), and devices with
skewed clocks (3% ahead by up to an hour, 2% behind by up to ten minutes; archived_at is the
true time plus the pipeline's delay).

The venue part: H hives (`--hives`, default 2,000) in three time zones, one sensor each
reporting every 15 minutes (a legacy sensor's timeout; counts Poisson by a day-shaped
intensity), half of them with one of the generated fences as their fence (the phones figure);
the job's venue phase is timed on its own (`phases_s["venues"]`).

The ids are qualified as the archive stores them since tenants (fence/archive.py: the events'
ids qualified by their tenant): fences `bench:bench-fNNNNNN`, objects `bench:bench-oNNNNNNNN`, the
benchmarks' tenant's (bench/tenant.py); hives and sensors are the platform's, unqualified.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import datetime as dt
import struct
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt

from bench import report
from bench.tenant import qualified
from deploy.migrate import MIGRATIONS_DIR
from deploy.spark_cmd import job_config
from spark_jobs import occupancy
from spark_jobs.session import check_schema

TARGET_EVENTS_PER_S = 500_000.0
DAYS = 7
FIRST_DAY = dt.date(2024, 3, 4)  # a Monday
EVENTS_PER_FENCE = 5_000
EVENTS_PER_OBJECT = 40
DWELL_MEDIAN_S = 20 * 60.0
NEVER_LEFT = 0.002
REPEATED = 0.005
AHEAD, BEHIND = 0.03, 0.02  # shares of devices whose clock is ahead / behind
COPY_CHUNK = 500_000
HIVES = 2_000
REPORTS_PER_DAY = 96
ZONES = ("Europe/Vaduz", "UTC", "America/New_York")

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Events:
    """Column arrays of the generated events (ids as fixed-width bytes)."""

    event_id: npt.NDArray[np.bytes_]  # S32, hex
    fence: I64
    obj: I64
    enter: npt.NDArray[np.bool_]
    reason: npt.NDArray[np.int8]  # index into REASONS
    ts: F64
    archived: F64  # epoch seconds

    def __len__(self) -> int:
        return int(self.ts.size)


REASONS = (b"entered", b"exited", b"timeout")


def generate(n: int, days: int = DAYS, seed: int = 1) -> Events:
    """n events (exactly) over `days` days from FIRST_DAY."""
    rng = np.random.default_rng(seed)
    n_fences, n_objects = max(4, n // EVENTS_PER_FENCE), max(2, n // EVENTS_PER_OBJECT)
    t0 = dt.datetime.combine(FIRST_DAY, dt.time(), dt.UTC).timestamp()
    span = days * 86_400.0
    visits = -(-n // (2 * n_objects)) + 2  # per object, a little more than needed
    dwell = rng.lognormal(np.log(DWELL_MEDIAN_S), 1.0, (n_objects, visits))
    gap = rng.exponential(max(60.0, span / visits - dwell.mean()), (n_objects, visits))
    # object o's visit k: enter after the gap following visit k-1's leave; starting before the
    # period, so the first leaves can lack their enter
    enter_t = t0 - rng.uniform(0, 3_600, (n_objects, 1)) + np.cumsum(gap + dwell, axis=1) - dwell
    leave_t = enter_t + dwell
    fence = (n_fences * rng.random((n_objects, visits)) ** 2).astype(np.int64)  # skewed popularity
    obj = np.broadcast_to(np.arange(n_objects)[:, None], (n_objects, visits))
    left = rng.random((n_objects, visits)) >= NEVER_LEFT
    both = np.concatenate
    t = both([enter_t.ravel(), leave_t.ravel()[left.ravel()]])
    keep = (t >= t0) & (t < t0 + span)
    ev_fence = both([fence.ravel(), fence.ravel()[left.ravel()]])[keep]
    ev_obj = both([obj.ravel(), obj.ravel()[left.ravel()]])[keep]
    ev_enter = both([np.ones(fence.size, bool), np.zeros(int(left.sum()), bool)])[keep]
    t = t[keep]
    again = rng.random(t.size) < REPEATED
    t, ev_fence, ev_obj, ev_enter = (both([a, a[again]]) for a in (t, ev_fence, ev_obj, ev_enter))
    if t.size < n:
        raise ValueError(f"generated {t.size:,} events, fewer than {n:,}: raise the visits")
    pick = np.sort(rng.choice(t.size, n, replace=False))
    t, ev_fence, ev_obj, ev_enter = t[pick], ev_fence[pick], ev_obj[pick], ev_enter[pick]
    clock = np.zeros(n_objects)
    kind = rng.random(n_objects)
    ahead, behind = kind < AHEAD, (kind >= AHEAD) & (kind < AHEAD + BEHIND)
    clock[ahead] = rng.uniform(60, 3_600, int(ahead.sum()))
    clock[behind] = -rng.uniform(5, 600, int(behind.sum()))
    reason = np.where(ev_enter, 0, np.where(rng.random(n) < 0.85, 1, 2)).astype(np.int8)
    archived = t + rng.uniform(0.05, 3.0, n)
    order = np.argsort(archived, kind="stable")  # the archiver's order, as on disk
    return Events(event_id=hex_ids(rng, n), fence=ev_fence[order], obj=ev_obj[order],
                  enter=ev_enter[order], reason=reason[order], ts=(t + clock[ev_obj])[order],
                  archived=archived[order])


_HEX = np.array([f"{i:02x}".encode() for i in range(256)], dtype="S2")


def hex_ids(rng: np.random.Generator, n: int) -> npt.NDArray[np.bytes_]:
    raw = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    return np.ascontiguousarray(_HEX[raw]).view("S32").ravel()


def fixed_names(prefix: bytes, idx: I64, digits: int) -> npt.NDArray[np.bytes_]:
    """prefix + idx zero-padded to `digits`, as fixed-width bytes (no Python loop)."""
    width = len(prefix) + digits
    out = np.empty((idx.size, width), np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, np.uint8)
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    out[:, len(prefix):] = (idx[:, None] // powers) % 10 + ord("0")
    return out.view(f"S{width}").ravel()


# ---------------------------------------------------------------- binary COPY

COLUMNS = ("event_id", "fence_id", "object_id", "event", "reason", "ts", "archived_at")
FENCE_PREFIX, OBJECT_PREFIX = qualified("bench-f"), qualified("bench-o")  # + the number
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC).timestamp()
HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
TRAILER = struct.pack("!h", -1)


def copy_rows(ev: Events, lo: int, hi: int) -> bytes:
    """Rows lo..hi in PostgreSQL's binary COPY format (no header): every field has a fixed
    width once the rows are grouped by reason, so each group is one numpy record array."""
    fid = fixed_names(FENCE_PREFIX.encode(), ev.fence[lo:hi], 6)
    oid = fixed_names(OBJECT_PREFIX.encode(), ev.obj[lo:hi], 8)
    parts = []
    for r, name in enumerate(REASONS):
        sel = np.flatnonzero(ev.reason[lo:hi] == r)
        if not sel.size:
            continue
        dtype = np.dtype([("nf", ">i2"), ("l1", ">i4"), ("eid", "S32"), ("l2", ">i4"), ("fid", fid.dtype),
                          ("l3", ">i4"), ("oid", oid.dtype), ("l4", ">i4"), ("ev", "S5"),
                          ("l5", ">i4"), ("rs", f"S{len(name)}"), ("l6", ">i4"), ("ts", ">f8"),
                          ("l7", ">i4"), ("at", ">i8")])
        rec = np.empty(sel.size, dtype)
        rec["nf"] = len(COLUMNS)
        for field, width in (("l1", 32), ("l2", fid.itemsize), ("l3", oid.itemsize), ("l4", 5),
                             ("l5", len(name)), ("l6", 8), ("l7", 8)):
            rec[field] = width
        rec["eid"], rec["fid"], rec["oid"] = ev.event_id[lo:hi][sel], fid[sel], oid[sel]
        rec["ev"] = np.where(ev.enter[lo:hi][sel], b"enter", b"leave")
        rec["rs"] = name
        rec["ts"] = ev.ts[lo:hi][sel]
        rec["at"] = np.round((ev.archived[lo:hi][sel] - PG_EPOCH) * 1e6).astype(np.int64)
        parts.append(rec.tobytes())
    return b"".join(parts)


async def load(conn: Any, schema: str, ev: Events, progress: report.Progress) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield HEADER
        for lo in range(0, len(ev), COPY_CHUNK):
            hi = min(len(ev), lo + COPY_CHUNK)
            yield copy_rows(ev, lo, hi)
            progress.show(f"loading {hi:,}/{len(ev):,} events")
        yield TRAILER

    await conn.copy_to_table("fence_event", schema_name=schema, source=chunks(), columns=COLUMNS,
                             format="binary")
    # as autovacuum would, but now rather than during the measured run (it also sets the
    # hint bits, which the job's first scan would otherwise write)
    progress.show("VACUUM ANALYZE")
    await conn.execute(f'VACUUM (ANALYZE) "{schema}".fence_event')


# ---------------------------------------------------------------- the run


async def load_venues(conn: Any, schema: str, hives: int, days: int, fences: int, seed: int,
                      progress: report.Progress) -> int:
    """`hives` hives with a sensor each and its reports over `days` days; the reports stored."""
    rng = np.random.default_rng(seed + 7)
    s = f'"{schema}"'
    await conn.copy_records_to_table("hive", schema_name=schema, columns=(
        "id", "name", "type", "lon", "lat", "tz", "fence_id"), records=[
        (f"bench-h{i:06d}", f"Bench hive {i}", "bar", 9.5, 47.1, ZONES[i % len(ZONES)],
         f"{FENCE_PREFIX}{i % fences:06d}" if i % 2 == 0 else None) for i in range(hives)])
    await conn.copy_records_to_table("sensor", schema_name=schema, columns=("id", "hive_id"), records=[
        (f"bench-s{i:06d}", f"bench-h{i:06d}") for i in range(hives)])
    t0 = dt.datetime.combine(FIRST_DAY, dt.time(), dt.UTC)
    n = days * REPORTS_PER_DAY
    slot = np.arange(n)
    shape = np.clip(np.sin((slot % REPORTS_PER_DAY) / REPORTS_PER_DAY * 2 * np.pi - np.pi / 2) + 0.3, 0, None)
    stamps = [t0 + dt.timedelta(minutes=15 * k) for k in range(n)]
    stored = 0
    for i in range(hives):
        entries = rng.poisson(3.0 * shape)
        exits = rng.poisson(3.0 * shape)
        sensor = f"bench-s{i:06d}"
        await conn.copy_records_to_table("sensor_report", schema_name=schema, columns=(
            "sensor_id", "device_at", "received_at", "at", "version", "report_type", "counter", "total_in",
            "total_out", "entries", "exits", "rule", "gap", "lost_reports", "unknowable", "skewed", "raw"),
            records=[(sensor, stamps[k], stamps[k], stamps[k], 1, 0x20, -1, k, k, int(entries[k]),
                      int(exits[k]), "increase", 0, 0, False, False, b"") for k in range(n)])
        stored += n
        if i % 100 == 99:
            progress.show(f"loading the venues: {i + 1:,}/{hives:,} hives, {stored:,} reports")
    await conn.execute(f"ANALYZE {s}.sensor_report")
    return stored


async def _prepare(dsn: str, schema: str, ev: Events, progress: report.Progress,
                   venues: tuple[int, int, int] = (0, 0, 0)) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await occupancy.create_tables(conn, schema, MIGRATIONS_DIR)
        # the job reads by the BRIN indexes only: without the B-trees (event_id's primary key
        # above all: random keys) the COPY is several times faster, and the job the same
        for name, how in await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = "
                "'fence_event'", schema):
            if " USING brin " not in how:
                await conn.execute(f'ALTER TABLE "{schema}".fence_event DROP CONSTRAINT IF EXISTS "{name}"')
                await conn.execute(f'DROP INDEX IF EXISTS "{schema}"."{name}"')
        await load(conn, schema, ev, progress)
        hives, days, seed = venues
        return await load_venues(conn, schema, hives, days, int(ev.fence.max()) + 1, seed, progress) \
            if hives else 0
    finally:
        await conn.close()


async def _drop(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def bench_occupancy(events: int, schema: str, master: str, *, days: int = DAYS, seed: int = 1,
                    partitions: int = 0, keep: bool = False, hives: int = HIVES) -> dict[str, Any]:
    """Generate `events` events into `schema` (created, and dropped afterwards unless `keep`),
    run the job over the `days` generated days in one pass and return its figures:
    events, wall_s (the fence part, starting Spark included unless a session was running; the
    venue part's time is venue_s), events_per_s, the phases, rows written, the target and
    whether it was met; the venue part's hives, reports, hive days, rows and reports/s."""
    check_schema(schema)
    cfg = job_config(master=master, partitions=partitions or None)
    progress = report.Progress(f"occupancy-analytics {events:,} events", clock=True)
    progress.show("generating")
    t = time.perf_counter()
    ev = generate(events, days, seed)
    gen_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        reports = asyncio.run(_prepare(cfg.postgres_url, schema, ev, progress, (hives, days, seed)))
        load_s = time.perf_counter() - t
        last = FIRST_DAY + dt.timedelta(days=days - 1)
        progress.show("starting Spark")
        summary = occupancy.run_job(cfg, occupancy.Window(last, days), schema, progress=progress.show)
    finally:
        progress.close()
        if not keep:
            asyncio.run(_drop(cfg.postgres_url, schema))
    venue_s = float(summary.phases.get("venues", 0.0))
    fence_s = summary.wall_s - venue_s  # the fences' figure is the fences' time
    rate = summary.events / fence_s if fence_s else 0.0
    v = summary.venues
    return {"hives": hives, "reports": reports, "hive_days": v.hive_days if v else 0,
            "venue_rows": sum((v.written or {}).values()) if v else 0, "venue_s": venue_s,
            "reports_per_s": reports / venue_s if venue_s else 0.0,
            "events": summary.events, "days": days, "fences": int(ev.fence.max()) + 1,
            "objects": int(ev.obj.max()) + 1, "wall_s": fence_s, "events_per_s": rate,
            "rows_written": summary.rows, "phases_s": summary.phases, "generate_s": gen_s,
            "load_s": load_s, "master": master, "target_events_per_s": TARGET_EVENTS_PER_S,
            "ok": rate >= TARGET_EVENTS_PER_S}


def venue_line(out: dict[str, Any]) -> str:
    return (f"  venues: {out['hives']:,} hives, {out['reports']:,} reports, {out['hive_days']:,} hive days, "
            f"{out['venue_rows']:,} rows in {out['venue_s']:.1f} s = {out['reports_per_s']:,.0f} reports/s "
            "(no target: a figure)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="occupancy-analytics benchmark (one part of spark_jobs.py)")
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--days", type=int, default=DAYS)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--schema", default="bench_occupancy")
    p.add_argument("--partitions", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the schema (and its data) afterwards")
    p.add_argument("--hives", type=int, default=HIVES, help="hives with a sensor each (the venue part)")
    a = p.parse_args(argv)
    out = bench_occupancy(a.events, a.schema, a.master, days=a.days, seed=a.seed, partitions=a.partitions,
                          keep=a.keep, hives=a.hives)
    for k, v in out.items():
        print(f"{k:>22}: {v:,.2f}" if isinstance(v, float) else f"{k:>22}: {v}")
    rate = out["events_per_s"]
    vs = report.times(report.ratio(rate, TARGET_EVENTS_PER_S), f"target {TARGET_EVENTS_PER_S:,.0f}")
    print(report.summary([f"occupancy-analytics {out['events']:,} events over {out['days']} days in "
                          f"{out['wall_s']:.1f} s (Spark's start included) = {rate:,.0f} events/s ({vs})",
                          venue_line(out)],
                         verdict="OK" if out["ok"] else "MISSED"))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
