"""A month of the events archive exported to Parquet before it is dropped (issue 40,
`geofence archive maintain`, fence/archive_months.py), where Spark reads it back:

    spark.read.parquet("<export dir>/fence_event")   # a `month` column from the directories

One file per month taken out: `<dir>/fence_event/month=YYYY-MM/part-<t>.parquet` (t: when the
month was detached, so a retry writes the same file again, and a month's late events taken out
on a later night add a file beside it). Written as `.tmp`, synced, then renamed: a file under
its final name is whole. The rows are read with a cursor in chunks of CHUNK_ROWS, each one
Parquet row group: memory stays bounded by a chunk, not by a month.

Trade-off: the driver writes the file (pyarrow), not Spark's executors over JDBC: a month is one
sequential read that a single process does at disk speed, and the job needs no Spark session to
start; on a cluster the export directory must be a filesystem the readers share.
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pyarrow as pa
import pyarrow.parquet as pq

from fence.archive_months import LEAVING_RE

CHUNK_ROWS = 50_000
COLUMNS = ("event_id", "fence_id", "object_id", "event", "reason", "ts", "archived_at", "visit_id",
           "inside_s")
SCHEMA = pa.schema([
    ("event_id", pa.string()), ("fence_id", pa.string()), ("object_id", pa.string()),
    ("event", pa.string()), ("reason", pa.string()), ("ts", pa.float64()),
    ("archived_at", pa.timestamp("us", tz="UTC")), ("visit_id", pa.string()), ("inside_s", pa.float64()),
])


def part_path(directory: Path, table: str) -> Path:
    m = LEAVING_RE.fullmatch(table)
    if m is None:
        raise ValueError(f"{table!r} is no detached month of the archive")
    return directory / "fence_event" / f"month={m[1]}-{m[2]}" / f"part-{m[3]}.parquet"


async def export(conn: asyncpg.Connection, table: str, directory: Path) -> int:
    """`table` (a detached month) to its Parquet file; the rows written, checked against the
    table's count (a mismatch raises and the table stays for the next run)."""
    final = part_path(directory, table)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    written = 0
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        want = int(await conn.fetchval(f'SELECT count(*) FROM "{table}"'))
        cursor = await conn.cursor(f'SELECT {", ".join(COLUMNS)} FROM "{table}" ORDER BY ts, event_id')
        with pq.ParquetWriter(tmp, SCHEMA, compression="zstd") as writer:
            while rows := await cursor.fetch(CHUNK_ROWS):
                columns = list(zip(*rows, strict=True))
                writer.write_table(pa.Table.from_arrays(
                    [pa.array(c, type=f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA))
                written += len(rows)
        if written != want:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"{table}: {written:,} rows written, the table holds {want:,}")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return written
