"""A venue owner's side (an account: a Firebase uid with a name): their hives, their sensors'
health, sensor configurations. The API's `/owner/...` routes call these; each refuses bad
input with `user_store.UserError(status, message)`.

Sensor health, as the owner sees it: `silent` when no report came for more than twice its
reporting interval (never heard from: since it was registered; sensor_alerts.is_silent),
`low_battery` when the last status said less than its low_battery_mv, `config` the newest
configuration pushed and whether a status has carried its id since (`applied`) or not yet
(`pending`).

Analytics: today so far, by local hour, from the sensors' reports (fence/venues/day_curve.py,
raw: the day has not ended), then the days as the nightly job left them
(spark_jobs/venue_core.py has the rules): the last days (counts as counted, the drift
correction applied), each day's hours with both sources side by
side, the "popular times" profile (7 x 24), and the forecasts of those days and of the next,
each hour beside what happened.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
import numpy as np
import orjson

from exchanges.tenancy import name_of
from exchanges.text import ADDRESS_MAX, NAME_MAX, TYPE_MAX, TextError, check_id, check_text
from fence.venues.day_curve import HiveInput, analyse_day, day_bounds, slots
from fence.venues.occupancy import business_day
from fence.venues.sensor_alerts import is_silent
from fence.venues.sensor_frames import SensorConfig
from fence.venues.user_store import UserError
from fence.venues.venue_store import counts_sql

HIVES_PER_OWNER = 200  # a venue owner's hives at most (hives belong to an account, not a tenant)
HIVE_FIELDS = {"id", "name", "type", "address", "lon", "lat", "tz", "reset_hour", "opening_hours",
               "capacity", "fence_id"}


def _checked_hive(body: Any, hive_id: str | None = None) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise UserError(422, "a JSON object expected")
    unknown = set(body) - HIVE_FIELDS
    if unknown:
        raise UserError(422, f"unknown field(s): {', '.join(sorted(unknown))}")
    h = dict(body)
    if hive_id is not None and h.setdefault("id", hive_id) != hive_id:
        raise UserError(422, "id: the body's id differs from the path's")
    try:
        check_id(h.get("id"), "id")
        h["name"] = check_text(h.get("name"), "name", NAME_MAX)
        h["type"] = check_text(h.get("type"), "type", TYPE_MAX)
        h["address"] = check_text(h.get("address", ""), "address", ADDRESS_MAX, required=False)
    except TextError as exc:
        raise UserError(422, str(exc)) from None
    for k, lo, hi in (("lon", -180, 180), ("lat", -90, 90)):
        v = h.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise UserError(422, f"{k}: a number in [{lo}, {hi}] expected")
    h["tz"] = h.get("tz") or "UTC"
    try:
        ZoneInfo(h["tz"])
    except (ZoneInfoNotFoundError, ValueError):
        raise UserError(422, f"tz: {h['tz']!r} is no IANA time zone") from None
    reset = h.get("reset_hour", 4)
    if isinstance(reset, bool) or not isinstance(reset, int) or not 0 <= reset <= 23:
        raise UserError(422, "reset_hour: an hour 0-23")
    h["reset_hour"] = reset
    cap = h.get("capacity")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0):
        raise UserError(422, "capacity: a positive integer (people)")
    hours = h.get("opening_hours") or {}
    if not isinstance(hours, dict) or not all(
            k in ("mon", "tue", "wed", "thu", "fri", "sat", "sun") and isinstance(v, list)
            and all(isinstance(r, list) and len(r) == 2 and all(_hhmm(x) for x in r) for r in v)
            for k, v in hours.items()):
        raise UserError(422, 'opening_hours: {"mon": [["11:00", "23:00"]], ...} expected')
    h["opening_hours"] = hours
    h.setdefault("fence_id", None)
    return h


def _hhmm(x: Any) -> bool:
    if not isinstance(x, str) or len(x) != 5 or x[2] != ":":
        return False
    try:
        return 0 <= int(x[:2]) <= 23 and 0 <= int(x[3:]) <= 59
    except ValueError:
        return False


async def _owned(conn: asyncpg.Connection, uid: str, hive_id: str) -> None:
    owner = await conn.fetchval("SELECT owner_uid FROM hive WHERE id = $1", hive_id)
    if owner is None or owner != uid:
        raise UserError(404, f"no hive {hive_id!r} of yours")


async def put_hive(pool: asyncpg.Pool, uid: str, body: Any, hive_id: str | None = None) -> dict[str, Any]:
    """Create a hive (hive_id None) or replace one of the owner's."""
    h = _checked_hive(body, hive_id)
    async with pool.acquire() as conn, conn.transaction():
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM hive_type WHERE id = $1)", h["type"]):
            types = [r["id"] for r in await conn.fetch("SELECT id FROM hive_type ORDER BY id")]
            raise UserError(422, f"type: one of {', '.join(types)}")
        # fence_id comes qualified by the caller's tenant (fence/api.py): one of its live fences
        if h["fence_id"] is not None and not await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM fence WHERE id = $1 AND deleted_at IS NULL)", h["fence_id"]):
            raise UserError(422, f"fence_id: no fence {name_of(str(h['fence_id']))!r} in your tenant")
        await conn.execute("INSERT INTO owner_account (uid) VALUES ($1) ON CONFLICT DO NOTHING", uid)
        args = (h["id"], uid, h["name"], h["type"], h["address"], float(h["lon"]), float(h["lat"]),
                h["tz"], h["reset_hour"], orjson.dumps(h["opening_hours"]).decode(), h.get("capacity"),
                h["fence_id"])
        if hive_id is None:
            # the owner's hive quota, counted under the owner's row lock (two at once: one waits)
            await conn.execute("SELECT 1 FROM owner_account WHERE uid = $1 FOR NO KEY UPDATE", uid)
            held = await conn.fetchval("SELECT count(*) FROM hive WHERE owner_uid = $1", uid)
            if held >= HIVES_PER_OWNER:
                raise UserError(403, f"you hold {held:,} hives; the quota is {HIVES_PER_OWNER:,} an owner "
                                     "(remove one, or ask the platform's operators)")
            done = await conn.execute(
                "INSERT INTO hive (id, owner_uid, name, type, address, lon, lat, tz, reset_hour, "
                "opening_hours, capacity, fence_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, "
                "$11, $12) ON CONFLICT (id) DO NOTHING", *args)
            if done.endswith(" 0"):
                raise UserError(409, f"hive {h['id']!r} exists")
        else:
            await _owned(conn, uid, hive_id)
            await conn.execute(
                "UPDATE hive SET name = $3, type = $4, address = $5, lon = $6, lat = $7, tz = $8, "
                "reset_hour = $9, opening_hours = $10::jsonb, capacity = $11, fence_id = $12, "
                "updated_at = now() WHERE id = $1 AND owner_uid = $2", *args)
    return h


