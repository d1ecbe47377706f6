"""The venues' PostgreSQL side (deploy/migrations/0008_venues.sql): what the sensor sidecar
reads at its start and writes per batch.

A batch is written in one transaction: its reports COPYed into a staging table and inserted
once (a redelivered report meets its key), its v2 events and statuses likewise, each sensor's
counting state, the hives' live status and closed days. So the counting state in `sensor`
always matches the reports stored: after a crash the sidecar resumes from it, and a batch
delivered again counts nothing twice (its reports are in the state's memory of recent ones,
or older than the last one counted: `late`; its events are in sensor_event, which
`stored_events` reads before the batch is counted).

`sensor.last_report_at` (what `silent` is judged by, sensor_alerts.py) is the newest receive
time of a report new to the platform: a counter report (not a duplicate, not late) or a v2
event report (not one stored already).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from fence.venues.counting import DUPLICATE, LATE, SensorCounts
from fence.venues.occupancy import DayCounts, HiveOccupancy
from fence.venues.sensor_core import CountRow, EventKey, EventRow, SensorInfo, StatusRow, event_key

REPORT_COLUMNS = ("sensor_id", "device_at", "received_at", "at", "version", "report_type", "counter",
                  "total_in", "total_out", "entries", "exits", "rule", "gap", "lost_reports", "unknowable",
                  "skewed", "raw")
EVENT_COLUMNS = ("sensor_id", "device_ts", "slot", "event_type", "distance_mm", "at", "received_at")
STATUS_COLUMNS = ("sensor_id", "received_at", "startup_time", "battery_mv", "sensor_state",
                  "discarded_events", "gprs_signal", "firmware_version", "configuration_id")


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _report(r: CountRow) -> tuple[Any, ...]:
    return (r.sensor_id, _ts(r.device_at), _ts(r.received_at), _ts(r.at), r.version, r.report_type, r.counter,
            r.total_in, r.total_out, r.entries, r.exits, r.rule, r.gap, r.lost_reports, r.unknowable,
            r.skewed, r.raw)


def counts_sql(schema: str, hive_predicate: str) -> str:
    """The counted instants of the hives matching `hive_predicate` (on h.id) with `at` in
    [$1, $2) (timestamptz): (hive id, epoch seconds, entries, exits) of every sensor report,
    zeros included (a report without counts still says the sensor was alive), and of every v2
    event report: what the live figure adds (sidecar.py), for the owners' "today" and the
    nightly analytics."""
    s = f'"{schema}"'
    joined = f"JOIN {s}.sensor x ON x.id = {{}}.sensor_id JOIN {s}.hive h ON h.id = x.hive_id"
    return (f"SELECT h.id, date_part('epoch', r.at) AS t, r.entries, r.exits "
            f"FROM {s}.sensor_report r {joined.format('r')} "
            f"WHERE {hive_predicate} AND r.at >= $1 AND r.at < $2 "
            f"UNION ALL SELECT h.id, date_part('epoch', e.at), (e.event_type = 1)::int, "
            f"(e.event_type = 0)::int FROM {s}.sensor_event e {joined.format('e')} "
            f"WHERE {hive_predicate} AND e.at >= $1 AND e.at < $2 AND e.event_type IN (0, 1)")


async def load(conn: asyncpg.Connection, sensor_ids: Sequence[str] | None = None
               ) -> tuple[dict[str, SensorInfo], dict[str, dict[str, Any]], dict[str, HiveOccupancy]]:
    """The sensors (all, or those of `sensor_ids` that exist) with their hive's time zone, the
    counting states stored, and their hives' occupancy as hive_status has it (all hives, or
    the sensors' hives)."""
    sensors: dict[str, SensorInfo] = {}
    counts: dict[str, dict[str, Any]] = {}
    where = "" if sensor_ids is None else " WHERE s.id = ANY($1::text[])"
    args = () if sensor_ids is None else (list(sensor_ids),)
    for r in await conn.fetch("SELECT s.id, s.hive_id, s.byte_order, s.modulus, s.counts, h.tz FROM sensor s "
                              "JOIN hive h ON h.id = s.hive_id" + where, *args):
        sensors[r["id"]] = SensorInfo(r["id"], r["hive_id"], r["tz"], r["byte_order"], r["modulus"])
        if r["counts"] is not None:
            raw = r["counts"]
            counts[r["id"]] = orjson.loads(raw) if isinstance(raw, str | bytes) else raw
    hives: dict[str, HiveOccupancy] = {}
    where = "" if sensor_ids is None else " WHERE h.id = ANY($1::text[])"
    args = () if sensor_ids is None else (sorted({i.hive_id for i in sensors.values()}),)
    for r in await conn.fetch("SELECT h.id, h.tz, h.reset_hour, h.capacity, h.fence_id, st.day, "
                              "st.entries, st.exits FROM hive h LEFT JOIN hive_status st ON st.hive_id = h.id"
                              + where, *args):
        today = DayCounts(r["day"], r["entries"], r["exits"]) if r["day"] is not None else None
        hives[r["id"]] = HiveOccupancy(r["id"], r["tz"], r["reset_hour"], r["capacity"], today,
                                       fence_id=r["fence_id"])
    return sensors, counts, hives


