"""The events archive by month (issue 40, migration 0029, fence/archive_months.py) on the real
PostgreSQL, in a schema of the test's own (its fence_event partitioned as public's, found first
on the search path, so the archiver's code and `fence_event_month` work on it unchanged), and
the months taken out read back by PySpark from their Parquet files."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow.parquet as pq
import pytest

from deploy import cli
from deploy.settings import ConnectionSettings
from fence import archive_months as am
from fence import store
from spark_jobs import archive_export

NOW = datetime(2011, 4, 20, 12, tzinfo=UTC)


def at(month: int, day: int) -> float:
    return datetime(2011, month, day, 8, tzinfo=UTC).timestamp()


def rows(month: int, n: int, tag: str) -> list[store.EventRow]:
    return [(uuid.uuid4().hex, f"t:f-{tag}", f"t:o{i}", "enter", "entered", at(month, 1 + i), None, None)
            for i in range(n)]


@pytest.fixture
async def db(stack: ConnectionSettings, pg_schema: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection whose fence_event is `pg_schema`'s: partitioned by month as public's."""
    conn = await asyncpg.connect(stack["postgres"]["dsn"],
                                 server_settings={"search_path": f'"{pg_schema}", public'})
    try:
        await conn.execute('CREATE TABLE fence_event (LIKE public.fence_event INCLUDING DEFAULTS '
                           'INCLUDING CONSTRAINTS INCLUDING INDEXES) PARTITION BY RANGE (ts)')
        yield conn
    finally:
        await conn.close()


async def where(conn: asyncpg.Connection) -> dict[str, int]:
    got = await conn.fetch("SELECT tableoid::regclass::text AS t, count(*) AS n FROM fence_event GROUP BY 1")
    return {r["t"].split(".")[-1].strip('"'): r["n"] for r in got}


async def test_events_go_to_their_months_table_made_on_first_use_and_stay_deduplicated(
        db: asyncpg.Connection) -> None:
    stored = rows(1, 3, "a") + rows(2, 2, "a") + rows(3, 2, "a")
    assert await store.archive_events(db, stored) == 7
    assert await store.archive_events(db, stored[::-1]) == 0  # redelivered: each event once
    assert await where(db) == {"fence_event_2011_01": 3, "fence_event_2011_02": 2, "fence_event_2011_03": 2}
    assert [m.label for m in await am.months(db)] == ["2011-01", "2011-02", "2011-03"]
    page = await db.fetch("SELECT event_id FROM fence_event WHERE fence_id = 't:f-a' ORDER BY ts, event_id")
    assert [r["event_id"] for r in page] == [r[0] for r in sorted(stored, key=lambda r: (r[5], r[0]))]


async def test_months_past_the_retention_are_exported_for_spark_then_dropped(
        db: asyncpg.Connection, tmp_path: Path, spark: Any) -> None:
    jan, feb, mar = rows(1, 3, "b"), rows(2, 2, "b"), rows(3, 2, "b")
    await store.archive_events(db, jan + feb + mar)

    async def export(conn: asyncpg.Connection, table: str) -> int:
        return await archive_export.export(conn, table, tmp_path)

    assert (await am.maintain(db, NOW, 0, export, 1)).removed == []  # no retention: all kept
    out = await am.maintain(db, NOW, 30, export, 111)
    # 30 days before 2011-04-20: January and February are whole past it, March is not
    assert out.removed == [("2011-01", 3), ("2011-02", 2)]
    assert out.made == ["fence_event_2011_04", "fence_event_2011_05"]  # ready ahead
    assert [m.label for m in await am.months(db)] == ["2011-03", "2011-04", "2011-05"]
    assert await am.leaving(db) == []
    written = pq.read_table(tmp_path / "fence_event" / "month=2011-01" / "part-111.parquet").to_pylist()
    assert [(r["event_id"], r["fence_id"], r["ts"]) for r in written] == [(r[0], r[1], r[5]) for r in jan]
    assert all(r["archived_at"] is not None for r in written)

    # a late event of January makes its table again; a run that dies after the detach leaves it
    # `_out_`, and the next run finishes it (a second file beside the first)
    late = rows(1, 1, "late")
    assert await store.archive_events(db, late) == 1
    january = next(m for m in await am.months(db) if m.label == "2011-01")
    assert await am.detach(db, january, 222) == "fence_event_2011_01_out_222"
    assert await am.leaving(db) == ["fence_event_2011_01_out_222"]
    again = await am.maintain(db, NOW, 30, export, 333)
    assert again.removed == [("2011-01", 1)]
    assert sorted(p.name for p in (tmp_path / "fence_event" / "month=2011-01").iterdir()) == [
        "part-111.parquet", "part-222.parquet"]

    frame = spark.read.parquet(str(tmp_path / "fence_event"))
    by_month = {r["month"]: r["count"] for r in frame.groupBy("month").count().collect()}
    assert by_month == {"2011-01": 4, "2011-02": 2}
    assert {r["event_id"] for r in frame.collect()} == {r[0] for r in jan + feb + late}


def test_geofence_archive_months_lists_the_live_archive(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["archive", "months", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    now = datetime.now(UTC)
    assert am.table_name(now) in {m["table"] for m in listed}
    assert all(m["month"] == m["table"][len("fence_event_"):].replace("_", "-") for m in listed)
    assert cli.main(["archive", "maintain", "--retention-days", "-1"]) == 2