async def my_hives(pool: asyncpg.Pool, uid: str) -> list[dict[str, Any]]:
    rows = await pool.fetch("SELECT h.id, h.name, h.type, h.capacity, st.occupancy, st.entries, st.exits, "
                            "st.day FROM hive h LEFT JOIN hive_status st ON st.hive_id = h.id "
                            "WHERE h.owner_uid = $1 ORDER BY h.name, h.id", uid)
    return [{"id": r["id"], "name": r["name"], "type": r["type"], "capacity": r["capacity"],
             "occupancy": r["occupancy"], "entries": r["entries"], "exits": r["exits"],
             "day": r["day"].isoformat() if r["day"] else None} for r in rows]


async def sensors(pool: asyncpg.Pool, uid: str, hive_id: str, now: float | None = None
                  ) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    async with pool.acquire() as conn:
        await _owned(conn, uid, hive_id)
        rows = await conn.fetch(
            "SELECT s.id, s.modem, s.report_interval_min, s.low_battery_mv, s.last_report_at, s.created_at, "
            "s.last_status_at, s.counts, st.battery_mv, st.gprs_signal, st.discarded_events, "
            "st.firmware_version, st.configuration_id AS status_config, c.configuration_id, c.sent_at, "
            "c.applied_at, ARRAY(SELECT a.kind || ': ' || a.detail FROM sensor_alert a "
            "WHERE a.sensor_id = s.id AND a.cleared_at IS NULL ORDER BY a.raised_at) AS alerts "
            "FROM sensor s "
            "LEFT JOIN LATERAL (SELECT * FROM sensor_status x WHERE x.sensor_id = s.id "
            "                   ORDER BY received_at DESC LIMIT 1) st ON true "
            "LEFT JOIN LATERAL (SELECT * FROM sensor_config y WHERE y.sensor_id = s.id "
            "                   ORDER BY created_at DESC LIMIT 1) c ON true "
            "WHERE s.hive_id = $1 ORDER BY s.id", hive_id)
    out = []
    for r in rows:
        last = r["last_report_at"]
        counts = r["counts"]
        counts = orjson.loads(counts) if isinstance(counts, str | bytes) else (counts or {})
        out.append({
            "id": r["id"], "modem": r["modem"],
            "last_report_at": last.timestamp() if last else None,
            "silent": is_silent(r["report_interval_min"], r["created_at"].timestamp(),
                                last.timestamp() if last else None, now),
            "battery_mv": r["battery_mv"],
            "low_battery": r["battery_mv"] is not None and r["battery_mv"] < r["low_battery_mv"],
            "gprs_signal": r["gprs_signal"], "discarded_events": r["discarded_events"],
            "firmware_version": r["firmware_version"],
            "config": None if r["configuration_id"] is None else {
                "configuration_id": r["configuration_id"],
                "state": "applied" if r["applied_at"] is not None else "pending",
                "sent_at": r["sent_at"].timestamp() if r["sent_at"] else None},
            "alerts": list(r["alerts"]),
            "counts": {k: counts.get(k) for k in ("restarts", "wraps", "gaps", "lost_reports", "duplicates",
                                                   "late", "skewed", "reports")},
        })
    return out