async def phones(conn: asyncpg.Connection, hive_ids: Sequence[str]) -> list[tuple[str, str, bool, float]]:
    """(hive, object, inside, ts): each object's last archived event of each hive's fence (the
    app figure at the sidecar's start; the live events it then consumes correct it by ts)."""
    rows = await conn.fetch(
        "SELECT h.id AS hive_id, e.object_id, e.event, e.ts FROM hive h JOIN LATERAL ("
        "  SELECT DISTINCT ON (object_id) object_id, event, ts FROM fence_event WHERE fence_id = h.fence_id "
        "  ORDER BY object_id, ts DESC, event DESC) e ON true "
        "WHERE h.fence_id IS NOT NULL AND h.id = ANY($1::text[])", list(hive_ids))
    return [(r["hive_id"], r["object_id"], r["event"] == "enter", float(r["ts"])) for r in rows]


async def stored_events(conn: asyncpg.Connection, events: Sequence[EventRow]) -> set[EventKey]:
    """The keys of those events that sensor_event has already."""
    keys = sorted({event_key(e) for e in events if e.counted})
    if not keys:
        return set()
    rows = await conn.fetch(
        "SELECT e.sensor_id, e.device_ts, e.event_type, e.distance_mm, e.slot FROM sensor_event e "
        "JOIN unnest($1::text[], $2::bigint[], $3::smallint[], $4::integer[], $5::smallint[]) "
        "AS k (sensor_id, device_ts, event_type, distance_mm, slot) USING (sensor_id, device_ts, event_type, "
        "distance_mm, slot)", *(list(col) for col in zip(*keys, strict=True)))
    return {(r["sensor_id"], int(r["device_ts"]), int(r["event_type"]), int(r["distance_mm"]), int(r["slot"]))
            for r in rows}


def last_reports(counts: Sequence[CountRow], events: Sequence[EventRow]) -> dict[str, float]:
    """Per sensor, the newest receive time of a report new to the platform (the module)."""
    last: dict[str, float] = {}
    for sid, at in [(r.sensor_id, r.received_at) for r in counts if r.rule not in (DUPLICATE, LATE)] + [
            (e.sensor_id, e.received_at) for e in events if e.counted]:
        if at > last.get(sid, float("-inf")):
            last[sid] = at
    return last


