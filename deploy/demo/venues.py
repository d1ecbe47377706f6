"""The demo's venues: restaurants, bars, cafés and shops among the demo's points of interest
become hives (their 150 m fence, the venue app tenant's, is the hive's fence, so the app
users' phones passing by are the app's figure), each with a simulated door sensor
(deploy/demo/sensors.py: legacy and v2 firmware, a lost report now and then) publishing its
frames over MQTT in real time during the run; and a demo user who asked to be told when each
gets busy. At the end: each hive's counts as the platform has them against the simulator's
truth, the app's figure beside them, and the notifications the notifier logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import asyncpg

from deploy.demo.sensors import Faults, Sent, SimSensor, simulate
from exchanges.tenancy import name_of

HIVE_TYPES = {"amenity=restaurant": "restaurant", "amenity=fast_food": "restaurant",
              "amenity=bar": "bar", "amenity=pub": "bar", "amenity=cafe": "cafe",
              "shop=supermarket": "supermarket"}
DEMO_USER = "demo-user"
BUSY = 5  # the demo user's threshold (people)
ARRIVALS_PER_MINUTE = 12.0


@dataclass
class Venue:
    hive_id: str
    name: str
    fence_id: str
    sensor_id: str
    frames: list[Sent] = field(default_factory=list)
    truth: tuple[int, int] = (0, 0)


@dataclass
class DemoVenues:
    venues: list[Venue]
    start: float
    pending: list[tuple[float, str, str, bytes]] = field(default_factory=list)  # due, sensor, topic, frame

    def due(self, now: float) -> list[tuple[str, str, bytes]]:
        """The frames whose time came (in order), taken off the list."""
        n = 0
        while n < len(self.pending) and self.pending[n][0] <= now:
            n += 1
        out = [(s, tp, f) for _, s, tp, f in self.pending[:n]]
        del self.pending[:n]
        return out


def hive_type(kind: str) -> str | None:
    if kind in HIVE_TYPES:
        return HIVE_TYPES[kind]
    return "shop" if kind.startswith("shop=") else None


async def prepare(pg: asyncpg.Connection, pois: list[tuple[str, str, float, float, str]], owner: str,
                  run: str, start: float, duration: float) -> DemoVenues:
    """Hives for the venue POIs among the demo's fences ((qualified fence_id, name, lon, lat, kind)), a
    sensor each for this run (the earlier runs' sensors go, with their reports), the demo
    user's notifications, and the frames each sensor will send over the run."""
    venues: list[Venue] = []
    await pg.execute("INSERT INTO owner_account (uid, name) VALUES ($1, 'the demo') ON CONFLICT DO NOTHING",
                     owner)
    for k, (fence_id, name, lon, lat, kind) in enumerate(pois):
        htype = hive_type(kind)
        if htype is None:
            continue
        hive_id = "demo-" + name_of(fence_id).removeprefix("poi-")
        await pg.execute(
            "INSERT INTO hive (id, owner_uid, name, type, lon, lat, tz, capacity, fence_id) "
            "VALUES ($1, $2, $3, $4, $5, $6, 'Europe/Vaduz', 40, $7) ON CONFLICT (id) DO UPDATE SET "
            "name = EXCLUDED.name, type = EXCLUDED.type, fence_id = EXCLUDED.fence_id",
            hive_id, owner, name, htype, lon, lat, fence_id)
        old = [r["id"] for r in await pg.fetch("SELECT id FROM sensor WHERE hive_id = $1", hive_id)]
        for table in ("sensor_report", "sensor_event", "sensor_status", "sensor_config"):
            await pg.execute(f"DELETE FROM {table} WHERE sensor_id = ANY($1::text[])", old)
        await pg.execute("DELETE FROM sensor WHERE id = ANY($1::text[])", old)
        sensor_id = f"d{run}-{k}"
        version = 1 + k % 2
        await pg.execute("INSERT INTO sensor (id, hive_id, report_interval_min) VALUES ($1, $2, 1)",
                         sensor_id, hive_id)
        await pg.execute("INSERT INTO user_notification_def (uid, hive_id, threshold, direction) "
                         "VALUES ($1, $2, $3, 'above') ON CONFLICT DO NOTHING", DEMO_USER, hive_id, BUSY)
        sim = SimSensor(sensor_id, "steady", version=version, tz="Europe/Vaduz",
                        scale=ARRIVALS_PER_MINUTE * 60.0, stay_s=(15.0, 90.0), faults=Faults(loss=0.05))
        sent, truth = simulate(sim, start, duration / 3600.0, seed=k)
        venues.append(Venue(hive_id, name, fence_id, sensor_id, sent, (truth.entries, truth.exits)))
    await pg.execute("INSERT INTO device_token (token, uid, platform) VALUES ('demo-token', $1, 'demo') "
                     "ON CONFLICT (token) DO UPDATE SET uid = EXCLUDED.uid", DEMO_USER)
    pending = sorted((s.received_at, v.sensor_id, s.topic, s.frame) for v in venues for s in v.frames)
    return DemoVenues(venues, start, pending)


async def report(pg: asyncpg.Connection, demo: DemoVenues) -> tuple[list[str], bool, int]:
    """(table lines, every hive's counts equal to the simulator's truth, notifications sent)."""
    lines = [f"{'hive':<40}{'in':>5}{'out':>5}{'today':>7}{'truth':>10}{'phones':>8}"]
    exact = True
    for v in demo.venues:
        got = await pg.fetchrow("SELECT coalesce(sum(entries), 0) AS e, coalesce(sum(exits), 0) AS x "
                                "FROM sensor_report WHERE sensor_id = $1", v.sensor_id)
        st = await pg.fetchrow("SELECT occupancy, app_occupancy FROM hive_status WHERE hive_id = $1",
                               v.hive_id)
        same = (int(got["e"]), int(got["x"])) == v.truth
        exact &= same
        now = st["occupancy"] if st else 0
        phones = st["app_occupancy"] if st and st["app_occupancy"] is not None else 0
        lines.append(f"{v.name[:39]:<40}{got['e']:>5}{got['x']:>5}{now:>7}"
                     f"{f'{v.truth[0]}/{v.truth[1]}':>10}{'' if same else ' !':>2}{phones:>8}")
        if not same:  # what the counting made of each report, to tell why (the next run deletes them)
            rows = await pg.fetch("SELECT device_at, received_at, counter, total_in, total_out, entries, "
                                  "exits, rule, gap, lost_reports, unknowable, skewed FROM sensor_report "
                                  "WHERE sensor_id = $1 ORDER BY received_at", v.sensor_id)
            lines += [f"    ! {r['received_at']:%H:%M:%S.%f} device {r['device_at']:%H:%M:%S} "
                      f"#{r['counter']} totals {r['total_in']}/{r['total_out']} "
                      f"-> +{r['entries']}/+{r['exits']} {r['rule']}"
                      f"{' gap ' + str(r['gap']) if r['gap'] else ''}"
                      f"{' lost ' + str(r['lost_reports']) if r['lost_reports'] else ''}"
                      f"{' unknowable' if r['unknowable'] else ''}{' skewed' if r['skewed'] else ''}"
                      for r in rows]
            planned, distinct = sorted(x.received_at for x in v.frames), len({x.frame for x in v.frames})
            lines.append(f"    ! {len(planned)} frames planned ({distinct} distinct), "
                         f"the first due at {planned[0]:.3f}" if planned else "    ! no frame planned")
    sent = int(await pg.fetchval("SELECT count(*) FROM notification_log WHERE uid = $1 "
                                 "AND sent_at >= to_timestamp($2)", DEMO_USER, demo.start))
    return lines, exact, sent


async def stored(pg: asyncpg.Connection, demo: DemoVenues) -> int:
    ids = [v.sensor_id for v in demo.venues]
    return int(await pg.fetchval("SELECT count(*) FROM sensor_report WHERE sensor_id = ANY($1::text[])", ids))


def distinct_frames(demo: DemoVenues) -> int:
    return sum(len({s.frame for s in v.frames}) for v in demo.venues)

