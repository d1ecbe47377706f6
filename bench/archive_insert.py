"""The archiver's insert path, the events archive partitioned by month (migration 0029) against
the table it replaced, side by side in one run on the local stack's PostgreSQL.

Two tables in a scratch schema (dropped at the end): `fence_event` partitioned by month as
public's, written by `fence.store.archive_events` itself (each batch: the month tables made if
new, then one INSERT .. ON CONFLICT (event_id, ts)); `fence_event_flat`, the old unpartitioned
table (key event_id, the same indexes), written by the old statement. Each round stores fresh
batches in both, alternating which goes first, then stores the same batches again (every row a
duplicate, as a redelivery is). Events span two months, in time order as an archiver sees them.

    python -m bench.archive_insert [--events 200000] [--batch 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import asyncpg

from deploy.settings import Settings, load_secrets, postgres_dsn
from fence import store

OLD = ("INSERT INTO fence_event_flat (event_id, fence_id, object_id, event, reason, ts, visit_id, inside_s) "
       "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::float8[], "
       "$7::text[], $8::float8[]) ON CONFLICT (event_id) DO NOTHING")


def batches(n: int, size: int, t0: float) -> list[list[store.EventRow]]:
    span = 45 * 86400.0  # two months
    rows = [(uuid.uuid4().hex, f"bench:f{i % 500}", f"bench:o{i % 5000}", "enter" if i % 2 else "leave",
             "entered" if i % 2 else "exited", t0 + span * i / n, None, None) for i in range(n)]
    return [rows[i:i + size] for i in range(0, n, size)]


async def old_insert(conn: asyncpg.Connection, rows: list[store.EventRow]) -> int:
    columns = [list(c) for c in zip(*rows, strict=True)]
    async with conn.transaction():
        done = await conn.execute(OLD, *columns)
    return int(done.split()[-1])


async def timed(conn: asyncpg.Connection, work: list[list[store.EventRow]],
                partitioned: bool) -> tuple[float, int]:
    started, stored = time.perf_counter(), 0
    for b in work:
        stored += await (store.archive_events(conn, b) if partitioned else old_insert(conn, b))
    return time.perf_counter() - started, stored


async def main(args: argparse.Namespace) -> None:
    settings = Settings.from_env()
    dsn = postgres_dsn(settings, load_secrets(settings).postgres_password)
    schema = f"bench_archive_{os.getpid()}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    conn = await asyncpg.connect(dsn, server_settings={"search_path": f'"{schema}", public'})
    try:
        await conn.execute("CREATE TABLE fence_event (LIKE public.fence_event INCLUDING DEFAULTS INCLUDING "
                           "CONSTRAINTS INCLUDING INDEXES) PARTITION BY RANGE (ts)")
        await conn.execute("CREATE TABLE fence_event_flat (LIKE public.fence_event INCLUDING DEFAULTS "
                           "INCLUDING CONSTRAINTS)")
        await conn.execute("ALTER TABLE fence_event_flat ADD PRIMARY KEY (event_id)")
        for cols in ("fence_id, ts, event_id", "object_id, ts"):
            await conn.execute(f"CREATE INDEX ON fence_event_flat ({cols})")
        await conn.execute("CREATE INDEX ON fence_event_flat (visit_id) WHERE visit_id IS NOT NULL")
        await conn.execute("CREATE INDEX ON fence_event_flat USING brin (ts)")
        await conn.execute("CREATE INDEX ON fence_event_flat USING brin (archived_at)")
        totals = {(p, k): 0.0 for p in (False, True) for k in ("new", "again")}
        t0 = 1_790_000_000.0
        for r in range(args.rounds):
            work = batches(args.events, args.batch, t0 + r * 100 * 86400.0)
            for partitioned in ((False, True) if r % 2 == 0 else (True, False)):
                took, stored = await timed(conn, work, partitioned)
                assert stored == args.events, (partitioned, stored)
                totals[partitioned, "new"] += took
            for partitioned in ((True, False) if r % 2 == 0 else (False, True)):
                took, stored = await timed(conn, work, partitioned)
                assert stored == 0, (partitioned, stored)
                totals[partitioned, "again"] += took
            print(f"round {r + 1}/{args.rounds}: {args.events:,} events in batches of {args.batch:,}, "
                  "stored and stored again in both tables", flush=True)
        n = args.events * args.rounds
        months = await conn.fetchval("SELECT count(*) FROM pg_inherits "
                                     "WHERE inhparent = 'fence_event'::regclass")
        for kind in ("new", "again"):
            flat, part = n / totals[False, kind], n / totals[True, kind]
            what = "new events" if kind == "new" else "the same again (duplicates)"
            print(f"{what:<28} unpartitioned {flat:>9,.0f} rows/s   by month {part:>9,.0f} rows/s   "
                  f"ratio {part / flat:.2f}")
        flat, part = n / totals[False, "new"], n / totals[True, "new"]
        print(f"summary: the archive by month ({months} month tables) stores {part:,.0f} events/s, "
              f"{part / flat:.2f}x the unpartitioned table's {flat:,.0f}/s (one run, interleaved)")
    finally:
        await conn.close()
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