async def new_config(pool: asyncpg.Pool, uid: str, sensor_id: str, body: Any) -> SensorConfig:
    """A configuration for one of the owner's sensors, stored as pending (the caller sends it)."""
    if not isinstance(body, dict):
        raise UserError(422, "a JSON object expected")
    fields = ("threshold_cm", "reporting_interval_min", "status_interval_min", "event_threshold")
    unknown = set(body) - set(fields)
    if unknown:
        raise UserError(422, f"unknown field(s): {', '.join(sorted(unknown))}")
    async with pool.acquire() as conn, conn.transaction():
        hive_id = await conn.fetchval("SELECT hive_id FROM sensor WHERE id = $1", sensor_id)
        if hive_id is None:
            raise UserError(404, f"no sensor {sensor_id!r} of yours")
        await _owned(conn, uid, hive_id)
        next_id = await conn.fetchval("SELECT coalesce(max(configuration_id), 0) + 1 FROM sensor_config "
                                      "WHERE sensor_id = $1", sensor_id)
        try:
            values: dict[str, Any] = {f: body.get(f) for f in fields}
            config = SensorConfig(**values, configuration_id=int(next_id))
        except (TypeError, ValueError) as exc:
            raise UserError(422, str(exc)) from None
        await conn.execute(
            "INSERT INTO sensor_config (sensor_id, configuration_id, threshold_cm, reporting_interval_min, "
            "status_interval_min, event_threshold) VALUES ($1, $2, $3, $4, $5, $6)",
            sensor_id, config.configuration_id, config.threshold_cm, config.reporting_interval_min,
            config.status_interval_min, config.event_threshold)
        await conn.execute("UPDATE sensor SET report_interval_min = $2 WHERE id = $1", sensor_id,
                           config.reporting_interval_min)
    return config


async def config_sent(pool: asyncpg.Pool, sensor_id: str, configuration_id: int) -> None:
    await pool.execute("UPDATE sensor_config SET sent_at = $3 WHERE sensor_id = $1 AND configuration_id = $2",
                       sensor_id, configuration_id, datetime.now(UTC))


MAX_ANALYTICS_DAYS = 92