async def store_batch(conn: asyncpg.Connection, counts: Sequence[CountRow], events: Sequence[EventRow],
                      statuses: Sequence[StatusRow], states: dict[str, SensorCounts],
                      hives: Iterable[HiveOccupancy], closed: Sequence[tuple[str, DayCounts]]) -> int:
    """One transaction (see the module); returns the reports that were new."""
    new = 0
    async with conn.transaction():
        if counts:
            await conn.execute("CREATE TEMP TABLE IF NOT EXISTS sensor_report_stage "
                               "(LIKE sensor_report INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
            await conn.copy_records_to_table(
                "sensor_report_stage", columns=REPORT_COLUMNS,
                records=[_report(r) for r in counts])
            done = await conn.execute(f"INSERT INTO sensor_report ({', '.join(REPORT_COLUMNS)}) "
                                      f"SELECT {', '.join(REPORT_COLUMNS)} FROM sensor_report_stage "
                                      "ON CONFLICT DO NOTHING")
            new = int(done.split()[-1])
        if events:
            await conn.executemany(
                f"INSERT INTO sensor_event ({', '.join(EVENT_COLUMNS)}) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                "ON CONFLICT DO NOTHING",
                [(e.sensor_id, e.device_ts, e.slot, e.event_type, e.distance_mm, _ts(e.at),
                  _ts(e.received_at)) for e in events])
        if statuses:
            await conn.executemany(
                f"INSERT INTO sensor_status ({', '.join(STATUS_COLUMNS)}) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
                [(s.sensor_id, _ts(s.received_at), s.values["startup_time"], s.values["battery"],
                  s.values["sensor_state"], s.values["discarded_events"], s.values["gprs_signal"],
                  s.values["firmware_version"], s.values["configuration_id"]) for s in statuses])
            await conn.executemany(
                "UPDATE sensor_config SET applied_at = $3 WHERE sensor_id = $1 AND configuration_id = $2 "
                "AND applied_at IS NULL",
                [(s.sensor_id, s.values["configuration_id"], _ts(s.received_at)) for s in statuses])
            await conn.executemany(
                "UPDATE sensor SET last_status_at = greatest(last_status_at, $2) WHERE id = $1",
                [(s.sensor_id, _ts(s.received_at)) for s in statuses])
        last = last_reports(counts, events)
        if states:
            await conn.executemany(
                "UPDATE sensor SET counts = $2::jsonb, last_report_at = greatest(last_report_at, $3) "
                "WHERE id = $1",
                [(sid, orjson.dumps(st.to_json()).decode(), _ts(last[sid]) if sid in last else None)
                 for sid, st in states.items()])
        heard = [(sid, _ts(at)) for sid, at in sorted(last.items()) if sid not in states]
        if heard:  # sensors heard from by their event reports alone in this batch
            await conn.executemany(
                "UPDATE sensor SET last_report_at = greatest(last_report_at, $2) WHERE id = $1", heard)
        await conn.executemany(
            "INSERT INTO hive_status (hive_id, day, entries, exits, occupancy, raw, app_occupancy, "
            "updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, now()) ON CONFLICT (hive_id) DO UPDATE "
            "SET day = EXCLUDED.day, "
            "entries = EXCLUDED.entries, exits = EXCLUDED.exits, occupancy = EXCLUDED.occupancy, "
            "raw = EXCLUDED.raw, app_occupancy = EXCLUDED.app_occupancy, updated_at = now()",
            [(h.hive_id, h.today.day, h.today.entries, h.today.exits, h.today.occupancy, h.today.raw,
              h.app_occupancy if h.fence_id else None) for h in hives if h.today is not None])
        if closed:
            await conn.executemany(
                "INSERT INTO hive_day (hive_id, day, entries, exits, residual) VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (hive_id, day) DO UPDATE SET entries = hive_day.entries + EXCLUDED.entries, "
                "exits = hive_day.exits + EXCLUDED.exits, "
                "residual = hive_day.entries + EXCLUDED.entries - hive_day.exits - EXCLUDED.exits, "
                "closed_at = now()",
                [(hive_id, d.day, d.entries, d.exits, d.raw) for hive_id, d in closed])
    return new