async def analytics(pool: asyncpg.Pool, uid: str, hive_id: str, days: int, today: date | None = None
                    ) -> dict[str, Any]:
    """The hive's analytics of the `days` business days up to `today` (default: the latest
    computed) and the forecast of the day after."""
    if not 1 <= days <= MAX_ANALYTICS_DAYS:
        raise UserError(422, f"days: 1 to {MAX_ANALYTICS_DAYS}")
    async with pool.acquire() as conn:
        await _owned(conn, uid, hive_id)
        live = await _today(conn, hive_id, time.time())
        last = today or await conn.fetchval("SELECT max(day) FROM venue_day WHERE hive_id = $1", hive_id)
        if last is None:
            return {"hive_id": hive_id, "today": live, "days": [], "hourly": {}, "profile": None,
                    "forecast": []}
        first = last - timedelta(days=days - 1)
        day_rows = await conn.fetch(
            "SELECT day, reports, entries, exits, residual, correction, factor, complete FROM venue_day "
            "WHERE hive_id = $1 AND day BETWEEN $2 AND $3 ORDER BY day", hive_id, first, last)
        hour_rows = await conn.fetch(
            "SELECT day, hour, entries, exits, mean_occupancy, peak_occupancy, phones_mean, phones_peak "
            "FROM venue_hourly WHERE hive_id = $1 AND day BETWEEN $2 AND $3 ORDER BY day, hour",
            hive_id, first, last)
        profile_rows = await conn.fetch(
            "SELECT weekday, hour, occupancy, phones, samples, as_of FROM venue_profile WHERE hive_id = $1 "
            "ORDER BY weekday, hour", hive_id)
        forecast_rows = await conn.fetch(
            "SELECT day, hour, occupancy, phones, seasonal, trend, basis, samples FROM venue_forecast "
            "WHERE hive_id = $1 AND day BETWEEN $2 AND $3 ORDER BY day, hour", hive_id, first,
            last + timedelta(days=1))
    hourly: dict[str, list[dict[str, Any]]] = defaultdict(list)
    actual: dict[tuple[date, int], float] = {}
    for r in hour_rows:
        actual[r["day"], r["hour"]] = r["mean_occupancy"]
        hourly[r["day"].isoformat()].append({
            "hour": r["hour"], "entries": r["entries"], "exits": r["exits"],
            "mean_occupancy": r["mean_occupancy"], "peak_occupancy": r["peak_occupancy"],
            "phones_mean": r["phones_mean"], "phones_peak": r["phones_peak"]})
    profile = None
    if profile_rows:
        grid: list[list[float | None]] = [[None] * 24 for _ in range(7)]
        phones: list[list[float | None]] = [[None] * 24 for _ in range(7)]
        samples = [0] * 7
        for r in profile_rows:
            grid[r["weekday"] - 1][r["hour"]] = r["occupancy"]
            phones[r["weekday"] - 1][r["hour"]] = r["phones"]
            samples[r["weekday"] - 1] = r["samples"]
        profile = {"as_of": max(r["as_of"] for r in profile_rows).isoformat(), "weekdays": grid,
                   "phones": phones, "samples": samples}
    return {
        "hive_id": hive_id,
        "today": live,
        "days": [{"day": r["day"].isoformat(), "reports": r["reports"], "entries": r["entries"],
                  "exits": r["exits"], "residual": r["residual"], "correction": r["correction"],
                  "factor": r["factor"], "complete": r["complete"]} for r in day_rows],
        "hourly": dict(hourly),
        "profile": profile,
        "forecast": [{"day": r["day"].isoformat(), "hour": r["hour"], "occupancy": r["occupancy"],
                      "phones": r["phones"], "seasonal": r["seasonal"], "trend": r["trend"],
                      "basis": r["basis"], "samples": r["samples"],
                      "actual": actual.get((r["day"], r["hour"]))} for r in forecast_rows],
    }


async def _today(conn: asyncpg.Connection, hive_id: str, now: float) -> dict[str, Any]:
    """The current business day so far, by local hour (raw: corrected once it has ended)."""
    h = await conn.fetchrow("SELECT tz, reset_hour FROM hive WHERE id = $1", hive_id)
    day = business_day(now, h["tz"], h["reset_hour"])
    start, end = day_bounds(day, h["tz"], h["reset_hour"])
    rows = await conn.fetch(counts_sql("public", "h.id = $3"), datetime.fromtimestamp(start, UTC),
                            datetime.fromtimestamp(end, UTC), hive_id)
    a = np.array([(r[1], r[2], r[3]) for r in rows], dtype=np.float64).reshape(-1, 3)
    curve = analyse_day(HiveInput(hive_id, h["tz"], h["reset_hour"], False, a[:, 0], a[:, 1].astype(np.int64),
                                  a[:, 2].astype(np.int64)), day, now)
    if curve is None:
        return {"day": day.isoformat(), "hours": []}
    edges, labels = slots(day, h["tz"], h["reset_hour"])
    order = list(dict.fromkeys(labels.tolist()))  # local hours in the day's order (from the reset)
    begun = {lab for lab, e in zip(labels.tolist(), edges[:-1].tolist(), strict=True) if e <= now}
    return {"day": day.isoformat(), "hours": [
        {"hour": hour, "entries": int(curve.hourly_entries[hour]), "exits": int(curve.hourly_exits[hour]),
         "mean_occupancy": float(curve.mean[hour]), "peak_occupancy": float(curve.peak[hour])}
        for hour in order if hour in begun]}
